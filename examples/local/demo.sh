#!/usr/bin/env bash
# make demo: prepare the Shakespeare corpus (cached after the first run), train a small GPT on
# this machine's CPU showing the loss fall, then sample a few lines from the trained model.
# CONFIG picks another model (examples/local/moe-tiny.yaml: a mixture of experts;
# examples/local/gemma2-tiny.yaml: Gemma 2's layer with its windows and caps).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
CONFIG=${CONFIG:-examples/local/demo.yaml}
RUN_DIR=${RUN_DIR:-runs/demo}
# Each demo starts afresh, so it deletes RUN_DIR: only a folder a demo made (its mark inside),
# runs/demo, or an empty one. RUN_DIR=. or a real run's folder is refused, not deleted.
if [ -e "$RUN_DIR" ] && [ "$RUN_DIR" != runs/demo ] && [ ! -e "$RUN_DIR/.megatron-demo" ] &&
    [ -n "$(ls -A "$RUN_DIR" 2>/dev/null || echo file)" ]; then
  echo "demo.sh: error: RUN_DIR=$RUN_DIR exists and was not made by the demo, which deletes" \
       "its folder to start afresh; pass a new folder (RUN_DIR=runs/NAME)" >&2
  exit 2
fi
eval "$($PY tools/prepare_demo_data.py --shell)"
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
touch "$RUN_DIR/.megatron-demo"
echo "== training (metrics: $RUN_DIR/metrics.jsonl, TensorBoard: $RUN_DIR/tensorboard)"
$PY -m megatron.cli.train --config "$CONFIG" \
  --set data.tokenizer_model="$TOKENIZER_MODEL" --set "data.paths=[$DATA_PREFIX]" \
  --set run.dir="$RUN_DIR" "$@" 2>&1 | grep -E "step [0-9]+ |validation|done:|error" || true
test -f "$RUN_DIR/checkpoints/latest" || { echo "demo: training did not finish" >&2; exit 1; }
echo "== samples from the trained model"
$PY -m megatron.cli.generate --run-dir "$RUN_DIR" --prompt "ROMEO:" --tokens 60 --samples 2 --seed 1

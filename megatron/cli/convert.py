"""megatron-convert: turn a run's sharded checkpoint (any layout) into one unsharded file or a
Hugging Face model folder, and a Hugging Face folder into a file to start training from.
(A run needs no conversion to continue in another layout: checkpoint.load reads any layout.)"""
from __future__ import annotations

import argparse
import sys

from megatron.cli.common import entry_point, setup_logging

EPILOG = """examples:
  # merge the latest checkpoint of any TP x PP layout into one file (TP=1, PP=1 names)
  megatron-convert to-single --run-dir runs/tiny --output tiny.pt
  # a given tag, dropping the vocabulary padding rows
  megatron-convert to-single --run-dir runs/tiny --tag step_0000020 --output tiny.pt --trim-vocab
  # a Hugging Face model folder (GPT-2, Llama, Qwen2/3, Qwen3-MoE, Mixtral, Gemma 3), e.g. lm-eval
  megatron-convert to-hf --run-dir runs/demo --output-dir hf/demo --dtype bf16
  # the other way: a Hugging Face folder of those as a single file to train from
  megatron-convert from-hf --hf-dir ~/models/llama --output llama.pt   # prints its model: section
  megatron-train --config my.yaml --set checkpoint.init_from=llama.pt

to-single writes torch.save({format, config, state_dict, vocab_size, padded_vocab_size, source}):
state_dict uses GPTModel's parameter names at TP=1; embedding rows from vocab_size on are padding
(kept as trained unless --trim-vocab, so the model reproduces the run's loss). Load it with
megatron.checkpoint.convert.load_single and build_single_model, or start a run of any layout from
it with `megatron-train ... --set checkpoint.init_from=tiny.pt`.
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="megatron-convert", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    single = sub.add_parser("to-single", help="merge all shards into one unsharded file",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    single.add_argument("--output", required=True, help="the .pt file to write")
    single.add_argument("--trim-vocab", action="store_true",
                        help="drop the padding rows of the embedding (and untied head)")
    hf = sub.add_parser("to-hf", help="write a Hugging Face model folder (GPT-2, Llama, "
                        "Qwen2, Qwen3, Qwen3-MoE, Mixtral or Gemma 3)",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    hf.add_argument("--output-dir", required=True, help="folder for config.json, "
                    "model.safetensors and the tokenizer files (new or empty)")
    hf.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="dtype of the written weights (default fp32)")
    hf.add_argument("--trim-vocab", action="store_true",
                    help="drop the padding rows of the embedding (and untied head)")
    imp = sub.add_parser("from-hf", help="a Hugging Face GPT-2/Llama/Mistral/Qwen2/Qwen3/"
                         "Qwen3-MoE/Mixtral/Gemma 3 folder as a single file "
                         "(for checkpoint.init_from)", epilog=EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    imp.add_argument("--hf-dir", required=True, help="folder with config.json and "
                     "model.safetensors (or a sharded model.safetensors.index.json)")
    imp.add_argument("--output", required=True, help="the .pt file to write")
    for s in (single, hf):
        s.add_argument("--run-dir", required=True, help="run directory (config.yaml, "
                       "checkpoints/)")
        s.add_argument("--tag", help="checkpoint tag such as step_0000020 (default: the newest complete one)")
    return p.parse_args(argv)


@entry_point("megatron-convert")
def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging()
    from megatron.checkpoint import convert
    if args.command == "to-single":
        merged = convert.convert_to_single(args.run_dir, args.output, args.tag, args.trim_vocab)
        sys.stdout.write(f"wrote {args.output} ({len(merged.state_dict)} tensors, vocabulary "
                         f"{merged.vocab_size} in {merged.padded_vocab_size} rows)\n")
        return 0
    if args.command == "from-hf":
        import yaml
        from megatron.checkpoint.hf_import import import_hf
        convert.check_output_file(args.output)
        merged = import_hf(args.hf_dir)
        convert.save_single(merged, args.output)
        section = {"model": {k: v for k, v in merged.config.to_dict()["model"].items()
                             if k not in ("hidden_dropout", "attention_dropout",
                                          "attention_backend", "init_method_std")}}
        sys.stdout.write(f"wrote {args.output} ({len(merged.state_dict)} tensors). Train from it "
                         f"with --set checkpoint.init_from={args.output} and this model section "
                         f"in your config:\n{yaml.safe_dump(section, sort_keys=False)}")
        return 0
    if args.command == "to-hf":
        from megatron.checkpoint.hf_export import check_exportable, check_output_dir, export_hf
        check_output_dir(args.output_dir)
        check_exportable(convert.read_run_config(args.run_dir))  # before minutes of merging
        merged = convert.merge_run(args.run_dir, args.tag, trim_vocab=args.trim_vocab)
        written = export_hf(merged, args.output_dir, args.dtype)
        sys.stdout.write(f"wrote {args.output_dir}: {', '.join(written)} "
                         f"({merged.padded_vocab_size} vocabulary rows, {args.dtype})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

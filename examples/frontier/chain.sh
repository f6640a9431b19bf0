# shellcheck shell=bash
# Chained jobs for a Slurm batch script (train.sbatch sources it): a training longer than one
# job's time limit continues in the next job, which each job submits, behind itself, with the
# same script and arguments, until training.train_iters is reached. Each job continues from the
# newest complete checkpoint on the node count it was given. The chain stops when the run is
# finished, when a job made no progress (the newest complete checkpoint is where the job found
# it), or after MEGATRON_CHAIN_MAX_ATTEMPTS jobs. The rules: megatron/training/chain.py.
#
#   source chain.sh
#   megatron_chain_init "$@"        # first, before env.sh: the batch script's own arguments and
#                                   # the environment the job was submitted with
#   source env.sh; RUN_DIR=...
#   megatron_chain_begin --config C --set run.dir="$RUN_DIR" [--set k=v ...]
#                                   # the trainer's config arguments; ends the job (exit 0) when
#                                   # the run is already finished
#   rc=0; megatron_chain_srun srun ... python -m megatron.cli.train ... \
#       "${MEGATRON_CHAIN_CONTINUE[@]}" || rc=$?
#                                   # last on the line: a later job continues the run
#                                   # (checkpoint.load=auto) whatever the first started from
#                                   # srun's stderr also kept in a file, for megatron_chain_end:
#                                   # the node of a task that died first goes into bad_nodes
#   megatron_chain_end "$rc"        # submits the next job if this one made progress
#   exit "$rc"
#
# Set at submission (they travel with the chain):
#   MEGATRON_CHAIN               [1] 0: this job only, no resubmission
#   MEGATRON_CHAIN_MAX_ATTEMPTS  [20] jobs in one chain, counting the first
#   MEGATRON_CHAIN_SCRIPT        [the job's script, from squeue] the script to submit again
# MEGATRON_CHAIN_ATTEMPT (1 for the job you submit) is set by the chain for the jobs it submits.

megatron_chain_init() {
  _MEGATRON_CHAIN_SCRIPT_ARGS=("$@")
  # What the first job was told to start from (--set checkpoint.load=<a checkpoint>: another
  # run's, or this run's newest when moving it) is a start, not a way to continue: the next jobs
  # get the same arguments, and would start there again (refused below their own run's newer
  # checkpoints). Put MEGATRON_CHAIN_CONTINUE after them on the training command line: in a
  # later job of the chain it is --set checkpoint.load=auto (the run's newest checkpoint).
  MEGATRON_CHAIN_CONTINUE=()
  if [ "${MEGATRON_CHAIN_ATTEMPT:-1}" != 1 ]; then
    MEGATRON_CHAIN_CONTINUE=(--set checkpoint.load=auto)
  fi
  # The next job starts from this environment, not from what env.sh made of it: NCCL_NET
  # depends on the node count, MEGATRON_JOB_END_TIME (megatron_job_deadline) on the job.
  _MEGATRON_CHAIN_ENV=$(mktemp "${TMPDIR:-/tmp}/megatron-chain-env.XXXXXX")
  env -0 > "$_MEGATRON_CHAIN_ENV"
}

megatron_chain_begin() {
  # the training command line's config arguments, as it will end (MEGATRON_CHAIN_CONTINUE)
  _MEGATRON_CHAIN_TRAIN_ARGS=("$@" "${MEGATRON_CHAIN_CONTINUE[@]}")
  local out action
  out=$(python -m megatron.cli.chain begin "${_MEGATRON_CHAIN_TRAIN_ARGS[@]}")
  read -r action _MEGATRON_CHAIN_START <<< "$out"
  if [ "$action" = stop ]; then
    rm -f "$_MEGATRON_CHAIN_ENV"
    exit 0
  fi
}

# Runs its arguments (the training srun) with their stderr copied to a file as well as to the
# job's output. With --kill-on-bad-exit=1 srun names there the task that ended first and how
# ("srun: error: n2: task 1: Killed"); megatron_chain_end reads it. The status is srun's.
megatron_chain_srun() {
  _MEGATRON_CHAIN_SRUN_LOG=$(mktemp "${TMPDIR:-/tmp}/megatron-srun-stderr.XXXXXX")
  local status
  { "$@" 2>&1 >&3 3>&- | tee "$_MEGATRON_CHAIN_SRUN_LOG" >&2 3>&-; status=("${PIPESTATUS[@]}")
  } 3>&1
  return "${status[0]}"
}

megatron_chain_end() {
  local rc=0
  MEGATRON_CHAIN_SRUN_LOG="${_MEGATRON_CHAIN_SRUN_LOG:-}" \
  python -m megatron.cli.chain end --start-step "$_MEGATRON_CHAIN_START" \
    --exit-status "$1" --submit-env "$_MEGATRON_CHAIN_ENV" "${_MEGATRON_CHAIN_TRAIN_ARGS[@]}" \
    -- "${_MEGATRON_CHAIN_SCRIPT_ARGS[@]}" || rc=$?
  rm -f "$_MEGATRON_CHAIN_ENV" "${_MEGATRON_CHAIN_SRUN_LOG:-}"
  return $rc
}

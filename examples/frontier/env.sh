# shellcheck shell=bash
# Environment of a megatron-frontier job on OLCF Frontier (MI250X, Slingshot 11).
# GENERATED from megatron/launch/frontier_env.py, which the planner's Frontier sbatch also
# embeds: edit there, then regenerate this file (see that module's docstring).
# train.sbatch sources it; source it yourself in an salloc. Safe under `set -euo pipefail`.
#
# Set before sourcing to override (defaults in brackets):
#   MEGATRON_ROCM_VERSION  [7.1.1] the rocm module; must match your torch wheel's ROCm
#   MEGATRON_MODULES       modules to load; "" loads none (your own environment); default:
#                          [PrgEnv-gnu/8.7.0 cpe/26.03 rocm/${MEGATRON_ROCM_VERSION} craype-accel-amd-gfx90a]
#   AWS_OFI_RCCL_DIR       [unset] prefix of your own aws-ofi-rccl build (lib/librccl-net.so);
#                          unset: the site module rccl-net-plugin is loaded instead
#   NCCL_NET               [OFI on multi-node jobs, Socket on one node] "AWS Libfabric" for old
#                          plugin builds
#   RUN_ROOT               [$MEMBERWORK/<project>/megatron-runs] where run directories go
#   MEGATRON_PROJECT       [the job's account, lower case] the <project> above
#   MEGATRON_CKPT_STRIPE   [unset] `lfs setstripe` options for checkpoints/ (see below)
#   MEGATRON_ENV_TARBALL   [unset] a `conda pack` archive of your Python environment, copied to
#                          every node's NVMe with sbcast before the ranks start (needs -C nvme)
#   MEGATRON_NVME_DIR      [/mnt/bb/$USER] where the NVMe is mounted
# Fixed settings below can be changed by exporting them again after sourcing this file.
#
# Sources cited as [...]: OLCF-PT = OLCF user docs software/analytics/pytorch_frontier.rst;
# OLCF-FUG = systems/frontier_user_guide.rst; OLCF-SB = software/python/sbcast_conda.rst;
# HPE = HPE shs-ccl-docs rccl/rccl_tuning_guide.md; OFI = aws-ofi-rccl README.

# --- Software stack [OLCF-PT "Installing PyTorch", "Batch script"] ------------------------------
_megatron_say() { echo "env.sh: $*" >&2; }
# One task on each node of the job. A bare `srun --ntasks-per-node=1` inside a batch script
# inherits the job's SLURM_NTASKS and starts that many tasks (8 a node here), which would unpack
# the same archive 8 times over itself.
_megatron_each_node() {
  local n=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  srun --nodes="$n" --ntasks="$n" --ntasks-per-node=1 "$@"
}
# Lmod and activate scripts are not written for `set -eu`: run them with both relaxed.
_megatron_relaxed() {
  local saved=$- rc=0
  set +eu
  "$@" || rc=$?
  [[ $saved == *e* ]] && set -e
  [[ $saved == *u* ]] && set -u
  return $rc
}
MEGATRON_ROCM_VERSION=${MEGATRON_ROCM_VERSION:-7.1.1}
MEGATRON_MODULES=${MEGATRON_MODULES-PrgEnv-gnu/8.7.0 cpe/26.03 rocm/${MEGATRON_ROCM_VERSION} craype-accel-amd-gfx90a}
_megatron_modules=0
if [ -n "${MEGATRON_MODULES}" ]; then
  if command -v module >/dev/null 2>&1; then
    _megatron_modules=1
    for _m in ${MEGATRON_MODULES}; do
      _megatron_relaxed module load "$_m" || { _megatron_say "module load $_m failed"; return 1; }
    done
    unset _m
    # A non-default cpe/ module: its libraries must come first [OLCF-PT "Installing PyTorch"].
    LD_LIBRARY_PATH=${CRAY_LD_LIBRARY_PATH:+${CRAY_LD_LIBRARY_PATH}:}${LD_LIBRARY_PATH:-}
    export LD_LIBRARY_PATH
  else
    _megatron_say "no 'module' command here; none loaded (MEGATRON_MODULES=\"\" silences this)"
  fi
fi

# --- RCCL over Slingshot ----------------------------------------------------------------------
# RCCL reaches Slingshot only through the aws-ofi-rccl network plugin; without it RCCL uses TCP
# sockets between nodes and says nothing [OLCF-PT "RCCL Network Plugin"; OFI]. Your own build:
# NCCL_NET_PLUGIN names the library (preferred), and its directory goes on LD_LIBRARY_PATH for
# RCCL versions that only search by name [OLCF-PT "Manual RCCL Network Plugin Configuration"].
if [ -n "${AWS_OFI_RCCL_DIR:-}" ]; then
  [ -e "${AWS_OFI_RCCL_DIR}/lib/librccl-net.so" ] || \
    _megatron_say "AWS_OFI_RCCL_DIR=${AWS_OFI_RCCL_DIR} has no lib/librccl-net.so;" \
      "the run's preflight will stop"
  export NCCL_NET_PLUGIN=${AWS_OFI_RCCL_DIR}/lib/librccl-net.so
  export LD_LIBRARY_PATH=${AWS_OFI_RCCL_DIR}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
elif [ "$_megatron_modules" = 1 ]; then
  _megatron_relaxed module load rccl-net-plugin || {
    _megatron_say "module load rccl-net-plugin failed; set AWS_OFI_RCCL_DIR to your own build"
    return 1
  }
fi
unset _megatron_modules
# Multi-node jobs: NCCL_NET=OFI turns a plugin that fails to load into an error instead of a
# silent fall-back to sockets (and the trainer's preflight reports it within seconds of start).
# One-node jobs: Frontier's network is not set up for them and the plugin does not initialise,
# so Socket [OLCF-PT "Manual RCCL Network Plugin Configuration"]. Plugin builds older than the
# name "OFI" answer to NCCL_NET="AWS Libfabric" [HPE "Environment Settings for RCCL"]: export it
# before sourcing. Outside a job NCCL_NET is left as it is.
_megatron_nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}
if [ -n "$_megatron_nodes" ]; then
  if [ "$_megatron_nodes" -gt 1 ]; then
    export NCCL_NET=${NCCL_NET:-OFI}
  else
    export NCCL_NET=${NCCL_NET:-Socket}
  fi
fi
unset _megatron_nodes

# --- Fixed settings ----------------------------------------------------------------------------
# The network ones are the list OLCF-PT "Manual RCCL Network Plugin Configuration" gives as
# strongly recommended by HPE and AMD on Frontier for correctness and performance at scale (the
# rccl-net-plugin module sets them too), checked against HPE's guide where it has them.
# MI250X (one GCD = one device): the architecture setup.py compiles kernels for. [OLCF-FUG
# "GPUs" (MI250X); craype-accel-amd-gfx90a above]
export PYTORCH_ROCM_ARCH="gfx90a"
# Eight ranks share a node's 56 usable cores, 7 each (-c 7): no intra-op thread pools
# oversubscribing them. [OLCF-PT "Batch script" (srun -c7, one rank per GCD)]
export OMP_NUM_THREADS="1"
# RCCL's bootstrap and socket traffic on the four Slingshot NICs, not the management network. If
# jobs hang, OLCF suggests trying hsn0 alone. [OLCF-PT "Master Address and Sockets"; HPE
# "Environment Settings for RCCL"]
export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"
# GPU-direct RDMA between the NICs and GCD memory (PHB is the level the numeric 3 meant).
# [OLCF-PT "Manual RCCL Network Plugin Configuration"; HPE "Environment Settings for RCCL"
# ("required to enable RDMA between GPUs")]
export NCCL_NET_GDR_LEVEL="PHB"
# Rings and trees may use different NICs on different nodes; found to improve performance on
# large systems. [OLCF-PT "Manual RCCL Network Plugin Configuration"; HPE "Environment Settings
# for RCCL"]
export NCCL_CROSS_NIC="1"
# Peer-to-peer access with large BAR addressing, which the NICs' RDMA into GCD memory uses.
# [OLCF-PT "Manual RCCL Network Plugin Configuration"; HPE "Essential Libfabric Environment
# Settings"]
export HSA_FORCE_FINE_GRAIN_PCIE="1"
# Memory-registration cache monitor: kdreg2 is Frontier's default and safe with the plugin
# (userfaultfd is too); never memhooks, which can deadlock it. [OLCF-PT "Manual RCCL Network
# Plugin Configuration"; HPE "Essential Libfabric Environment Settings" (userfaultfd, kdreg2
# also valid)]
export FI_MR_CACHE_MONITOR="kdreg2"
# Keeps the CXI provider from ROCm allocation calls that can deadlock RCCL. [OLCF-PT "Manual
# RCCL Network Plugin Configuration"; HPE "Essential Libfabric Environment Settings"]
export FI_CXI_DISABLE_HOST_REGISTER="1"
# A larger completion queue, needed especially for large jobs. [OLCF-PT "Manual RCCL Network
# Plugin Configuration"; HPE "Essential Libfabric Environment Settings"]
export FI_CXI_DEFAULT_CQ_SIZE="131072"
# The alternative rendezvous protocol, faster for RCCL at scale (it may slow MPI, which training
# does not use). Needs the allocation flag --network=disable_rdzv_get: train.sbatch has it; add
# it to salloc yourself. [OLCF-PT "Alternative Rendezvous Protocol"; HPE "Essential Libfabric
# Environment Settings"]
export FI_CXI_RDZV_PROTO="alt_read"
# No eager data before the receiver is ready. [OLCF-PT "Manual RCCL Network Plugin
# Configuration"; HPE "Essential Libfabric Environment Settings"]
export FI_CXI_RDZV_EAGER_SIZE="0"
# Every message above 0 bytes takes the rendezvous path, as the two lines around it assume. In
# OLCF's list; HPE's table does not list it. [OLCF-PT "Manual RCCL Network Plugin
# Configuration"]
export FI_CXI_RDZV_THRESHOLD="0"
# Disables the rendezvous get optimisation; goes with alt_read. [OLCF-PT "Manual RCCL Network
# Plugin Configuration"; HPE "Essential Libfabric Environment Settings"]
export FI_CXI_RDZV_GET_MIN="0"
# A larger transmit queue for large jobs that depend on unexpected rendezvous messages. [OLCF-PT
# "Manual RCCL Network Plugin Configuration"; HPE "Essential Libfabric Environment Settings"]
export FI_CXI_DEFAULT_TX_SIZE="2048"
# Lets the provider move to software tag matching when hardware resources run out instead of
# failing. [OLCF-PT "Manual RCCL Network Plugin Configuration"; HPE "Essential Libfabric
# Environment Settings"]
export FI_CXI_RX_MATCH_MODE="hybrid"
# MIOpen's database on the shared file system is slow and fails with disk I/O errors under many
# ranks: keep it on node-local /tmp (megatron_prepare_nodes creates it on every node). [OLCF-PT
# "Batch script" ("Needed to bypass MIOpen, Disk I/O Errors")]
export MIOPEN_USER_DB_PATH="/tmp/${USER:-megatron}-miopen-${SLURM_JOB_ID:-local}"
# MIOpen's compiled-kernel cache beside it. [OLCF-PT "Batch script"]
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"

# --- Job helpers (train.sbatch and the planner's sbatch call them) -----------------------------
# Where run directories go: Orion scratch when OLCF's variables say where it is ($MEMBERWORK,
# then $PROJWORK, each followed by the project id), since NFS home and project areas have 50 GB
# quotas and OLCF recommends running jobs from Orion [OLCF-FUG "NFS Filesystem", "Lustre
# Filesystem"]; else runs/ in the repository. Orion purges files unused for 90 days.
megatron_run_root() {
  if [ -n "${RUN_ROOT:-}" ]; then
    _megatron_say "run directories under RUN_ROOT=${RUN_ROOT}"
    printf '%s\n' "${RUN_ROOT}"; return 0
  fi
  local project=${MEGATRON_PROJECT:-${SLURM_JOB_ACCOUNT:-}} area
  project=${project,,}
  for area in MEMBERWORK PROJWORK; do
    if [ -n "${!area:-}" ] && [ -n "$project" ]; then
      _megatron_say "run directories under \$${area}/${project}/megatron-runs" \
        "(Orion scratch; RUN_ROOT overrides)"
      printf '%s\n' "${!area}/${project}/megatron-runs"; return 0
    fi
  done
  local home=${MEGATRON_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  _megatron_say "no \$MEMBERWORK/\$PROJWORK and project id; run directories under" \
    "${home}/runs (on Frontier's NFS home that is a 50 GB quota: set RUN_ROOT)"
  printf '%s\n' "${home}/runs"
}

# The run directory of a config: RUN_DIR when set; the folder of a run's own config.yaml (one
# that holds checkpoints/: submitting it continues that run, not a new one named "config");
# else <run root>/<the config's name without .yaml>, one per recipe, so the next job finds it.
megatron_run_dir() {
  local config="$1" folder
  folder=$(dirname -- "$config")
  if [ -n "${RUN_DIR:-}" ]; then
    printf '%s
' "${RUN_DIR}"
  elif [ "$(basename -- "$config")" = config.yaml ] && [ -d "$folder/checkpoints" ]; then
    _megatron_say "$config is the config.yaml of the run in $folder: continuing that run"
    (cd -- "$folder" && pwd)
  else
    printf '%s
' "$(megatron_run_root)/$(basename -- "$config" .yaml)"
  fi
}

# Creates RUN_DIR/checkpoints. Orion gives new files a Progressive File Layout and OLCF asks
# users not to restripe [OLCF-FUG "Transition from Alpine to Orion"], so the layout is only
# recorded in the job log unless MEGATRON_CKPT_STRIPE holds `lfs setstripe` options (keep to
# the capacity pool and at most 450 OSTs there [OLCF-FUG "LFS setstripe wrapper"], e.g.
# "-c 8 -S 1M -p capacity"; on other Lustre systems e.g. "-c 8 -S 4M").
megatron_prepare_run_dir() {
  local ckpt="$1/checkpoints"
  mkdir -p "$ckpt"
  command -v lfs >/dev/null 2>&1 || return 0
  if [ -n "${MEGATRON_CKPT_STRIPE:-}" ]; then
    # shellcheck disable=SC2086  # the options are meant to split into words
    lfs setstripe ${MEGATRON_CKPT_STRIPE} "$ckpt" || {
      _megatron_say "lfs setstripe ${MEGATRON_CKPT_STRIPE} $ckpt failed"; return 1
    }
  fi
  _megatron_say "Lustre layout of new files in $ckpt:" \
    "$(lfs getstripe -d "$ckpt" 2>&1 | tr -s ' \n' ' ')"
}

# The job's end time for the trainer (Unix seconds in MEGATRON_JOB_END_TIME): it then commits a
# checkpoint and exits 0 while one more step and a save still fit, however long a step takes,
# instead of relying on --signal's fixed margin (megatron/training/clock.py). Slurm's own
# SLURM_JOB_END_TIME is used where it is set; else squeue gives the end of this job.
megatron_job_deadline() {
  if [ -n "${MEGATRON_JOB_END_TIME:-}" ] || [ -n "${SLURM_JOB_END_TIME:-}" ]; then return 0; fi
  [ -n "${SLURM_JOB_ID:-}" ] || return 0
  local end
  end=$(squeue -h -j "${SLURM_JOB_ID}" -o %e 2>/dev/null) || return 0
  case "$end" in ""|N/A|Unknown|NONE) return 0 ;; esac
  if MEGATRON_JOB_END_TIME=$(date -d "$end" +%s 2>/dev/null); then
    export MEGATRON_JOB_END_TIME
    _megatron_say "the job ends at $end: training stops with a checkpoint before then"
  fi
}

# On every node of the job: MIOpen's directory on /tmp, then, with MEGATRON_ENV_TARBALL set, the
# Python environment on node-local NVMe: at scale ranks start much faster from it than from
# Lustre, and far faster than from NFS [OLCF-PT "Environment Location"; OLCF-SB].
megatron_prepare_nodes() {
  _megatron_each_node mkdir -p "${MIOPEN_USER_DB_PATH}"
  if [ -n "${MEGATRON_ENV_TARBALL:-}" ]; then megatron_stage_env "${MEGATRON_ENV_TARBALL}"; fi
}

# Broadcast a `conda pack -p ENV` archive to /mnt/bb/$USER on every node (the job needs the NVMe:
# -C nvme [OLCF-FUG "NVMe Usage"]), unpack it there and activate it [OLCF-SB "Example Usage on
# Frontier"]. A package installed in editable mode still imports its code from the repository.
megatron_stage_env() {
  local tarball=$1 bb=${MEGATRON_NVME_DIR:-/mnt/bb/${USER:-}}
  local dest=$bb/megatron-env
  if [ ! -f "$tarball" ]; then
    _megatron_say "MEGATRON_ENV_TARBALL=$tarball is not a file; make one with: conda pack -p <env>"
    return 1
  fi
  if [ ! -d "$bb" ]; then
    _megatron_say "MEGATRON_ENV_TARBALL is set but $bb does not exist: submit with -C nvme"
    return 1
  fi
  # sbcast can leave partial files behind when it fails: stop rather than start on them [OLCF-SB].
  sbcast -pf "$tarball" "$bb/megatron-env.tar.gz" || { _megatron_say "sbcast failed"; return 1; }
  _megatron_each_node mkdir -p "$dest"
  _megatron_each_node tar -xzf "$bb/megatron-env.tar.gz" -C "$dest"
  if ! _megatron_relaxed source "$dest/bin/activate"; then
    _megatron_say "cannot activate $dest"; return 1
  fi
  if [ -x "$dest/bin/conda-unpack" ]; then _megatron_each_node "$dest/bin/conda-unpack"; fi
  _megatron_say "Python environment from $tarball on node-local NVMe: $dest"
}

# Environment for megatron-frontier on OLCF Frontier (MI250X, Slingshot). train.sbatch sources it;
# source it yourself in an interactive allocation. Safe under `set -euo pipefail`.

# --- Software: placeholders, adapt them to the modules and environment you built -------------
# The package must be installed with its kernels built ahead of time for gfx90a (setup.py reads
# PYTORCH_ROCM_ARCH below); nothing is compiled at run time.
# module reset
# module load PrgEnv-gnu
# module load rocm/6.2.4                 # the ROCm your torch wheel was built against
# module load craype-accel-amd-gfx90a
# module load cray-python
# source /lustre/orion/PROJECT/proj-shared/envs/megatron/bin/activate

# --- Build target --------------------------------------------------------------------------
export PYTORCH_ROCM_ARCH=gfx90a          # MI250X; one GCD = one device

# --- RCCL over Slingshot ---------------------------------------------------------------------
# The four Slingshot NICs of a node (25 GB/s each); without this RCCL may pick the management
# network for its bootstrap.
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
# Allow GPU-direct RDMA between the NICs and GCD memory.
export NCCL_NET_GDR_LEVEL=3
# libfabric CXI provider: a larger completion queue avoids "cxi_cq_eq overflow" at scale, and the
# userfaultfd memory-registration cache monitor avoids hangs/corruption seen with the default.
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_MR_CACHE_MONITOR=userfaultfd
# The aws-ofi-rccl plugin lets RCCL talk libfabric (CXI) instead of falling back to TCP sockets,
# which is several times slower between nodes. Point this at your build of the plugin.
export AWS_OFI_RCCL_DIR=${AWS_OFI_RCCL_DIR:-/lustre/orion/PROJECT/proj-shared/aws-ofi-rccl}
export LD_LIBRARY_PATH=${AWS_OFI_RCCL_DIR}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}

# --- Node-local caches -----------------------------------------------------------------------
# MIOpen's kernel database on the shared file system is slow and races between thousands of
# ranks: keep it on each node's /tmp (train.sbatch creates the directory on every node).
export MIOPEN_USER_DB_PATH=/tmp/${USER:-megatron}-miopen-${SLURM_JOB_ID:-local}
export MIOPEN_CUSTOM_CACHE_DIR=${MIOPEN_USER_DB_PATH}

# --- CPU threads -----------------------------------------------------------------------------
# Eight ranks share a node's 56 usable cores (7 each, -c 7); keep intra-op threads from
# oversubscribing them.
export OMP_NUM_THREADS=1

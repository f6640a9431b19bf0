"""megatron-frontier: 3D-parallel GPT training on DeepSpeed for ROCm and CUDA."""
__version__ = "0.1.0"

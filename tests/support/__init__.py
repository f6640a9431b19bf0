"""What the tests share and are not themselves tests: the repository's paths, process helpers,
data and kernel emulation helpers, the workers that torchrun launches by path, and the kernel
simulator's C sources (kernel_sim/)."""

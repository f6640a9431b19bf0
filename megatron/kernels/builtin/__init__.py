"""The built-in fused ops, one file per extension module (the unit that catalog.py lists, the
build compiles and the loader imports). The ops of one module share its binding file and
module handle, and sometimes an autograd Function (LayerNorm and RMSNorm are one kernel with a
flag), so each file holds its ops' references, Functions and accepted calls together and
registers one FusedOp per op. Importing this package registers them all."""
from megatron.kernels import registry
from megatron.kernels.builtin import activation, norm, rotary, softmax  # noqa: F401 (register)

registry.check_complete()

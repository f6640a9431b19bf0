"""Readers for the compiled kernel binaries, shared by the ahead-of-time compile test and the
CUDA wheel test: AMD code objects in a clang offload bundle, cubins in a CUDA fatbin, and the
kernels each defines. Pure byte parsing, no GPU and no vendor tools."""
from __future__ import annotations

import re
import struct
from pathlib import Path

from tests.support.paths import ROOT

# Kernel instantiations each unit must define, per target: the product of its template axes.
EXPECTED_KERNELS = {
    # {forward, backward} x {fp32, fp16, bf16} x {arbitrary, causal} x items {1, 4, 16, stream}
    "softmax": 2 * 3 * 2 * 4,
    # {forward, backward-input} x 5 (input, weight) pairs x {LN, RMS} x {scalar, 4-wide}
    # + the same x the 4 pairs with a 16-bit input x {LN, RMS} 8-wide
    # + backward-weight x 3 input dtypes x {LN, RMS}
    "norm": 2 * 5 * 2 * 2 + 2 * 4 * 2 + 3 * 2,
    # {forward, backward} x 3 dtypes
    "rotary": 2 * 3,
    # {gelu, swiglu} x {forward, backward} x 3 dtypes x {scalar, 4-wide}
    # + the same x the 2 16-bit dtypes 8-wide
    "activation": 2 * 2 * 3 * 2 + 2 * 2 * 2,
}

EM_AMDGPU, EF_AMDGPU_MACH_GFX90A = 224, 0x3F
EM_CUDA = 190
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def kernel_templates(unit: str) -> list:
    """The __global__ template names declared in the header a unit instantiates."""
    text = Path(ROOT, "csrc", "kernels", f"{unit}.cuh").read_text()
    bounds = r"__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*"  # one level of nested parens
    return re.findall(rf"__global__\s+void\s+(?:{bounds})?(\w+)\(", text)


def amd_code_objects(obj: bytes) -> dict:
    """{offload triple: code object bytes} from the clang offload bundle inside a HIP object."""
    start = obj.find(BUNDLE_MAGIC)
    assert start >= 0, "no clang offload bundle in the object"
    (count,) = struct.unpack_from("<Q", obj, start + len(BUNDLE_MAGIC))
    pos, found = start + len(BUNDLE_MAGIC) + 8, {}
    for _ in range(count):
        offset, size, triple_len = struct.unpack_from("<QQQ", obj, pos)
        triple = obj[pos + 24:pos + 24 + triple_len].decode()
        pos += 24 + triple_len
        found[triple] = obj[start + offset:start + offset + size]
    return found


def cuda_cubins(obj: bytes) -> dict:
    """{'sm_XY': cubin bytes} for each CUDA ELF embedded in the object's fatbin."""
    found, at = {}, obj.find(b"\x7fELF", 1)
    while at >= 0:
        if struct.unpack_from("<H", obj, at + 18)[0] == EM_CUDA:
            flags, abi = struct.unpack_from("<I", obj, at + 48)[0], obj[at + 8]
            # The SM moved from e_flags bits 0-7 to bits 8-15 in the CUDA 12.8 ELF ABI (v8).
            sm = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
            shoff = struct.unpack_from("<Q", obj, at + 40)[0]
            shentsize, shnum = struct.unpack_from("<HH", obj, at + 58)
            found[f"sm_{sm}"] = obj[at:at + shoff + shentsize * shnum]
        at = obj.find(b"\x7fELF", at + 1)
    return found


def defined_kernels(code: bytes, amd: bool) -> set:
    # AMDGPU code objects carry a kernel descriptor symbol NAME.kd per kernel; cubins a
    # .text.NAME section per kernel.
    pattern = rb"(_ZN2mf\w+?)\.kd\x00" if amd else rb"\.text\.(_ZN2mf\w+)\x00"
    return {m.decode() for m in re.findall(pattern, code)}


def check_kernels(names: set, unit: str, target: str):
    assert len(names) == EXPECTED_KERNELS[unit], (
        f"{unit} for {target}: {len(names)} kernels, expected {EXPECTED_KERNELS[unit]}")
    for template in kernel_templates(unit):
        assert any(f"{len(template)}{template}" in n for n in names), \
            f"{unit} for {target}: no instantiation of {template}"

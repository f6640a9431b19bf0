"""The real device code of csrc/kernels, executed on the CPU by a SIMT simulator
(tests/support/kernel_sim): every block's threads are real threads, __syncthreads a barrier, lane
shuffles a per-warp exchange. Built at warp widths 32 (NVIDIA) and 64 (CDNA), the launchers and
kernels must reproduce the torch references forward and backward, for every dtype, odd and long
rows (each register width and the streaming softmax), masks and mixed norm dtypes. A failure
names the op, width, dtype and case; it is a kernel bug the GPU tests would also catch."""
from __future__ import annotations

import ctypes as C
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from megatron.kernels import reference
from tests.support.paths import ROOT

SIM = Path(ROOT, "tests", "support", "kernel_sim")
CXX = shutil.which("g++")
WIDTHS = (32, 64)
CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DTYPES = list(CODE)
FWD_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BWD_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
I64, F32, INT, P = C.c_int64, C.c_float, C.c_int, C.c_void_p
SIGNATURES = {
    "sim_softmax": [INT, P, P, P, P] + [I64] * 7 + [F32, INT, INT],
    "sim_norm_forward": [P] * 6 + [I64, I64, F32, INT, INT, INT],
    "sim_norm_chunks": [I64, I64, INT],
    "sim_norm_backward": [P] * 8 + [I64, I64, I64, INT, INT, INT],
    "sim_rotary": [P] * 4 + [I64, I64, I64, INT, INT],
    "sim_gelu": [INT, P, P, P, P, I64, I64, INT],
    "sim_swiglu": [INT, P, P, P, P, P, I64, INT],
}

# slow: two g++ builds of the simulator and 188 simulated launches, a quarter of make test-fast's
# time before; make test runs it
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CXX is None, reason="g++ is needed to build the simulator")]


def _build(work: Path, width: int) -> Path:
    lib = work / f"libmfsim{width}.so"
    sources = [str(SIM / "sim_api.cpp")] + sorted(str(p) for p in (work / "kernels" /
                                                                   "instantiate").glob("*.cpp"))
    cmd = [CXX, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
           "-fvisibility-inlines-hidden", "-fno-gnu-unique", f"-DMF_WARP_SIZE={width}",
           f"-I{work / 'shim'}", f"-I{work / 'kernels'}", *sources, "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"simulator build (warp {width}) failed:\n{proc.stderr[-3000:]}"
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """Copies csrc/kernels, swaps in the simulator's compat header, turns each <<<...>>> launch
    into mf_sim::launch(...), and builds one library per warp width (in parallel)."""
    work = tmp_path_factory.mktemp("sim")
    shutil.copytree(Path(ROOT, "csrc", "kernels"), work / "kernels")
    shutil.copyfile(SIM / "compat_sim.h", work / "kernels" / "compat.cuh")
    (work / "shim").mkdir()
    shutil.copyfile(SIM / "cuda_runtime.h", work / "shim" / "cuda_runtime.h")
    for unit in (work / "kernels" / "instantiate").glob("*.cu"):
        text, launches = re.subn(r"(\w+<[^<>;]*>)<<<([^>]*)>>>\(", r"mf_sim::launch(\2, &\1, ",
                                 unit.read_text())
        assert launches, f"{unit.name}: no kernel launch found to simulate"
        unit.with_suffix(".cpp").write_text(text)
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = dict(zip(WIDTHS, pool.map(lambda w: _build(work, w), WIDTHS)))
    loaded = {}
    for width, path in paths.items():
        lib = C.CDLL(str(path))
        for name, args in SIGNATURES.items():
            getattr(lib, name).argtypes = args
        lib.sim_norm_chunks.restype = I64
        assert lib.sim_warp_size() == width
        loaded[width] = lib
    return loaded


def ptr(t):
    return None if t is None else t.data_ptr()


def rel_err(a, b):
    # Relative to the largest reference magnitude, floored at 1e-3: degenerate cases (one
    # element, where the reference's own rounding is ~1e-5) must not read as 100% errors.
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-3)).item()


def close(actual, expected, tol, what):
    err = rel_err(actual, expected)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


def ref_grads(fn, inputs, grad):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(grad)
    return out, [None if t is None else t.grad for t in leaves]


def run_softmax(lib, backward, a, b, mask, scale, causal):
    """Mirrors csrc/bindings/softmax.cpp: shapes and mask strides for the launcher."""
    out = torch.empty_like(a)
    sq, sk = a.shape[-2:]
    rows, heads, strides = a.numel() // sk, (1 if causal else a.shape[1]), (0, 0, 0)
    if mask is not None:
        mask = mask.expand(a.shape)
        if sk > 1 and mask.stride(3) != 1:
            mask = mask.contiguous()
        strides = mask.stride()[:3]
    rc = lib.sim_softmax(backward, ptr(a), ptr(b), ptr(out), ptr(mask), rows, heads, sq, sk,
                         *strides, scale, causal, CODE[a.dtype])
    assert rc == 0, f"launcher returned {rc}"
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sk,mask_kind", [(1, "none"), (37, "random"), (300, "fully_masked"),
                                          (1100, "padding"), (5000, "random"),
                                          (9000, "random")])  # items 1, 1, 4, 16, 16, stream
def test_masked_softmax(libs, width, dtype, sk, mask_kind):
    torch.manual_seed(sk)
    shape = (2, 2, 3, sk) if sk <= 300 else (1, 2, 2, sk) if sk <= 1100 else (1, 1, 1, sk)
    x = (torch.randn(shape) * 4).to(dtype)
    mask = None
    if mask_kind == "random":
        mask = torch.rand(shape[0], 1, shape[2], sk) < 0.3
    elif mask_kind == "padding":
        mask = (torch.arange(sk) >= sk // 2)[None, None, None, :]
    elif mask_kind == "fully_masked":
        mask = torch.zeros(1, 1, shape[2], sk, dtype=torch.bool)
        mask[..., 1, :] = True
    grad = torch.randn(shape).to(dtype)
    ref, (ref_dx,) = ref_grads(lambda s: reference.scaled_masked_softmax(s, mask, 0.3), [x], grad)
    what = f"masked softmax warp={width} {dtype} sk={sk} mask={mask_kind}"
    y = run_softmax(libs[width], 0, x, None, mask, 0.3, 0)
    close(y, ref, FWD_TOL[dtype], what + " forward")
    dx = run_softmax(libs[width], 1, grad, y, mask, 0.3, 0)
    close(dx, ref_dx, BWD_TOL[dtype], what + " backward")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [1, 7, 70, 260])
def test_causal_softmax(libs, width, dtype, s):
    torch.manual_seed(s)
    b = 1 if s > 64 else 3
    x, grad = (torch.randn(b, s, s) * 4).to(dtype), torch.randn(b, s, s).to(dtype)
    ref, (ref_dx,) = ref_grads(lambda t: reference.scaled_causal_softmax(t, 0.5), [x], grad)
    y = run_softmax(libs[width], 0, x, None, None, 0.5, 1)
    close(y, ref, FWD_TOL[dtype], f"causal softmax warp={width} {dtype} s={s} forward")
    assert torch.all(y.float().triu(1) == 0), "future positions must be exactly zero"
    dx = run_softmax(libs[width], 1, grad, y, None, 0.5, 1)
    close(dx, ref_dx, BWD_TOL[dtype], f"causal softmax warp={width} {dtype} s={s} backward")


NORM_CASES = [(torch.float32, torch.float32), (torch.float16, torch.float16),
              (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
              (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype,wdtype", NORM_CASES)
@pytest.mark.parametrize("rows,n", [(1, 2), (3, 7), (4, 1023), (2, 2048)])
@pytest.mark.parametrize("rms", [False, True])
def test_norm(libs, width, dtype, wdtype, rows, n, rms):
    torch.manual_seed(n)
    lib = libs[width]
    x = (torch.randn(rows, n) * 3 + 1).to(dtype)
    w, b = (torch.randn(n) + 1).to(wdtype), (None if rms else torch.randn(n).to(wdtype))
    grad = torch.randn(rows, n).to(dtype)
    fn = (lambda x, w: reference.rms_norm(x, w, 1e-5)) if rms else \
        (lambda x, w, b: reference.layer_norm(x, w, b, 1e-5))
    ref, ref_grads_ = ref_grads(fn, [x, w] + ([] if rms else [b]), grad)
    y, mean, rstd = torch.empty_like(x), torch.empty(rows), torch.empty(rows)
    assert lib.sim_norm_forward(ptr(x), ptr(w), ptr(b), ptr(y), None if rms else ptr(mean),
                                ptr(rstd), rows, n, 1e-5, rms, CODE[dtype], CODE[wdtype]) == 0
    what = f"{'rms' if rms else 'layer'}_norm warp={width} {dtype}/{wdtype} [{rows}, {n}]"
    close(y, ref, FWD_TOL[dtype], what + " forward")
    chunks = lib.sim_norm_chunks(rows, n, 2)
    gp, bp, dx = torch.empty(chunks, n), torch.empty(chunks, n), torch.empty_like(x)
    assert lib.sim_norm_backward(ptr(grad), ptr(x), ptr(w), None if rms else ptr(mean),
                                 ptr(rstd), ptr(dx), ptr(gp), None if rms else ptr(bp), chunks,
                                 rows, n, rms, CODE[dtype], CODE[wdtype]) == 0
    close(dx, ref_grads_[0], BWD_TOL[dtype], what + " grad input")
    close(gp.sum(0), ref_grads_[1].float(), BWD_TOL[wdtype], what + " grad weight")
    if not rms:
        close(bp.sum(0), ref_grads_[2].float(), BWD_TOL[wdtype], what + " grad bias")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,d", [(1, 2), (5, 6), (9, 128), (3, 600)])
def test_rotary(libs, width, dtype, s, d):
    torch.manual_seed(d)
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    emb = torch.outer(torch.arange(s).float(), inv).repeat(1, 2)[:, None, None]
    cos, sin = emb.cos().contiguous(), emb.sin().contiguous()
    x, grad = torch.randn(s, 2, 3, d).to(dtype), torch.randn(s, 2, 3, d).to(dtype)
    ref, (ref_dx,) = ref_grads(lambda t: reference.rotary(t, cos, sin), [x], grad)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    lib = libs[width]
    assert lib.sim_rotary(ptr(x), ptr(cos), ptr(sin), ptr(y), s, 6, d, 0, CODE[dtype]) == 0
    assert lib.sim_rotary(ptr(grad), ptr(cos), ptr(sin), ptr(dx), s, 6, d, 1, CODE[dtype]) == 0
    close(y, ref, FWD_TOL[dtype], f"rotary warp={width} {dtype} s={s} d={d} forward")
    close(dx, ref_dx, BWD_TOL[dtype], f"rotary warp={width} {dtype} s={s} d={d} backward")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
# rows of 7 and 1: scalar accesses; 12: 4-wide; 64 and 256: 8-wide for 16-bit types
@pytest.mark.parametrize("n,with_bias", [(1, True), (7, True), (12, True), (64, False),
                                         (256, True)])
def test_bias_gelu_and_swiglu(libs, width, dtype, n, with_bias):
    torch.manual_seed(n)
    lib = libs[width]
    x, grad = (torch.randn(5, n) * 2).to(dtype), torch.randn(5, n).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    ref, (ref_dx, _) = ref_grads(reference.bias_gelu, [x, bias], grad)
    fbias = None if bias is None else bias.float()
    y, dx = torch.empty_like(x), torch.empty_like(x)
    assert lib.sim_gelu(0, None, ptr(x), ptr(fbias), ptr(y), x.numel(), n, CODE[dtype]) == 0
    assert lib.sim_gelu(1, ptr(grad), ptr(x), ptr(fbias), ptr(dx), x.numel(), n,
                        CODE[dtype]) == 0
    what = f"warp={width} {dtype} n={n}"
    close(y, ref, FWD_TOL[dtype], f"bias_gelu {what} forward")
    close(dx, ref_dx, BWD_TOL[dtype], f"bias_gelu {what} backward")
    up = torch.randn(5, n).to(dtype)
    ref, (ref_dg, ref_du) = ref_grads(reference.swiglu, [x, up], grad)
    y, dg, du = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    assert lib.sim_swiglu(0, None, ptr(x), ptr(up), ptr(y), None, x.numel(), CODE[dtype]) == 0
    assert lib.sim_swiglu(1, ptr(grad), ptr(x), ptr(up), ptr(dg), ptr(du), x.numel(),
                          CODE[dtype]) == 0
    close(y, ref, FWD_TOL[dtype], f"swiglu {what} forward")
    close(dg, ref_dg, BWD_TOL[dtype], f"swiglu {what} grad gate")
    close(du, ref_du, BWD_TOL[dtype], f"swiglu {what} grad up")

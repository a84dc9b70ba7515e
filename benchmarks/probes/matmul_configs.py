"""Time the CUTLASS configurations built from matmul_configs.cu (see its header) against cuBLAS's bmm and
Inductor's bmm * scale + bias -> GELU, in one run: `python matmul_configs.py mm0.so mm1.so mm2.so`.
act=0: the plain GEMM; act=1: scale + bias + GELU(erf). err: max abs error against a float64 reference (the
output is filled with NaN before the checked call; "wrong": how many elements are off by more than
1 + |ref| / 64, and the first). Variants named "bf16 ..." run bf16, the others fp16.
FK_FLUSH=clean: time with bench_patterns.clean_flushed (an L2 flush that leaves no dirty lines) instead of
do_bench; FK_SHAPES="L,M,K,N;...": other shapes; FK_GRAPH=1: time one-call CUDA-graph replays (as bench_matmul);
FK_ACTS=0: the plain GEMM only; FK_CHECK_ONLY=1: the error checks alone (under compute-sanitizer). Variants
named "kmaj ..." take b K-major ([L, N, K] contiguous, as a linear's weight), next to a cuBLAS row on the same
layout."""
import sys

if {"-h", "--help"} & set(sys.argv[1:]):  # before torch/triton: usage is the docstring
    print(__doc__)
    sys.exit(0)

import ctypes
import os
import pathlib
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
if os.environ.get("FK_FLUSH") == "clean" or os.environ.get("FK_GRAPH"):
    from bench_patterns import timer  # graph=False, flush="clean": clean_flushed on the call itself

    def do_bench(fn, return_mode="median"):  # noqa: F811
        return statistics.median(timer(fn, hot=False, graph=bool(os.environ.get("FK_GRAPH")),
                                       flush=os.environ.get("FK_FLUSH", "zero"))())

torch.manual_seed(0)
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(0).multi_processor_count
ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
libs = [ctypes.CDLL(p) for p in sys.argv[1:]]
for lib in libs:
    lib.fk_probe_name.restype = ctypes.c_char_p
    lib.fk_probe_run.argtypes = [ctypes.c_int] * 5 + [ctypes.c_void_p] * 4 + [ctypes.c_float, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int]


def ref(a, b, bias, scale):
    return F.gelu(torch.bmm(a, b) * scale + bias)


SHAPES = [tuple(map(int, s.split(","))) for s in os.environ["FK_SHAPES"].split(";")] if "FK_SHAPES" in os.environ \
    else [(32, 1024, 1024, 1024), (96, 512, 512, 64), (96, 512, 64, 512)]  # L, M, K, N


def where_wrong(d, w):
    """Max abs error, and where the output is wrong (|err| > 1 + |ref| / 64, beyond bf16's rounding): how many
    elements, the first [l, m, n]."""
    e = (d.double() - w).abs()
    bad = (e > 1 + w.abs() / 64) | e.isnan()
    msg = f"err {e.nan_to_num(float('inf')).max().item():.1e}"
    if bad.any():
        msg += f"  wrong {bad.sum().item()}/{bad.numel()} first {bad.nonzero()[0].tolist()}"
    return msg


for L, M, K, N in SHAPES:
    scale = 0.125
    ops = {}
    for dt in (torch.half, torch.bfloat16):
        a = torch.randn(L, M, K, device=dev, dtype=dt)
        b = torch.randn(L, K, N, device=dev, dtype=dt)
        bias = torch.randn(N, device=dev, dtype=dt)
        ops[dt] = (a, b, bias, b.transpose(1, 2).contiguous())  # last: K-major b
    orig = {dt: [x.clone() for x in v] for dt, v in ops.items()}  # to tell a changed input from a wrong kernel
    comp = torch.compile(ref)
    rows = []
    for dt, tag in ((torch.half, ""), (torch.bfloat16, "bf16 ")):
        a, b, bias, bk = ops[dt]
        comp(a, b, bias, scale)
        rows += [(f"{tag}cublas bmm (plain)", do_bench(lambda: torch.bmm(a, b), return_mode="median"), None),
                 (f"{tag}cublas bmm kmaj (plain)", do_bench(lambda: torch.bmm(a, bk.transpose(1, 2)), return_mode="median"), None),
                 (f"{tag}inductor bmm+epi", do_bench(lambda: comp(a, b, bias, scale), return_mode="median"), None)]
    d = {dt: torch.empty(L, M, N, device=dev, dtype=dt) for dt in ops}
    for lib in libs:
        for i in range(lib.fk_probe_count()):
            name = lib.fk_probe_name(i).decode()
            dt = torch.bfloat16 if name.split()[0] == "bf16" else torch.half
            a, b, bias, bk = ops[dt]
            bb, out = (bk if "kmaj" in name.split() else b), d[dt]
            for act in map(int, os.environ.get("FK_ACTS", "0,1").split(",")):
                fn = lambda: lib.fk_probe_run(i, L, M, N, K, a.data_ptr(), bb.data_ptr(), bias.data_ptr() if act else None,
                                              out.data_ptr(), scale if act else 1.0, act, ws.data_ptr(), ws.numel(),
                                              torch.cuda.current_stream().cuda_stream, sms)
                out.fill_(float("nan"))  # a tile the kernel leaves unwritten reads as wrong
                rc = fn()
                if rc != 0:
                    rows.append((f"{name} act={act}", float("nan"), f"rc {rc}"))
                    continue
                torch.cuda.synchronize()
                w = ref(a.double(), b.double(), bias.double(), scale) if act else torch.bmm(a.double(), b.double())
                first = where_wrong(out, w)
                t = float("nan") if os.environ.get("FK_CHECK_ONLY") else do_bench(fn, return_mode="median")
                after = where_wrong(out, w)
                moved = [n for n, x, x0 in zip("a b bias bk".split(), ops[dt], orig[dt]) if not torch.equal(x, x0)]
                rows.append((f"{name} act={act}", t, first + ("" if after == first else f"  AFTER TIMING {after}")
                             + (f"  INPUTS CHANGED {moved}" if moved else "")))
    print(f"\n[{L},{M},{K},{N}]", flush=True)
    ind = {n.split()[0] == "bf16": t for n, t, _ in rows if n.endswith("inductor bmm+epi")}  # per dtype
    for n, t, e in rows:
        print(f"  {n:40s} {t:.4f} ms  vs-inductor {ind[n.split()[0] == 'bf16'] / t:.2f}x  {e or ''}", flush=True)

"""Time the CUTLASS configurations built from matmul_configs.cu (see its header) against cuBLAS's bmm and
Inductor's bmm * scale + bias -> GELU, in one run: `python matmul_configs.py mm0.so mm1.so mm2.so`.
act=0: the plain GEMM; act=1: scale + bias + GELU(erf). err: max abs error against a float64 reference.
FK_FLUSH=clean: time with bench_patterns.clean_flushed (an L2 flush that leaves no dirty lines) instead of
do_bench; FK_SHAPES="L,M,K,N;...": other shapes; FK_GRAPH=1: time one-call CUDA-graph replays (as bench_matmul);
FK_ACTS=0: the plain GEMM only. Variants named "kmaj ..." take b K-major ([L, N, K] contiguous, as a linear's
weight), next to a cuBLAS row on the same layout."""
import ctypes
import os
import pathlib
import statistics
import sys

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
for L, M, K, N in SHAPES:
    a = torch.randn(L, M, K, device=dev, dtype=torch.half)
    b = torch.randn(L, K, N, device=dev, dtype=torch.half)
    bias = torch.randn(N, device=dev, dtype=torch.half)
    scale = 0.125
    want = ref(a.double(), b.double(), bias.double(), scale)
    comp = torch.compile(ref)
    comp(a, b, bias, scale)
    bk = b.transpose(1, 2).contiguous()  # K-major b
    rows = [("cublas bmm (plain)", do_bench(lambda: torch.bmm(a, b), return_mode="median"), None),
            ("cublas bmm kmaj (plain)", do_bench(lambda: torch.bmm(a, bk.transpose(1, 2)), return_mode="median"), None),
            ("inductor bmm+epi", do_bench(lambda: comp(a, b, bias, scale), return_mode="median"), None)]
    d = torch.empty(L, M, N, device=dev, dtype=torch.half)
    for lib in libs:
        for i in range(lib.fk_probe_count()):
            name = lib.fk_probe_name(i).decode()
            bb = bk if name.startswith("kmaj") else b
            for act in map(int, os.environ.get("FK_ACTS", "0,1").split(",")):
                fn = lambda: lib.fk_probe_run(i, L, M, N, K, a.data_ptr(), bb.data_ptr(), bias.data_ptr() if act else None,
                                              d.data_ptr(), scale if act else 1.0, act, ws.data_ptr(), ws.numel(),
                                              torch.cuda.current_stream().cuda_stream, sms)
                rc = fn()
                if rc != 0:
                    rows.append((f"{name} act={act}", float("nan"), f"rc {rc}"))
                    continue
                torch.cuda.synchronize()
                w = want if act else torch.bmm(a.double(), b.double())
                err = (d.double() - w).abs().max().item()
                rows.append((f"{name} act={act}", do_bench(fn, return_mode="median"), f"err {err:.1e}"))
    ind = rows[2][1]
    print(f"\n[{L},{M},{K},{N}]  (Inductor bmm*s+bias->gelu {ind:.4f} ms)", flush=True)
    for n, t, e in rows:
        print(f"  {n:36s} {t:.4f} ms  vs-inductor {ind / t:.2f}x  {e or ''}", flush=True)

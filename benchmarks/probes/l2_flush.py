"""What an L2 flush leaves behind costs the next timed call: direct op calls at [4882, 4096] (20M elements) and
a D2D copy of half the bytes a 16-bit -> int8 kernel moves, each after one of four flushes of a 256 MB buffer
(zero_: triton.testing.do_bench's; fill_; a read (amax), which leaves clean lines; zero_ then the read), and
per-row INT8 also on the hbm_launch_shapes probe's data (N(0, 3), scales 0.01..0.05). 3 interleaved rounds.
Needs a GPU and the built extension:  python benchmarks/probes/l2_flush.py   (results/h200_l2_flush.txt)
Session 13's finding: a flush that writes leaves dirty lines whose write-back lands in the timed call
(+2.2 us on the copy, +2.4-5.1 us on the kernels); bench_patterns now flushes by reading (clean_flushed)."""
import statistics
import torch
import fusion_backend
from fusion_backend import registry, _ext, table

print(_ext.load_for_device())  # build/load the kernels before timing
rows, cols = 4882, 4096
cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
scratch_out = torch.empty(1, dtype=torch.int32, device="cuda")
FLUSH = {
    "zero_": lambda i: cache.zero_(),
    "fill_(i)": lambda i: cache.fill_(i % 251 + 1),
    "read(amax)": lambda i: torch.amax(cache, dim=0, out=scratch_out[0]),
    "zero_+read": lambda i: (cache.zero_(), torch.amax(cache, dim=0, out=scratch_out[0])),
}

def med(fn, flush, reps=80):
    ts = []
    for i in range(reps + 5):
        flush(i)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record()
        b.synchronize()
        if i >= 5:
            ts.append(a.elapsed_time(b))
    return statistics.median(ts)

cases = {}
for dt in (torch.float16, torch.bfloat16):
    for pid in ("quantize.quant_i8_per_row", "quantize.quant_i8_per_col", "quantize.quant_i8", "quantize.dyn_quant_i8",
                "elementwise.add_mul_exp"):
        try:
            p = table.by_id(pid)
        except Exception as e:
            print("skip", pid, e); continue
        args = p.make_args((rows, cols), dt, "cuda")
        moved = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        out = registry.call_op(p, args)
        outs = out if isinstance(out, tuple) else (out,)
        moved += sum(o.numel() * o.element_size() for o in outs)
        cases[f"{pid.split('.')[1]} {str(dt)[6:]}"] = (lambda p=p, args=args: registry.call_op(p, args), moved)
        if pid.endswith("per_row"):  # the probe's data: N(0, 3), scales 0.01..0.05
            x = (torch.randn(rows, cols, device="cuda") * 3).to(dt)
            s = torch.rand(rows, 1, device="cuda") * 0.04 + 0.01
            a2 = [x, s, args[2], *args[3:]]
            cases[f"per_row {str(dt)[6:]} probe-data"] = (lambda p=p, a2=a2: registry.call_op(p, a2), moved)
src = torch.empty(cases["quant_i8_per_row float16"][1] // 2 // 4096 * 4096, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
src.random_(0, 255)
cases["copy (16-bit 1B-out size)"] = (lambda: dst.copy_(src), 2 * src.numel())
res = {(c, f): [] for c in cases for f in FLUSH}
for r in range(3):
    for c, (fn, _) in cases.items():
        for f, fl in FLUSH.items():
            res[c, f].append(med(fn, fl))
    print("round", r, "done", flush=True)
print(f"{'case':38s}" + "".join(f"{f:>14s}" for f in FLUSH))
for c, (fn, moved) in cases.items():
    print(f"{c:38s}" + "".join(f"{1e3 * statistics.median(res[c, f]):11.2f} us" for f in FLUSH))
print("(medians of 3 rounds of 80-call medians; each call after its flush, events around the call)")

"""Measures the quantize kernels at the two HBM sizes of bench_patterns.py (20M and 50M elements, rows of 4096),
called directly (no compiled graph around them, so no host overhead in the figure), against Inductor's kernels for
the same reference and a device-to-device copy of the same bytes: the median of --rounds interleaved rounds of
triton.testing.do_bench medians (L2 flushed), which steadies the run-to-run noise a single pass of bench_patterns.py
shows at these sizes; the CUDA defaults of the per-channel INT8 rules rest on it. Needs a CUDA GPU. Prints the
table and writes quant_hbm.md under --out.

    python benchmarks/bench_quant_hbm.py [--out out/] [--rounds 3] [--patterns dyn_quant_i8,quant_i8_per_row]
"""
from __future__ import annotations

import argparse
import pathlib
import statistics

import torch

from bench_patterns import copy_bytes
from fusion_backend import _ext, registry, table

IDS = ["quantize.dyn_quant_i8", "quantize.dyn_quant_fp8", "quantize.quant_i8", "quantize.quant_i8_per_col",
       "quantize.quant_i8_per_row"]
SIZES = (19996672, 49999872)
COLS = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--patterns", default=",".join(i.split(".")[1] for i in IDS), help="comma-separated names")
    a = ap.parse_args()
    ids = [f"quantize.{n}" for n in a.patterns.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("bench_quant_hbm needs a CUDA GPU")
    from triton.testing import do_bench  # CUDA builds of torch only
    _ext.load_for_device()
    for name in ("recompile_limit", "cache_size_limit"):  # one compiled graph per (pattern, dtype, size)
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    res: dict[tuple, dict] = {}
    for rnd in range(a.rounds):
        for pid in ids:
            p = table.by_id(pid)
            for dt in (torch.float16, torch.bfloat16):
                for n in SIZES:
                    args = p.make_args((n // COLS, COLS), dt, "cuda")
                    key = (pid.split(".")[1], str(dt)[6:], n)
                    if key not in res:
                        res[key] = {"fk": [], "ind": [], "copy": [], "comp": torch.compile(p.eager)}
                        res[key]["comp"](*args)
                    r = res[key]
                    out = registry.call_op(p, args)
                    nbytes = args[0].nbytes + sum(o.nbytes for o in (out if isinstance(out, tuple) else (out,)))
                    src = torch.empty(copy_bytes(nbytes), dtype=torch.uint8, device="cuda")  # read + write
                    dst = torch.empty_like(src)
                    r["copy"].append(do_bench(lambda: dst.copy_(src), rep=100, return_mode="median"))
                    r["fk"].append(do_bench(lambda: registry.call_op(p, args), rep=100, return_mode="median"))
                    r["ind"].append(do_bench(lambda: r["comp"](*args), rep=100, return_mode="median"))
        print(f"round {rnd + 1}/{a.rounds} done", flush=True)
    lines = [f"# quantize kernels at HBM sizes ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             f"Median of {a.rounds} interleaved do_bench medians (L2 flushed); direct op calls; % of a "
             "device-to-device copy of the same bytes measured in the same round.", "",
             "| pattern | dtype | elements | fusekit ms | Inductor ms | fusekit / Inductor | fusekit % of copy | "
             "Inductor % of copy |", "|---|---|---|---|---|---|---|---|"]
    for (pid, dt, n), r in res.items():
        fk, ind, cp = (statistics.median(r[k]) for k in ("fk", "ind", "copy"))
        lines.append(f"| {pid} | {dt} | {n:,} | {fk:.4f} | {ind:.4f} | {fk / ind:.2f} | {100 * cp / fk:.1f} | "
                     f"{100 * cp / ind:.1f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        path = pathlib.Path(a.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "quant_hbm.md").write_text(md)


if __name__ == "__main__":
    main()

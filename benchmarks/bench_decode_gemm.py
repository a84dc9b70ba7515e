"""Measures the decode-GEMM rules (`decode_gemm.*`) at the linears of the benchmark models' decode steps (q, k/v,
q+k+v, o, gate+up with SiLU-mul, down, lm_head): eager (cuBLAS), Inductor, fusekit (compiled; the rule fires where
its guards let it) and the op called directly, at 1-64 rows (batch x new tokens), against the weight bytes at the
measured copy bandwidth. With --int8-weights, the one-weight linears as torchao's int8 weight-only linears
(`decode_gemm.linear_w8*`: int8 weight, per-channel scales; Inductor lowers them to aten._weight_int8pack_mm) with
cuBLAS on the 16-bit weight beside them (column bf16); with --fp8, as torchao's float8 dynamic per-row linears
(`decode_gemm.linear_fp8*`, written as torchao writes them: x quantized per row, aten._scaled_mm), the op also with
FUSEKIT_DECODE_FP8=mma (column "op mma": the mma.sync kernels beside the default's TMA one); with --fp8-weight, as
torchao's float8 weight-only linears (`decode_gemm.linear_fp8_weight*`: e4m3 weight, per-row float32 scales, each weight
dequantized to x's dtype; Inductor writes that 16-bit weight and reads it in cuBLAS); for --int8-weights and
--fp8-weight the "op mma" column is the op with FUSEKIT_DECODE_GEMM=old (the mma.sync kernel beside the default's TMA
one, sm_90a); with --int8-dynamic, as
torchao's int8 dynamic-activation int8-weight linears (`decode_gemm.linear_w8a8*`: x quantized per row by Inductor in
both, then aten._int_mm and its scales' kernel, or the op; "op" is the op alone on an x quantized beforehand; eager
and Inductor fail below 17 rows, where aten._int_mm refuses, and show as "-"). Every weight is read cold, as in a step whose weights do not
fit in L2: each timed function runs over R weight sets (R x the weight bytes >= 256 MB) in one CUDA graph of R
calls, the per-call time is a replay's time / R (median of --reps replays), and eager, Inductor and fusekit take
turns over --rounds rounds. Needs a CUDA GPU (the TMA kernel on sm_90a). Writes decode_gemm.md, .json and .png under --out.

    python benchmarks/bench_decode_gemm.py --out out/ [--rows 1,8,32,64] [--models llama,qwen2] [--linears q+k+v,o]
                                           [--int8-weights | --fp8 | --fp8-weight | --int8-dynamic]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics

import torch

from fusion_backend.tools.cuda_graphs import capture, environment
from fusion_backend import stats, table
from fusion_backend.patterns.decode_gemm import (MAX_ROWS, MAX_ROWS_TMA, _fp8_scaled_mm,  # the table's references
                                                 decode_linear_fp8_weight_ref, decode_linear_ref, decode_linear_w8_ref,
                                                 decode_linear_w8a8_ref, decode_qkv_ref)
from fusion_backend.tools.decode_bench import _int_mm_rows_padded
from fusion_backend.tools.models import MODELS

MB = 2**20


def linears(spec) -> list[tuple[str, int, tuple[int, ...], str]]:
    """(name, K, the weights' N, kind) of a decoder's decode-step linears: q, k and v one by one and as the
    q/k/v rule's one op, o, gate+up, down, lm_head; kind in plain / silu_mul (gate+up) / qkv. GPT-NeoX's: the
    fused query_key_value, dense, the MLP's up projection with GELU and its down projection, all with biases
    (kind bias / bias_gelu), and the embed_out head."""
    c = spec.full
    if spec.config == "GPTNeoXConfig":
        h, i = c["hidden_size"], c["intermediate_size"]
        return [("query_key_value", h, (3 * h,), "bias"), ("dense", h, (h,), "bias"),
                ("h_to_4h+gelu", h, (i,), "bias_gelu"), ("4h_to_h", i, (h,), "bias"),
                ("lm_head", h, (c["vocab_size"],), "plain")]
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim", h // heads)
    return [("q", h, (heads * d,), "plain"), ("k/v", h, (kv * d,), "plain"),
            ("q+k+v", h, (heads * d, kv * d, kv * d), "qkv"), ("o", heads * d, (h,), "plain"),
            ("gate+up", h, (c["intermediate_size"],) * 2, "silu_mul"), ("down", c["intermediate_size"], (h,), "plain"),
            ("lm_head", h, (c["vocab_size"],), "plain")]


def quantized_linears(spec, quant: str) -> list[tuple[str, int, tuple[int, ...], str]]:
    """The one-weight linears of `linears` (gate+up as gate alone) of kind `quant`: w8 (int8 weight-only), fp8
    (float8 dynamic per-row) or fp8w (float8 weight-only)."""
    return [(name.replace("gate+up", "gate"), k, ns[:1], quant) for name, k, ns, kind in linears(spec)
            if kind in ("plain", "silu_mul")]


def _i8_dyn_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao 0.18's per-row int8 activation quantization (Int8DynamicActivationInt8WeightConfig): max(-min, max)
    / 127.5 in x's dtype, clamped to float32's eps, x * (1 / scale) rounded."""
    mn, mx = torch.amin(x, -1, keepdim=True), torch.amax(x, -1, keepdim=True)
    mx = torch.max(-torch.min(mn, torch.zeros_like(mn)), torch.max(mx, torch.zeros_like(mx)))
    s = torch.clamp((mx / 127.5).float(), min=torch.finfo(torch.float32).eps).to(x.dtype).float()
    return torch.clamp(torch.round(x * (1.0 / s)), -128, 127).to(torch.int8), s


def _int8_dynamic_linear(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """torchao's int8 dynamic linear: x quantized per row, then the w8a8 rule's reference."""
    xq, xs = _i8_dyn_rows(x)
    return decode_linear_w8a8_ref(xq, xs, w, ws, x.dtype)


def _w8a8_op():
    """The w8a8 op alone, on x quantized once beforehand (per x): decode_linear_w8a8 up to the decode rule's rows,
    past them linear_w8a8 (the tiled GEMM, whose rule fires by default only from TILED_MIN_ROWS rows and
    TILED_MIN_OUTPUTS outputs)."""
    quantized: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def op(x, w, ws):
        if id(x) not in quantized:
            quantized[id(x)] = (x, *_i8_dyn_rows(x))
        _, xq, xs = quantized[id(x)]
        tiled = xs.numel() > MAX_ROWS["linear_w8a8"]
        return (torch.ops.fusekit.linear_w8a8 if tiled else torch.ops.fusekit.decode_linear_w8a8)(xq, xs, w, ws, x.dtype)

    return op


def reference_and_op(kind: str):
    """(the rule's reference, the op called directly) for a linear of `kind`, both taking (x, *weights)."""
    if kind == "w8a8":  # (x, int8 w, float32 scales)
        return _int8_dynamic_linear, _w8a8_op()
    if kind == "w8":  # (x, int8 w, scales)
        return decode_linear_w8_ref, torch.ops.fusekit.decode_linear_w8
    if kind == "fp8":  # (x, e4m3 w, w_scale): torchao's spelling, aten._scaled_mm, as Inductor gets it
        return _fp8_scaled_mm, torch.ops.fusekit.decode_linear_fp8
    if kind == "fp8w":  # (x, e4m3 w, float32 w_scale [N, 1])
        return decode_linear_fp8_weight_ref, torch.ops.fusekit.decode_linear_fp8_weight
    if kind == "qkv":
        return decode_qkv_ref, torch.ops.fusekit.decode_qkv
    if kind.startswith("bias"):  # (x, w, b)
        act = "gelu" if kind == "bias_gelu" else "none"
        return ((lambda x, w, b: decode_linear_ref(x, w, None, act, b)),
                (lambda x, w, b: torch.ops.fusekit.decode_linear(x, w, None, act, b)))
    act = "none" if kind == "plain" else kind
    return ((lambda x, w, w2=None: decode_linear_ref(x, w, w2, act)),
            (lambda x, w, w2=None: torch.ops.fusekit.decode_linear(x, w, w2, act)))


def graph_time(fn, sets: int, reps: int) -> float:
    """ms per call: median over `reps` replays of a graph of `sets` calls, one per weight set."""
    g = capture(lambda: [fn(i) for i in range(sets)])
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) / sets


def copy_bandwidth() -> float:
    """GB/s of a 256 MB device-to-device copy (read + write), the floor's bandwidth."""
    src = torch.empty(256 * MB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_time(lambda i: dst.copy_(src), 1, 50)
    return 2 * src.numel() / ms / 1e6


def weight_set(kind: str, k: int, ns: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """One set of a linear's weights (and bias, or int8 weight and scales)."""
    if kind in ("w8", "fp8", "fp8w"):  # the rule's own test inputs: (x, w, scales)
        rule = {"w8": "decode_gemm.linear_w8_2d", "fp8": "decode_gemm.linear_fp8_2d",
                "fp8w": "decode_gemm.linear_fp8_weight_2d"}[kind]
        return list(table.by_id(rule).make_args((1, k, ns[0]), dtype, "cuda")[1:])
    if kind == "w8a8":  # the rule's test inputs (xq, xs, w, ws): w and ws
        return list(table.by_id("decode_gemm.linear_w8a8_bfloat16_2d").make_args((1, k, ns[0]), torch.int8, "cuda")[2:])
    return [torch.randn(n, k, device="cuda", dtype=dtype) * k ** -0.5 for n in ns] + \
        ([torch.randn(ns[0], device="cuda", dtype=dtype)] if kind.startswith("bias") else [])


def run(models: list[str], rows: list[int], rounds: int, reps: int, only: set[str] | None = None,
        dtype=torch.bfloat16, quant: str = "") -> list[dict]:
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    out, seen = [], set()
    for spec in (MODELS[name] for name in models):
        for name, k, ns, kind in (quantized_linears(spec, quant) if quant else linears(spec)):
            if (k, ns, kind) in seen or (only and name not in only):
                continue
            seen.add((k, ns, kind))
            wbytes = sum(ns) * k * (1 if quant else 2)  # 8-bit weights: one byte each
            sets = max(2, min(64, math.ceil(256 * MB / wbytes)))
            ws = [weight_set(kind, k, ns, dtype) for _ in range(sets)]
            # cuBLAS on the 16-bit weights, beside an 8-bit linear
            w16 = [torch.randn(ns[0], k, device="cuda", dtype=dtype) for _ in range(sets)] if quant else None
            ref, op = reference_and_op(kind)
            for m in rows:
                x = torch.randn(m, 1, k, device="cuda", dtype=dtype)
                torch._dynamo.reset()
                ind = torch.compile(ref, backend="inductor")
                fk = torch.compile(ref, backend="fusekit")
                fns = {"eager": lambda i: ref(x, *ws[i]), "inductor": lambda i: ind(x, *ws[i]),
                       "fusekit": lambda i: fk(x, *ws[i]), "op": lambda i: op(x, *ws[i])}
                if w16 is not None:
                    fns["bf16"] = lambda i: torch.nn.functional.linear(x, w16[i])
                if kind in ("w8", "fp8w"):  # torchao's quantize_ turns coordinate-descent tuning on: at one row
                    cdt = {"coordinate_descent_tuning": True}  # Inductor then writes the mm as mul + sum
                    ind_cdt = torch.compile(ref, backend="inductor", options=cdt)
                    fk_cdt = torch.compile(ref, backend="fusekit", options=cdt)
                    fns["inductor_cdt"] = lambda i: ind_cdt(x, *ws[i])
                    fns["fusekit_cdt"] = lambda i: fk_cdt(x, *ws[i])
                if kind in ("fp8", "w8", "fp8w"):
                    env = {"FUSEKIT_DECODE_FP8": "mma"} if kind == "fp8" else {"FUSEKIT_DECODE_GEMM": "old"}

                    def op_mma(i):
                        with environment(env):  # read at each launch
                            return op(x, *ws[i])
                    fns["mma"] = op_mma
                if kind == "bias_gelu":  # the matmul epilogue's tiled GEMM, the rule this one is matched before
                    fns["epilogue"] = lambda i: torch.ops.fusekit.matmul_epilogue(x, ws[i][0], ws[i][1], None, None,
                                                                                  "gelu", True)
                with stats.collect() as records:
                    fk(x, *ws[0])
                sites = sum(sum(r.sites.values()) for r in records)
                for key in ("eager", "inductor"):  # aten._int_mm refuses 16 rows or fewer: no time for them
                    try:
                        fns[key](0)
                    except RuntimeError as e:
                        print(f"    {key} fails at {m} rows: {str(e).splitlines()[0][:120]}", flush=True)
                        del fns[key]
                with _int_mm_rows_padded():
                    got, want = fns["op"](0), ref(x, *ws[0])
                err = max((a.float() - b.float()).abs().max().item() for a, b in
                          zip(*(o if isinstance(o, (tuple, list)) else (o,) for o in (got, want))))
                times = {key: [] for key in fns}
                for _ in range(rounds):
                    for key, f in fns.items():
                        times[key].append(graph_time(f, sets, reps))
                row = {"model": spec.name, "linear": name, "K": k, "N": "+".join(map(str, ns)), "kind": kind,
                       "rows": m, "weight_MB": wbytes / MB, "sites": sites, "max_abs_diff_vs_eager": err,
                       "eager_ms": None, "inductor_ms": None,
                       **{f"{key}_ms": statistics.median(v) for key, v in times.items()},
                       "floor_ms": wbytes / bw / 1e6}
                out.append(row)
                print(f"{spec.name:6s} {name:8s} K={k:5d} N={row['N']:>14s} rows={m:3d}: eager {_us(row['eager_ms'])} us, "
                      f"inductor {_us(row['inductor_ms'])}, fusekit {row['fusekit_ms'] * 1e3:7.1f} ({sites} site), "
                      f"op {row['op_ms'] * 1e3:7.1f}, floor {row['floor_ms'] * 1e3:6.1f}; "
                      + (f"matmul_epilogue {row['epilogue_ms'] * 1e3:7.1f}; " if "epilogue_ms" in row else "")
                      + (f"bf16 cuBLAS {row['bf16_ms'] * 1e3:7.1f}; " if "bf16_ms" in row else "")
                      + (f"op mma {row['mma_ms'] * 1e3:7.1f}; " if "mma_ms" in row else "")
                      + (f"inductor CDT {row['inductor_cdt_ms'] * 1e3:7.1f}, "
                         f"fusekit CDT {row['fusekit_cdt_ms'] * 1e3:7.1f}; " if "inductor_cdt_ms" in row else "") +
                      f"op/inductor {_ratio(row['inductor_ms'], row['op_ms'])}", flush=True)
            del ws, w16
    return out


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _ratio(a: float | None, b: float) -> str:
    return "-" if a is None else f"{a / b:.2f}x"


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"# decode_gemm: the decode step's linears ({device}, torch {torch.__version__}, bf16, cold weights)", "",
             f"us per call; speedup = Inductor / op; floor = weight bytes at the copy bandwidth. Where the TMA kernel "
             f"runs (sm_90a) every rule fires by default up to {MAX_ROWS_TMA['linear']} rows; elsewhere gate/up up to "
             f"{MAX_ROWS['gate_up_silu']} rows, q/k/v up to {MAX_ROWS['qkv']}, and the one-weight linears (plain, "
             f"bias, bias + GELU) only where named (up to {MAX_ROWS['linear']} rows). matmul_epilogue: "
             f"fusekit::matmul_epilogue's tiled GEMM for bias + GELU. Kind w8: int8 weight-only (`linear_w8` rules, "
             f"up to {MAX_ROWS_TMA['linear_w8']} rows), floor = the int8 weight's bytes; kind fp8: float8 dynamic per-row "
             f"(`linear_fp8` rules: x's quantization included; Inductor: its Triton quantization + aten._scaled_mm); kind fp8w: "
             f"float8 weight-only (`linear_fp8_weight` rules, up to {MAX_ROWS_TMA['linear_fp8_weight']} rows); op mma: the "
             f"mma.sync kernel (fp8: FUSEKIT_DECODE_FP8=mma, w8 and fp8w: FUSEKIT_DECODE_GEMM=old); "
             f"bf16: cuBLAS on a 16-bit weight of the same shape; CDT (w8, fp8w): Inductor and fusekit compiled with "
             f"coordinate_descent_tuning, as torchao's quantize_ sets it (at one row Inductor writes the mm as a mul + "
             f"sum reduction).", "",
             "| model | linear | kind | K x N | rows | eager | Inductor | fusekit (sites) | op | op mma | matmul_epilogue | "
             "bf16 | Inductor CDT | fusekit CDT | floor | op vs Inductor | op vs Inductor CDT | op % of floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cdt = (f"{r['inductor_cdt_ms'] * 1e3:.1f} | {r['fusekit_cdt_ms'] * 1e3:.1f}" if "inductor_cdt_ms" in r
               else "- | -")
        epilogue = f"{r['epilogue_ms'] * 1e3:.1f}" if "epilogue_ms" in r else "-"
        bf16 = f"{r['bf16_ms'] * 1e3:.1f}" if "bf16_ms" in r else "-"
        mma = f"{r['mma_ms'] * 1e3:.1f}" if "mma_ms" in r else "-"
        lines.append(f"| {r['model']} | {r['linear']} | {r['kind']} | {r['K']}x{r['N']} | {r['rows']} | "
                     f"{_us(r['eager_ms'])} | {_us(r['inductor_ms'])} | {r['fusekit_ms'] * 1e3:.1f} ({r['sites']}) | "
                     f"{r['op_ms'] * 1e3:.1f} | {mma} | {epilogue} | {bf16} | {cdt} | {r['floor_ms'] * 1e3:.1f} | "
                     f"{_ratio(r['inductor_ms'], r['op_ms'])} | {_ratio(r.get('inductor_cdt_ms'), r['op_ms'])} | "
                     f"{100 * r['floor_ms'] / r['op_ms']:.0f}% |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    keys = sorted({(r["model"], r["linear"]) for r in rows}, key=lambda t: [(r["model"], r["linear"]) for r in rows].index(t))
    counts = sorted({r["rows"] for r in rows})
    width = 0.8 / len(counts)
    for j, m in enumerate(counts):
        ys = [next(((r["inductor_ms"] or 0) / r["op_ms"] for r in rows if (r["model"], r["linear"]) == key
                    and r["rows"] == m), 0)
              for key in keys]
        ax.bar([i + j * width for i in range(len(keys))], ys, width, label=f"{m} rows")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], [f"{a}\n{b}" for a, b in keys], fontsize=8)
    ax.set_ylabel("speedup over Inductor (op)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    ap.add_argument("--models", default="llama,qwen2")
    ap.add_argument("--rows", default="1,8,16,32,64")
    ap.add_argument("--linears", default="", help="only these (names as in the table: q,k/v,q+k+v,o,gate+up,down,lm_head)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--int8-weights", action="store_true", help="the one-weight linears as int8 weight-only (w8a16)")
    ap.add_argument("--fp8", action="store_true", help="the one-weight linears as float8 dynamic per-row (torchao's)")
    ap.add_argument("--int8-dynamic", action="store_true", help="the one-weight linears as int8 dynamic activation + "
                                                                 "int8 weight (torchao's)")
    ap.add_argument("--fp8-weight", action="store_true", help="the one-weight linears as float8 weight-only (torchao's)")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(a.models.split(","), [int(r) for r in a.rows.split(",")], a.rounds, a.reps,
               set(a.linears.split(",")) if a.linears else None, quant="w8" if a.int8_weights else "fp8" if a.fp8 else "fp8w" if a.fp8_weight else "w8a8" if a.int8_dynamic else "")
    device = torch.cuda.get_device_name()
    (out / "decode_gemm.json").write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1))
    (out / "decode_gemm.md").write_text(markdown(rows, device))
    plot(rows, out / "decode_gemm.png")
    print(markdown(rows, device))


if __name__ == "__main__":
    main()

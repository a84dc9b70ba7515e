"""``fusekit profile``: a torch.profiler run of one model under eager, Inductor and fusekit. GPU time per
kernel grouped into categories, each category's share, compute- vs memory-bound for the top kernels
(FLOPs and bytes from the profiled ops' shapes, against a matmul and a copy ceiling measured on the spot),
optimization hints, peak memory, and a Chrome trace per backend."""
from __future__ import annotations

import json
import pathlib
import re
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from . import models
from .e2e import _compiled

# first match wins; kernel names (GPU) or op names (CPU)
CATEGORIES = [
    ("fusekit", r"fusekit"),
    ("attention", r"flash|fmha|attention|cudnn_generated|sdpa|_efficient_attention|scaled_dot"),
    ("gemm", r"gemm|cutlass|xmma|cublas|sm\d+_.*(tn|nt|nn|tt)|aten::(mm|addmm|bmm|matmul|linear|baddbmm)"),
    ("inductor: reduction/norm", r"^triton_(per|red)_"),
    ("inductor: elementwise", r"^triton_(poi|tem)_|^triton_|^cpp_fused"),
    ("norm", r"layer_norm|rms_?norm|group_norm|batch_norm"),
    ("reduction", r"reduce|softmax|_sum|amax|argmax|cumsum"),
    ("copy", r"copy|memcpy|memset|cat_|transpose|permute|contiguous|index|gather|scatter|embedding"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|aten::(add|mul|gelu|silu|tanh|exp|where|div|sub)"),
]
MEMORY_CATS = {"inductor: elementwise", "inductor: reduction/norm", "norm", "reduction", "copy", "elementwise"}


def category(name: str) -> str:
    for cat, rx in CATEGORIES:
        if re.search(rx, name, re.IGNORECASE):
            return cat
    return "other"


def ceilings() -> dict:
    """A large fp16 matmul's TFLOP/s and a device-to-device copy's GB/s, measured now."""
    from triton.testing import do_bench

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    tf = 2 * 8192**3 / do_bench(lambda: a @ a, warmup=10, rep=100, return_mode="median") / 1e9
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gbs = 2 * src.numel() / do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median") / 1e6
    return {"matmul_tflops": tf, "copy_gbps": gbs}


_SIZES = {"c10::Half": 2, "c10::BFloat16": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "bool": 1,
          "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1}


def _shape_bytes(evt: Any, default_size: int = 2) -> float:
    """Bytes of the recorded input shapes (averaged events carry no dtypes: `default_size` each)."""
    shapes = getattr(evt, "input_shapes", None) or []
    dtypes = list(getattr(evt, "input_dtypes", None) or [])
    total = 0.0
    for i, shp in enumerate(shapes):
        if shp and isinstance(shp, list) and all(isinstance(x, int) for x in shp):
            n = 1
            for x in shp:
                n *= x
            total += n * (_SIZES.get(str(dtypes[i]), default_size) if i < len(dtypes) else default_size)
    return total


def _attention_flops(name: str, shapes: Any) -> float | None:
    """4*B*H*Sq*Sk*D for an attention op with recorded q, k, v shapes (with_flops does not count SDPA)."""
    if ("attention" in name or "scaled_dot" in name) and shapes and len(shapes) >= 3 \
            and all(isinstance(x, list) and len(x) == 4 for x in shapes[:3]):
        b, h, sq, d = shapes[0]
        return 4.0 * b * h * sq * shapes[1][2] * d
    return None


def _roofline(flops: float, nbytes: float, seconds: float, ceil: dict) -> tuple[str, float]:
    """(compute|memory, fraction of the binding ceiling), by intensity against the ceilings' ridge point."""
    ridge = ceil["matmul_tflops"] * 1e12 / (ceil["copy_gbps"] * 1e9)
    if flops / nbytes > ridge:
        return "compute", flops / seconds / 1e12 / ceil["matmul_tflops"]
    return "memory", nbytes / seconds / 1e9 / ceil["copy_gbps"]


def _op_costs(prof: Any) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) per kernel name, from the nearest ATen/fusekit op above its launch (FLOPs from
    with_flops, bytes from the recorded input shapes; attention FLOPs from q/k shapes)."""
    costs: dict[str, tuple[float, float]] = {}
    for evt in prof.events():
        kernels = getattr(evt, "kernels", None) or []
        if not kernels:
            continue
        op = evt
        while op is not None and not (op.name.startswith(("aten::", "fusekit::")) and getattr(op, "input_shapes", None)):
            op = op.cpu_parent
        if op is None:
            continue
        flops = _attention_flops(op.name, op.input_shapes) or float(getattr(op, "flops", 0) or 0)
        nbytes = _shape_bytes(op)
        for k in kernels:
            f, by = costs.get(k.name, (0.0, 0.0))
            costs[k.name] = (f + flops / len(kernels), by + nbytes / len(kernels))
    return costs


def profile_model(name: str, out: pathlib.Path, modes=("eager", "inductor", "fusekit"), iters: int = 5,
                  top: int = 10, quant: str | None = None) -> dict:
    """`quant`: the model quantized by torchao first (models.QUANT; a GPU only, as in `fusekit bench`)."""
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model, inputs, desc = models.make(name, device)
    if quant and cuda:
        models.quantize(model, quant)
        desc = {**desc, "what": f"{desc['what']}, torchao {models.QUANT[quant]}"}
    out.mkdir(parents=True, exist_ok=True)
    ceil = ceilings() if cuda else None
    result: dict[str, Any] = {"model": desc, "ceilings": ceil, "modes": {}}
    print(f"fusekit profile: {desc['what']} {desc['dtype']} batch {desc['batch']} seq {desc['seq']} on "
          f"{torch.cuda.get_device_name() if cuda else 'CPU'}", flush=True)
    if ceil:
        print(f"ceilings measured now: matmul {ceil['matmul_tflops']:.0f} TFLOP/s, copy {ceil['copy_gbps']:.0f} GB/s")
    with torch.no_grad():
        for mode in modes:
            f = _compiled(mode, model, not cuda)
            for _ in range(3):
                f(**inputs)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts, record_shapes=True, with_flops=True) as prof:
                for _ in range(iters):
                    f(**inputs)
                if cuda:
                    torch.cuda.synchronize()
            trace = out / f"trace_{name}_{mode}.json"
            prof.export_chrome_trace(str(trace))
            result["modes"][mode] = _summarize(prof, cuda, iters, ceil, top,
                                               torch.finfo(getattr(torch, desc["dtype"])).bits // 8)
            result["modes"][mode]["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
            result["modes"][mode]["trace"] = str(trace)
            _print_mode(mode, result["modes"][mode])
            torch._dynamo.reset()
    (out / f"profile_{name}.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out / f'profile_{name}.json'} and Chrome traces {out}/trace_{name}_<mode>.json "
          "(open in chrome://tracing or ui.perfetto.dev)")
    return result


def _summarize(prof: Any, cuda: bool, iters: int, ceil: dict | None, top: int, elem_size: int = 2) -> dict:
    per_kernel: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for evt in prof.events():
        if cuda:
            if evt.device_type != torch.autograd.DeviceType.CUDA or evt.name.startswith(("## ", "Torch-Compiled")):
                continue  # kernels only (not the annotation ranges around a compiled graph)
            t = evt.device_time if hasattr(evt, "device_time") else evt.cuda_time
        else:  # CPU: self time of the ops and Inductor's C++ kernels (no double counting of wrappers)
            if not evt.name.startswith(("aten::", "fusekit::", "cpp_fused", "triton")):
                continue
            t = evt.self_cpu_time_total
        per_kernel[evt.name] += t / 1e3 / iters  # ms per forward
        calls[evt.name] += 1
    total = sum(per_kernel.values()) or 1e-9
    cats: dict[str, float] = defaultdict(float)
    for k, t in per_kernel.items():
        cats[category(k)] += t
    costs = _op_costs(prof) if cuda else {}
    tops = []
    for k, t in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]:
        cat = category(k)
        f, b = costs.get(k, (0.0, 0.0))
        f, b = f / iters, b / iters
        if f and b and ceil and cat in ("gemm", "attention", "fusekit"):  # a memset launched by an op has
            # that op's FLOPs attributed, not its own
            bound, util = _roofline(f, b, t / 1e3, ceil)
        else:  # no FLOPs: pointwise, norm, reduction and copy kernels move bytes
            bound, util = ("memory" if cat in MEMORY_CATS or cat == "fusekit" else "unknown"), None
        tops.append({"kernel": k, "category": cat, "ms": t, "share": t / total, "calls_per_fwd": calls[k] / iters,
                     "bound": bound, "ceiling_fraction": util,
                     "intensity_flop_per_byte": (f / b) if f and b else None})
    return {"gpu_ms_per_forward" if cuda else "cpu_ms_per_forward": total,
            "roofline_ops": _roofline_ops(prof, iters, ceil, elem_size=elem_size) if cuda else [],
            "categories": {c: {"ms": t, "share": t / total} for c, t in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top_kernels": tops, "hints": hints(cats, total, per_kernel, "GPU" if cuda else "CPU")}


def _roofline_ops(prof: Any, iters: int, ceil: dict | None, top: int = 6, elem_size: int = 2,
                  device_time: bool = True) -> list[dict]:
    """Ops with FLOPs (GEMMs, attention), grouped by input shape: arithmetic intensity against the ridge
    point of the ceilings measured now, and the fraction of the binding ceiling they reach."""
    if not ceil:
        return []
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        t = getattr(e, "device_time_total", 0) if device_time else e.cpu_time_total
        attn = _attention_flops(e.key, e.input_shapes)
        flops = attn * e.count if attn else float(getattr(e, "flops", 0) or 0)
        nbytes = _shape_bytes(e, elem_size) * e.count
        if not (t and flops and nbytes) or not e.key.startswith(("aten::", "fusekit::")):
            continue
        sec = t / 1e6
        bound, frac = _roofline(flops, nbytes, sec, ceil)
        rows.append({"op": e.key, "shapes": str(e.input_shapes)[:80], "ms": t / 1e3 / iters,
                     "tflops": flops / sec / 1e12, "intensity_flop_per_byte": flops / nbytes, "bound": bound,
                     "ceiling_fraction": frac})
    return sorted(rows, key=lambda r: -r["ms"])[:top]


def hints(cats: dict[str, float], total: float, per_kernel: dict[str, float], where: str = "GPU") -> list[str]:
    out = []
    mem = sum(t for c, t in cats.items() if c in MEMORY_CATS)
    if mem / total > 0.2:
        out.append(f"{100 * mem / total:.0f}% of {where} time is in memory-bound elementwise/norm/reduction/copy "
                   "kernels outside any fusekit pattern: look for chains fusekit does not match yet "
                   "(`fusekit explain` lists near misses)")
    ffma = sum(t for k, t in per_kernel.items() if re.search(r"f32f32.*ffma|sgemm", k))
    if ffma / total > 0.05:
        out.append(f"{100 * ffma / total:.0f}% of {where} time is fp32 GEMMs on FFMA cores: an attention decomposed "
                   "into math (fusekit's attention patterns take it to a fused kernel) or fp32 matmuls without TF32")
    if cats.get("copy", 0) / total > 0.1:
        out.append(f"{100 * cats['copy'] / total:.0f}% of {where} time is copies/transposes: check layouts "
                   "(head transposes before attention, .contiguous() calls)")
    if cats.get("gemm", 0) / total > 0.6:
        out.append(f"{100 * cats['gemm'] / total:.0f}% of {where} time is GEMMs: compute-bound; gains now come from "
                   "lower precision (FP8/INT8 weights) or GEMM epilogue fusion, not elementwise fusion")
    if cats.get("attention", 0) / total > 0.3:
        out.append(f"{100 * cats['attention'] / total:.0f}% of {where} time is attention: check the head dim and "
                   "that masks are not forcing a slower kernel")
    return out or [f"no category stands out; the {where} time is spread over many kernels"]


def _print_mode(mode: str, r: dict) -> None:
    key = "gpu_ms_per_forward" if "gpu_ms_per_forward" in r else "cpu_ms_per_forward"
    print(f"\n== {mode}: {r[key]:.3f} ms of {'GPU' if key.startswith('gpu') else 'CPU'} time per forward"
          + (f", peak {r['peak_mib']:,.0f} MiB" if r.get("peak_mib") else ""))
    for c, v in r["categories"].items():
        print(f"  {c:26s} {v['ms']:8.3f} ms  {100 * v['share']:5.1f}%")
    print("  top kernels:")
    for t in r["top_kernels"]:
        frac = "" if t["ceiling_fraction"] is None else f" at {100 * t['ceiling_fraction']:.0f}% of its ceiling"
        print(f"    {t['ms']:7.3f} ms {100 * t['share']:5.1f}%  {t['category']:24s} {t['bound']}-bound{frac}  "
              f"{t['kernel'][:90]}")
    if r.get("roofline_ops"):
        print("  ops with FLOPs (roofline vs the ceilings measured now):")
        for o in r["roofline_ops"]:
            print(f"    {o['ms']:7.3f} ms  {o['op']:32s} {o['tflops']:6.1f} TFLOP/s  {o['intensity_flop_per_byte']:7.1f} "
                  f"FLOP/B  {o['bound']}-bound at {100 * o['ceiling_fraction']:.0f}% of its ceiling  {o['shapes']}")
    print("  hints:")
    for h in r["hints"]:
        print(f"    - {h}")

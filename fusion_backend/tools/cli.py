"""The ``fusekit`` command: bench, profile, explain, doctor.

    fusekit bench   [--phase prefill|decode|both] [--models gpt2,llama,...] [--modes ...] [--batch N --seq N] [--out DIR]
    fusekit bench   --phase decode|prefill|both --tp 1,2 [--models llama,qwen2] [--batches 1,32] [--batch 4 --seq 512]
    fusekit profile --model bert [--out DIR]
    fusekit profile --phase decode --model llama,mistral [--batches 1,32] [--position 1024]
    fusekit explain --model gpt2
    fusekit doctor
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import torch


def _dtype(s: str | None) -> torch.dtype | None:
    return getattr(torch, s) if s else None


BENCH_DESCRIPTION = """\
On a GPU: the end-to-end benchmark of the real models, prefill (eager / Inductor / fusekit, each compiler with and
without CUDA graphs) and decode steps against a StaticCache (and generate), timed against Inductor.

Without a GPU (or with --cpu): a flow check, not a benchmark. Tiny configurations of the same models are
compiled with fusekit and options={"cpu_reference": True}, where each fused op runs its Python reference
implementation (not meant to be fast). Per model and phase it reports the fusekit sites that fire, errors, near
misses and the output (decode: the logits) against eager; nothing is timed. The default run takes about 1.5
minutes of CPU time (2 the first time, which traces fusekit's patterns), on one core: more on a busy machine.

Writes bench.md, bench.json, bench.png (prefill) and decode.md, decode.json, decode.png (decode) into --out."""


def cmd_bench(a: argparse.Namespace) -> int:
    from . import e2e, models

    names = a.models.split(",") if a.models else list(models.DEFAULT)
    modes = tuple(a.modes.split(",")) if a.modes else e2e.MODES
    bad = [m for m in names if m not in models.MODELS] + [m for m in modes if m not in e2e.MODES]
    if bad:
        print(f"unknown model/mode {bad}; models: {list(models.MODELS)}, modes: {list(e2e.MODES)}", file=sys.stderr)
        return 2
    ints = lambda s: tuple(int(x) for x in s.split(",")) if s else None  # noqa: E731
    grad_modes = e2e.GRAD_MODES if a.grad_mode == "both" else (a.grad_mode,)
    phases = ("prefill", "decode") if a.phase == "both" else (a.phase,)
    enable = tuple(a.enable.split(",")) if a.enable else ()
    if a.ablate and not a.tp and a.phase != "decode":
        print("--ablate goes with --tp or --phase decode", file=sys.stderr)
        return 2
    if a.tp:
        from . import tp_bench

        if a.quant or enable:
            print("--tp runs without --quant or --enable", file=sys.stderr)
            return 2
        positions = ints(a.positions)
        tp_bench.bench(names, pathlib.Path(a.out), ints(a.tp), ints(a.batches), positions[0] if positions else None,
                       tuple(a.ablate.split(",")) if a.ablate else (), tuple(reversed(phases)), a.batch, a.seq)
        return 0
    if a.cpu or not torch.cuda.is_available():
        # no GPU: a flow check with the reference implementations (flow.py), nothing timed
        from . import flow

        ignored = [f"--{k.replace('_', '-')}" for k in ("modes", "gen_cache", "enable", "quant", "ablate")
                   if getattr(a, k)]
        if ignored:
            print(f"note: {', '.join(ignored)} only apply on a GPU; the CPU flow check runs eager and fusekit",
                  file=sys.stderr)
        flow.bench(names, pathlib.Path(a.out), phases, _dtype(a.dtype), a.batch, a.seq, grad_modes, ints(a.batches),
                   ints(a.positions), a.generate, log=lambda s: print(s, flush=True))
        return 0
    if "prefill" in phases:
        e2e.bench(names, modes, pathlib.Path(a.out), None, _dtype(a.dtype), a.batch, a.seq, grad_modes, a.quant,
                  enable)
    if "decode" in phases:
        from . import decode_bench

        gen_caches = tuple(None if x == "auto" else int(x) for x in a.gen_cache.split(",")) if a.gen_cache else None
        decode_bench.bench(names, pathlib.Path(a.out), None, ints(a.batches), ints(a.positions),
                           generate=a.generate, gen_caches=gen_caches, enable=enable, quant=a.quant,
                           ablate=tuple(a.ablate.split(",")) if a.ablate else ())
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    if a.phase == "decode":
        from . import step_profile

        split = lambda s: tuple(s.split(",")) if s else ()  # noqa: E731
        batches = tuple(int(x) for x in split(a.batches)) or (1, 32)
        step_profile.bench(list(split(a.model or "llama")), batches, a.position, pathlib.Path(a.out),
                           split(a.enable), split(a.disable))
        return 0
    from . import profile

    if a.quant and not torch.cuda.is_available():
        print("note: --quant only applies on a GPU; the CPU profile runs the model unquantized")
    profile.profile_model(a.model or "bert", pathlib.Path(a.out), iters=a.iters, quant=a.quant)
    return 0


def cmd_explain(a: argparse.Namespace) -> int:
    from . import models
    from ..report import explain

    cuda = torch.cuda.is_available() and not a.cpu
    model, inputs, desc = models.make(a.model, "cuda" if cuda else "cpu", _dtype(a.dtype), a.batch, a.seq)
    print(f"{desc['what']} {desc['dtype']} batch {desc['batch']} seq {desc['seq']} on {'CUDA' if cuda else 'CPU'}")
    with torch.no_grad():
        rep = explain(model, **inputs, options=None if cuda else {"cpu_reference": True})
    print(rep)
    return 0


DOCTOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8)
# A rule whose CUDA default depends on the kernels built (Pattern.cuda_default, a predicate of the arch), shown for an
# sm_90 GPU without one here: on with the sm_90a build, opt-in with other builds.
SM90A_ONLY = ("on (sm_90a)", "on where fusekit's sm_90a kernels are built (H100/H200); opt-in with other GPUs' builds")


def _op_dtype_missing(p, dtype: torch.dtype) -> str | None:
    """Why fusekit::op has no CUDA kernel for `dtype` (its rules also take dtypes that only run on CPU), or None."""
    from .. import ops

    return None if ops.cuda_kernel_takes(p.op, dtype) else f"fusekit::{p.op} has no CUDA kernel for {str(dtype)[6:]}"


def _cell_here(p, dtype: torch.dtype, device: torch.device) -> tuple[str, str | None]:
    """(cell, why no kernel) for rule `p` in `dtype` on this machine's GPU: what the pass's device guard decides."""
    from .. import _ext

    if dtype not in p.dtypes:
        return "-", None
    why = _ext.missing_cuda_kernel(p.op, device) or _op_dtype_missing(p, dtype)
    if why:
        return "no-kernel", why
    if not p.on_by_default(dtype, _ext.kernel_arch(p.op, device)):
        return "opt-in", None
    return ("on*" if p.min_numel(dtype) else "on"), None


def _not_built(op: str, skipped: dict[str, str]) -> str | None:
    """'family/op.cu: why' where fusekit::op's kernel file is among `skipped` (_ext.skipped: not built, and why)."""
    return next((f"{f}: {w}" for f, w in skipped.items() if f.endswith(f"/{op}.cu")), None)


def _cell_sm90(p, dtype: torch.dtype, skipped: dict[str, str]) -> tuple[str, str | None]:
    """(cell, why no kernel) for rule `p` in `dtype` on an sm_90 GPU (H100/H200) with the kernels that this install
    builds for sm_90a (`skipped`: the kernel files it cannot build, and why): the rule's measured policy."""
    if dtype not in p.dtypes:
        return "-", None
    why = _not_built(p.op, skipped) or _op_dtype_missing(p, dtype)
    if why:
        return "no-kernel", why
    if not p.on_by_default(dtype, "9.0a"):
        return "opt-in", None
    if not p.on_by_default(dtype, "8.0"):
        return SM90A_ONLY[0], None
    return ("on*" if p.min_numel(dtype) else "on"), None


def doctor_text() -> str:
    from .. import _ext, table

    lines = [f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: CPU build'})"]
    try:
        import triton
        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed (Inductor's GPU code generation needs it)")
    cuda = torch.cuda.is_available()
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        lines.append(f"GPU: {torch.cuda.get_device_name()} (compute capability {major}.{minor}, "
                     f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs)")
        st = _ext.load_for_device()
        where = f"loaded from {st.path}" if st.loaded else f"NOT available: {st.reason}"
        lines.append(f"kernels for sm_{_ext.device_arch().replace('.', '')}: {where}")
    else:
        lines.append("GPU: none (the table below: what would fire on an sm_90 GPU, H100/H200; on this CPU the rules run "
                     "only as references)")
    from shutil import which
    lines.append(f"nvcc: {which('nvcc') or 'not found (needed once, to build the kernels)'}")
    inc = _ext.cutlass_include()
    lines.append(f"CUTLASS headers: {inc[0] if inc else 'not found (pip install fusekit[cuda]: the matmul epilogue kernels need them)'}")
    lines.append("")
    patterns = table.all_patterns()
    if cuda:
        dev = torch.device("cuda", torch.cuda.current_device())
        lines.append(f"what fires on this GPU ({torch.cuda.get_device_name()}, sm_{_ext.device_arch().replace('.', '')}"
                     f"), per rule and dtype:")
        cell = lambda p, d: _cell_here(p, d, dev)  # noqa: E731
    else:
        skipped = _ext.skipped("9.0a")
        lines.append("no GPU here: what would fire by default on an sm_90 GPU (H100/H200), per rule and dtype, with the "
                     "kernels this install builds for sm_90a:")
        cell = lambda p, d: _cell_sm90(p, d, skipped)  # noqa: E731
    w = max(len(p.id) for p in patterns)
    cw = 11
    lines.append(f"{'pattern':{w}s} " + " ".join(f"{str(d)[6:]:>{cw}s}" for d in DOCTOR_DTYPES))
    no_kernel: dict[tuple[str, str], list[str]] = {}
    used: set[str] = set()
    for p in patterns:
        cells = []
        for d in DOCTOR_DTYPES:
            c, why = cell(p, d)
            cells.append(c)
            used.add(c)
            if why:
                no_kernel.setdefault((p.op, why), [])
                if p.id not in no_kernel[(p.op, why)]:
                    no_kernel[(p.op, why)].append(p.id)
        lines.append(f"{p.id:{w}s} " + " ".join(f"{c:>{cw}s}" for c in cells))
    lines.append("")
    legend = ["on = fires by default",
              "opt-in = measured slower than Inductor there: enable with options={'enable': [id]}",
              "no-kernel = cannot fire: no kernel built for this GPU/dtype (why: below)",
              "- = dtype not supported"]
    if "on*" in used:
        legend.insert(1, "on* = by default from a size up (below it Inductor's kernels measured faster; a rule named "
                         "in options['patterns'] fires at any size)")
    if SM90A_ONLY[0] in used:
        legend.insert(1, f"{SM90A_ONLY[0]} = {SM90A_ONLY[1]}")
    lines += legend
    if no_kernel:
        lines.append("no-kernel, why:")
        family = lambda i: i.split(".", 1)[0]  # noqa: E731
        sizes = {f: sum(family(p.id) == f for p in patterns) for f in {family(p.id) for p in patterns}}
        for (op, why), ids in no_kernel.items():
            whole = {f for f in map(family, ids) if sum(family(i) == f for i in ids) == sizes[f]}
            named = [f"{f}.* ({sizes[f]} rules)" for f in sorted(whole)] + [i for i in ids if family(i) not in whole]
            lines.append(f"  {', '.join(named)}: {why}")
    from ..patterns import LIMITS

    lines += _rewrites_text(cuda)
    lines.append("limits (these sites stay Inductor's):")
    lines += [f"  {line}" for line in LIMITS]
    if not cuda:
        lines.append("this machine: every rule, in every dtype it takes, runs on CPU with options={'cpu_reference': "
                     "True}, as a reference implementation (to check the flow: `fusekit bench`), not for speed")
    return "\n".join(lines)


def _rewrites_text(cuda: bool) -> list[str]:
    """The graph rewrites that are not table rules (a graph input mutated in place, collectives): each on by default,
    what it needs, and whether its kernel is there (this GPU's, else the sm_90a build's)."""
    from .. import _ext, collectives, kv_cache, lowered

    rows = [(kv_cache.RULE, kv_cache.KERNEL, "a full sliding window's roll, in place (any 1/2/4-byte cache dtype)"),
            (kv_cache.READER_RULE, "decode_attention_roll", "a layer's two rolls and its decode attention in one "
             "pass over the window (fp16/bf16)"),
            (kv_cache.COUNTERS_RULE, None, "the caches' per-layer length counters advanced in one launch (Inductor's "
             "foreach kernel), not one each"),
            (lowered.WOQ_RULE, None, "an int8 weight-only linear no rule took, as torchao's mm of the widened weight "
             "(Inductor's kernel for it is untiled on CUDA)"),
            (collectives.RULE, None, "tensor-parallel all-reduce of <= 256 KB as torch's one-shot over symmetric "
             "memory (bf16, fp32; every rank on this host)"),
            (collectives.NORM_RULE, collectives.KERNELS[0], "that all-reduce + residual add + RMSNorm in one kernel")]
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else None
    skipped = _ext.skipped("9.0a")
    out = ["graph rewrites outside the tables (on by default; off with options={'disable': [id or family]}):"]
    for rule, op, what in rows:
        if op is None:
            state = "on"
        elif cuda:
            why = _ext.missing_cuda_kernel(op, dev)
            state = "on" if why is None else f"no-kernel ({why})"
        else:
            why = _not_built(op, skipped)
            state = "on (sm_90a)" if why is None else f"no-kernel ({why})"
        out.append(f"  {rule:36s} {state:12s} {what}")
    return out + [""]


def cmd_doctor(a: argparse.Namespace) -> int:
    print(doctor_text())
    return 0


def parser() -> argparse.ArgumentParser:
    from . import models

    ap = argparse.ArgumentParser(prog="fusekit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="end-to-end transformer benchmark on a GPU (eager / Inductor / fusekit); "
                       "without one, a flow check on CPU (nothing timed)", description=BENCH_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--models", default=None, help="comma-separated of " + ", ".join(models.MODELS) + " (default: "
                   + ", ".join(models.DEFAULT) + ")")
    b.add_argument("--modes", default=None, help="GPU: comma-separated of eager,inductor,inductor-ro,fusekit,"
                   "fusekit-ro (-ro: mode='reduce-overhead', CUDA graphs; default: all); the CPU flow check runs eager "
                   "and fusekit")
    b.add_argument("--batch", type=int, default=None)
    b.add_argument("--seq", type=int, default=None)
    b.add_argument("--dtype", default=None, help="float16 / bfloat16 (default: per model on a GPU, float32 on CPU)")
    b.add_argument("--cpu", action="store_true", help="the CPU flow check (tiny configurations, reference "
                   "implementations, nothing timed) even with a GPU")
    b.add_argument("--grad-mode", default="inference", choices=("inference", "no_grad", "both"),
                   help="prefill: torch.inference_mode() (serving code's usual mode), no_grad, or both")
    b.add_argument("--phase", default="both", choices=("prefill", "decode", "both"),
                   help="prefill (whole prompts), decode (one step against a StaticCache, and generate), or both")
    b.add_argument("--batches", default=None, help="decode: comma-separated batch sizes (GPU default 1,8,32,64; "
                   "CPU 2)")
    b.add_argument("--positions", default=None, help="decode: comma-separated cache positions (GPU default "
                   "128,1024,2048,4000 of 4096 slots; CPU 8,40 of 64)")
    b.add_argument("--generate", action=argparse.BooleanOptionalAction, default=None,
                   help="decode: also run model.generate, timed on a GPU (default there), its tokens checked against "
                   "eager's on CPU (default: off there)")
    b.add_argument("--gen-cache", default=None, help="decode, GPU: comma-separated static cache sizes for generate; "
                   "auto = prompt + new, transformers' own (default auto,4096)")
    b.add_argument("--enable", default=None, help="comma-separated opt-in rule ids fusekit also fires "
                   "(options={'enable': [...]}), e.g. decode.mha, quantize.silu_mul_fp8_rows")
    b.add_argument("--quant", default=None,
                   choices=("int8-weight-only", "int8-dynamic", "fp8-rowwise", "fp8-weight-only"),
                   help="GPU, decode and prefill: the model quantized with torchao first (pip install fusekit[quant]); "
                        "int8-weight-only: Int8WeightOnlyConfig; int8-dynamic: Int8DynamicActivationInt8WeightConfig "
                        "(its linears fused with x's quantization up to 32 rows); fp8-rowwise: "
                        "Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), sm_89+; fp8-weight-only: "
                        "Float8WeightOnlyConfig (e4m3 weights dequantized inside the decode GEMM)")
    b.add_argument("--tp", default=None, help="comma-separated tensor-parallel sizes (transformers' "
                   "tp_plan='auto', one process a GPU; 1 = unsharded), e.g. 1,2: Inductor vs fusekit per size and "
                   "batch, decode steps (GPU default batches 1,32, position 1024) and a prefill (--batch x --seq, "
                   "GPU default 4 x 512) as --phase says; without a GPU the tiny models over gloo, rules and logits "
                   "checked. Writes tp.md/.json/.png")
    b.add_argument("--ablate", default=None, help="--tp, or --phase decode on one GPU (--quant too): "
                   "comma-separated rule ids; each also timed as fusekit with that rule off "
                   "(options={'disable': [id]}), e.g. collective.all_reduce_add_rms_norm; ids joined by '+' are off "
                   "together")
    b.add_argument("--out", default="fusekit_bench", help="folder for bench.md/.json/.png and decode.md/.json/.png "
                   "(default: fusekit_bench)")
    b.set_defaults(fn=cmd_bench)
    p = sub.add_parser("profile", help="torch.profiler report of one model under eager, Inductor, fusekit")
    p.add_argument("--model", default=None, help="default: bert (prefill), llama (decode)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", default="fusekit_profile", help="default: fusekit_profile")
    p.add_argument("--phase", default="prefill", choices=("prefill", "decode"),
                   help="decode (GPU): a decode step's kernels under CUDA graphs, Inductor and fusekit: per kernel, per "
                   "layer, launch gaps (--model takes a comma-separated list there)")
    p.add_argument("--batches", default=None, help="decode: comma-separated batch sizes (default 1,32)")
    p.add_argument("--position", type=int, default=1024, help="decode: cache position of 4096 slots (default 1024)")
    p.add_argument("--enable", default=None, help="decode: comma-separated opt-in rule ids fusekit also fires")
    p.add_argument("--disable", default=None, help="decode: comma-separated rule ids (or families) fusekit leaves off")
    p.add_argument("--quant", default=None, choices=tuple(models.QUANT),
                   help="prefill, GPU: the model quantized by torchao first (as in fusekit bench --quant)")
    p.set_defaults(fn=cmd_profile)
    e = sub.add_parser("explain", help="fusekit's match report for a named model")
    e.add_argument("--model", default="gpt2")
    e.add_argument("--batch", type=int, default=None)
    e.add_argument("--seq", type=int, default=None)
    e.add_argument("--dtype", default=None)
    e.add_argument("--cpu", action="store_true")
    e.set_defaults(fn=cmd_explain)
    d = sub.add_parser("doctor", help="GPU, versions, kernels, and the patterns available per dtype")
    d.set_defaults(fn=cmd_doctor)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except BrokenPipeError:  # the reader left early (`fusekit doctor | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail
        return 0


if __name__ == "__main__":
    sys.exit(main())

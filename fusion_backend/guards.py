"""Guards: named checks on a match, run before a site is rewritten.

A guard returns None when the site is fine, or a short reason; the first failing guard stops the
rewrite and becomes a near miss in the report (pattern, site, guard, reason). Every pattern gets the
dtype, device and scalar guards; the table adds shape, stride and contiguity guards.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import Tensor
from torch._inductor import pattern_matcher as pm

from . import _ext, ops
from .stats import active_run

if TYPE_CHECKING:
    from .registry import Pattern


@dataclasses.dataclass(frozen=True)
class Guard:
    name: str
    check: Callable[["Site"], str | None]
    quiet: bool = False  # a structural mismatch (not this pattern at all): not reported as a near miss


class Site:
    """A candidate match, with each argument's value (a FakeTensor or a Python scalar)."""

    def __init__(self, match: pm.Match, run: Any) -> None:
        self.match, self.run = match, run

    def arg(self, name: str) -> Any:
        v = self.match.kwargs[name]
        return v.meta.get("val") if isinstance(v, torch.fx.Node) else v

    def tensor(self, name: str) -> Tensor:
        return self.arg(name)


# ---- guard constructors ------------------------------------------------------------------------
def contiguous(*names: str) -> Guard:
    def check(s: Site) -> str | None:
        for n in names:
            t = s.tensor(n)
            if not t.is_contiguous():
                return f"{n} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()})"
        return None

    return Guard(f"contiguous({', '.join(names)})", check)


def same_shape(*names: str) -> Guard:
    """Provably one shape (symbolic sizes included: SymInts are compared, never hashed)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    def check(s: Site) -> str | None:
        shapes = {n: tuple(s.tensor(n).shape) for n in names}
        first = shapes[names[0]]
        if all(len(v) == len(first) and all(known(a == b) for a, b in zip(v, first)) for v in shapes.values()):
            return None
        return f"shapes differ: {shapes}"

    return Guard(f"same_shape({', '.join(names)})", check)


def same_dtype(*names: str) -> Guard:
    def check(s: Site) -> str | None:
        dts = {n: s.tensor(n).dtype for n in names}
        return None if len(set(dts.values())) == 1 else f"dtypes differ: {dts}"

    return Guard(f"same_dtype({', '.join(names)})", check)


def last_dim_vector(name: str, of: str) -> Guard:
    """`name` is a 1-D vector broadcast along the last dimension of `of` (a bias)."""
    def check(s: Site) -> str | None:
        b, x = s.tensor(name), s.tensor(of)
        if b.dim() != 1 or b.shape[0] != x.shape[-1]:
            return f"{name} has shape {tuple(b.shape)}, want [{x.shape[-1]}]"
        return None

    return Guard(f"last_dim_vector({name}, {of})", check)


def float32(*names: str) -> Guard:
    def check(s: Site) -> str | None:
        bad = {n: str(s.tensor(n).dtype) for n in names if s.tensor(n).dtype != torch.float32}
        return f"not float32: {bad}" if bad else None

    return Guard(f"float32({', '.join(names)})", check)


def channel_params(x: str, *names: str, per_row: bool) -> Guard:
    """Per-channel parameters of a 2-D `x` [M, N]: all [M, 1] (per row) or all [N] (per column)."""
    def check(s: Site) -> str | None:
        xs = tuple(s.tensor(x).shape)
        shapes = {n: tuple(s.tensor(n).shape) for n in names}
        want = ((xs[0], 1) if per_row else (xs[-1],)) if xs else None
        from torch.fx.experimental.symbolic_shapes import statically_known_true as known

        if len(xs) == 2 and all(len(v) == len(want) and all(known(a == b) for a, b in zip(v, want))
                                for v in shapes.values()):
            return None
        return f"{x} {xs} with {shapes}: want all {'[M, 1]' if per_row else '[N]'}"

    return Guard(f"channel_params({x}; {', '.join(names)}; {'rows' if per_row else 'columns'})", check)


def ndim(name: str, n: int) -> Guard:
    def check(s: Site) -> str | None:
        d = s.tensor(name).dim()
        return None if d == n else f"{name} has {d} dims, want {n}"

    return Guard(f"ndim({name}=={n})", check)


def int8_range(lo: str, hi: str) -> Guard:
    def check(s: Site) -> str | None:
        a, b = s.arg(lo), s.arg(hi)
        return None if -128 <= a <= b <= 127 else f"[{a}, {b}] is not inside [-128, 127]"

    return Guard(f"int8_range({lo}, {hi})", check)


def attention_inputs(q: str, k: str, v: str, mask: str | None = None) -> Guard:
    """q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,D] with D % 8 == 0 and D <= 256 and unit last-dim stride
    (what PyTorch's fused SDPA kernels take); a mask is bool or q's dtype and broadcasts to
    [B,H,Sq,Sk]. Sizes must be provably equal (symbolic sizes too)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    def check(s: Site) -> str | None:
        tq, tk, tv = s.tensor(q), s.tensor(k), s.tensor(v)
        if not (tq.dim() == tk.dim() == tv.dim() == 4):
            return f"{q}, {k}, {v} must be 4-D [B, H, S, D]: {tq.dim()}, {tk.dim()}, {tv.dim()} dims"
        if not (tq.dtype == tk.dtype == tv.dtype):
            return f"dtypes differ: {tq.dtype}, {tk.dtype}, {tv.dtype}"
        same = [(tq.shape[0], tk.shape[0]), (tq.shape[0], tv.shape[0]), (tq.shape[1], tk.shape[1]),
                (tq.shape[1], tv.shape[1]), (tk.shape[2], tv.shape[2]), (tq.shape[3], tk.shape[3]),
                (tq.shape[3], tv.shape[3])]
        if not all(known(a == b) for a, b in same):
            return (f"shapes do not line up as [B,H,Sq,D], [B,H,Sk,D], [B,H,Sk,D]: {tuple(tq.shape)}, "
                    f"{tuple(tk.shape)}, {tuple(tv.shape)}")
        if not (known(tq.shape[2] > 0) and known(tk.shape[2] > 0)):
            return "empty query or key sequence"
        d = tq.shape[3]
        if not (known(d % 8 == 0) and known(d <= 256) and known(d > 0)):
            return f"head dim {d} is not a multiple of 8 in [8, 256]"
        if not all(known(t.stride(-1) == 1) for t in (tq, tk, tv)):
            return f"last-dim stride is not 1: {tq.stride()}, {tk.stride()}, {tv.stride()}"
        if mask is not None:
            m = s.tensor(mask)
            if m.dtype not in (torch.bool, tq.dtype):
                return f"{mask} is {m.dtype}; want bool or {tq.dtype}"
            full = (tq.shape[0], tq.shape[1], tq.shape[2], tk.shape[2])
            if m.dim() > 4 or not all(known(a == 1) or known(a == b)
                                      for a, b in zip(reversed(m.shape), reversed(full))):
                return f"{mask} {tuple(m.shape)} does not broadcast to [B,H,Sq,Sk] {full}"
        return None

    return Guard(f"attention_inputs({q}, {k}, {v}{', ' + mask if mask else ''})", check)


def matmul_operands(a: str, b: str, bias: str | None = None, residual: str | None = None,
                    linear: bool = False) -> Guard:
    """What the TMA GEMM of fusekit::matmul_epilogue reads (csrc/matmul_epilogue.cu): a [L, M, K] /
    [.., M, K] with a unit last stride, b [L, K, N] / [K, N] ([.., N, K] when `linear`) with a unit
    stride in one of its last two dims (4-D and up: a and b share leading dims that merge into one L),
    K and N multiples of 8, every other stride and storage offset a
    multiple of 8 elements (16 bytes), a contiguous bias [N] and a residual shaped like the output with a
    unit last stride. Sizes and strides must be plain ints here (a symbolic one: no rewrite)."""
    def ints(*vals: Any) -> bool:
        return all(isinstance(v, int) for v in vals)

    def aligned(t: Tensor, skip: int) -> bool:  # strides except the unit one (index `skip`), and offset
        return all(st % 8 == 0 and st > 0 for i, st in enumerate(t.stride()) if i != skip % t.dim()
                   and t.shape[i] > 1) and t.storage_offset() % 8 == 0

    def merges(t: Tensor) -> bool:  # the dims before the last two are viewable as one (4-D and up)
        lead = [(n, st) for n, st in zip(t.shape[:-2], t.stride()[:-2]) if n != 1]
        return all(st == st2 * n2 for (_, st), (n2, st2) in zip(lead, lead[1:]))

    def check(s: Site) -> str | None:
        ta, tb = s.tensor(a), s.tensor(b)
        if not ints(*ta.shape, *tb.shape, *ta.stride(), *tb.stride(), ta.storage_offset(), tb.storage_offset()):
            return "symbolic sizes or strides"
        bt = tb.transpose(-1, -2) if linear else tb
        if bt.dim() >= 3:
            if ta.dim() != bt.dim() or tuple(ta.shape[:-2]) != tuple(bt.shape[:-2]):
                return (f"batched {a} {tuple(ta.shape)} and {b} {tuple(tb.shape)} are not [..., M, K] @ "
                        f"[..., K, N] with the same leading dims")
            if not (merges(ta) and merges(bt)):
                return (f"the leading dims of {a} (strides {ta.stride()}) or {b} (strides {tb.stride()}) are "
                        f"not viewable as one batch dim")
        elif bt.dim() != 2 or ta.dim() < 2:
            return f"{a} {tuple(ta.shape)} @ {b} {tuple(tb.shape)}: want 2-D or 3-D operands"
        k, n = bt.shape[-2], bt.shape[-1]
        if k % 8 or n % 8 or k == 0:
            return f"K={k} and N={n} must be positive multiples of 8 (16-byte rows for TMA)"
        if ta.stride(-1) != 1 or not aligned(ta, -1):
            return f"{a} needs a unit last stride and 16-byte strides; strides {ta.stride()}"
        if ta.dim() > 2 and bt.dim() == 2 and not ta.is_contiguous():
            return f"{a} {tuple(ta.shape)} with a 2-D weight must be contiguous (rows flattened into M)"
        unit = -1 if bt.stride(-1) == 1 else -2 if bt.stride(-2) == 1 else None
        if unit is None or not aligned(bt, unit):
            return f"{b} needs a unit stride in one of its last two dims and 16-byte strides; strides {tb.stride()}"
        out = (*ta.shape[:-1], n)
        if bias is not None:
            tbias = s.tensor(bias)
            if tuple(tbias.shape) != (n,) or tbias.stride(0) != 1 or tbias.storage_offset() % 8:
                return f"{bias} {tuple(tbias.shape)} must be a contiguous [{n}] vector"
        if residual is not None:
            r = s.tensor(residual)
            if not ints(*r.shape, *r.stride(), r.storage_offset()) or tuple(r.shape) != out:
                return f"{residual} {tuple(r.shape)} must be shaped like the output {out}"
            if r.stride(-1) != 1 or not aligned(r, -1) or (r.dim() > 2 and bt.dim() == 2 and not r.is_contiguous()):
                return f"{residual} needs a unit last stride and 16-byte strides; strides {r.stride()}"
        return None

    return Guard(f"matmul_operands({a}, {b}{', ' + bias if bias else ''}{', ' + residual if residual else ''})",
                 check)


def tf32_enabled() -> bool:
    """Whether fp32 CUDA matmuls may use TF32 (torch.set_float32_matmul_precision("high"), the legacy
    torch.backends.cuda.matmul.allow_tf32 = True, or fp32_precision = "tf32"). Dynamo guards this state:
    flipping it recompiles, so a compiled graph never keeps TF32 after it is turned off."""
    m = torch.backends.cuda.matmul
    prec = getattr(m, "fp32_precision", None)  # every setter updates it (torch >= 2.9)
    return prec == "tf32" if prec is not None else bool(m.allow_tf32)


@contextlib.contextmanager
def fp32_matmul_precision(prec: str) -> Iterator[None]:
    """torch.backends.cuda.matmul.fp32_precision set to `prec` ("tf32" or "ieee") inside the block."""
    m = torch.backends.cuda.matmul
    old, m.fp32_precision = m.fp32_precision, prec
    try:
        yield
    finally:
        m.fp32_precision = old


def tf32_allowed(a: str, b: str, linear: bool = False) -> Guard:
    """An fp32 matmul rule fires only where TF32 is allowed (on CUDA its kernel runs on TF32 tensor cores,
    which full-fp32 matmuls do not; on CPU, where the op is the fp32 reference, the rule keeps the same
    condition so that a graph fuses alike on both). On CUDA b must also be K-major (a linear weight [N, K],
    k.transpose(-1, -2)): TF32 wgmma reads K-major operands only, and the op's copy of an N-major b measured
    slower than Inductor (H200: 0.64x at 1024^3; benchmarks/NOTES.md)."""
    def check(s: Site) -> str | None:
        t = s.tensor(a)
        if t.dtype != torch.float32:
            return None
        if not tf32_enabled():
            return ("float32 without TF32 (torch.backends.cuda.matmul.fp32_precision is not 'tf32'): the GEMM "
                    "would lose precision; the fp32 matmul stays with Inductor")
        tb = s.tensor(b)
        k_dim = -1 if linear else -2  # b's K dim: [.., N, K] weight, or [.., K, N]
        if t.device.type == "cuda" and tb.stride(k_dim) != 1 and tb.shape[k_dim] != 1:
            return f"float32 (TF32) needs a K-major {b} (unit stride along K); strides {tb.stride()}"
        return None

    return Guard(f"tf32_allowed({a}, {b})", check)


def matmul_heavy_epilogue_k(b: str, linear: bool = False, low: int = 128, high: int = 1024,
                            top: int = 4096) -> Guard:
    """Measured selection for GELU (erf and tanh)/SiLU epilogues (benchmarks/results/h200_matmul.md): with
    low < K < high and N > 64 the epilogue's transcendental math neither hides under the GEMM (cooperative
    schedule) nor costs less than Inductor's separate pointwise kernel: 0.96-0.98x at K = 768 (erf), 0.99x
    for GPT-2 end to end (tanh: 1.08x alone, but no faster than cuBLAS's addmm + gelu_new in the model). From K = top
    on, the GEMM's main loop trails cuBLAS's by about what the fused epilogue saves: 8x4096^3 measured
    0.94-0.97x in one run, 1.02-1.04x in another. Short K (1.2-1.8x), N <= 64 (1.18-1.25x) and
    high <= K < top (ping-pong; 1.09-1.34x at K = 1024-2048) fire."""
    def check(s: Site) -> str | None:
        tb = s.tensor(b)
        k, n = (tb.shape[-1], tb.shape[-2]) if linear else (tb.shape[-2], tb.shape[-1])
        if not (isinstance(k, int) and isinstance(n, int)) or n <= 64:
            return None
        if low < k < high:
            where = f"in ({low}, {high})"
        elif k >= top:
            where = f">= {top}"
        else:
            return None
        return f"K={k} {where} with N={n} > 64: this epilogue measured slower than Inductor there"

    return Guard(f"matmul_heavy_epilogue_k({b})", check)


# ---- guards every pattern gets --------------------------------------------------------------------
def _dtype_guard(p: "Pattern") -> Guard:
    first = next(n for n, k in p.params if k == "tensor")

    def check(s: Site) -> str | None:
        dt = s.tensor(first).dtype
        return None if dt in p.dtypes else f"{first} is {dt}; supported: {[str(d) for d in p.dtypes]}"

    return Guard("dtype", check)


def _scalar_guard(p: "Pattern") -> Guard:
    """Tensor slots take tensors; float slots take a number or a 0-dim floating tensor (a Dynamo-
    tensorified float is one); int slots take an int literal."""
    def check(s: Site) -> str | None:
        for n, kind in p.params:
            if kind == "tensor" and not isinstance(s.arg(n), Tensor):
                return f"{n} is bound to {_short(s.arg(n))}, not a tensor"
            v = s.arg(n) if kind in ("float", "int") else None
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if kind == "float" and n in p.literals and not number:
                return f"{n} must be a Python number ({_short(v)})"
            if kind == "float" and not (
                number or (isinstance(v, Tensor) and v.dim() == 0 and v.is_floating_point())
            ):
                return f"{n} is not a Python number or a 0-dim float tensor ({_short(v)})"
            if kind == "int" and not (isinstance(v, int) and not isinstance(v, bool)):
                return f"{n} is not an int literal ({_short(v)})"
        return None

    return Guard("arguments", check, quiet=True)


def _device_guard(p: "Pattern") -> Guard:
    tensors = [n for n, k in p.params if k == "tensor"]

    def check(s: Site) -> str | None:
        devs = {s.tensor(n).device for n in tensors}
        if len(devs) != 1:
            return f"tensors on several devices: {sorted(map(str, devs))}"
        dev = devs.pop()
        if dev.type == "cpu":
            return None if s.run.options.cpu_reference else \
                "CPU tensors (fusekit runs CPU references only with options={'cpu_reference': True})"
        if dev.type == "cuda":
            missing = _ext.missing_cuda_kernel(p.op, dev)
            dtype = s.tensor(tensors[0]).dtype
            if missing is None and dtype not in ops.CUDA_DTYPES.get(p.op, (dtype,)):
                return f"fusekit::{p.op} has no CUDA kernel for {dtype}"
            if missing is None and p.id not in s.run.options.forced:
                if not p.on_by_default(dtype):
                    return (f"off by default on CUDA in {dtype}: slower than Inductor's kernel in the benchmark; "
                            f"enable with options={{'patterns': ['{p.id}']}}")
                n, floor = s.tensor(tensors[0]).numel(), p.min_numel(dtype)
                if isinstance(n, int) and n < floor:
                    return (f"{n:,} elements, below the size threshold ({floor:,} in {dtype}): Inductor's kernels "
                            f"measured faster there; enable with options={{'patterns': ['{p.id}']}}")
            return missing
        return f"device {dev.type} is not supported"

    return Guard("device", check)


def _short(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"tensor {tuple(v.shape)} {v.dtype}"
    return repr(v)


@functools.cache
def all_guards(p: "Pattern") -> tuple[Guard, ...]:
    return (_scalar_guard(p), _dtype_guard(p), _device_guard(p), *p.guards)


def fits(p: "Pattern", match: pm.Match, run: Any) -> bool:
    """Whether the match's arguments and dtype are ones the rule takes (its first two guards)."""
    site = Site(match, run)
    try:
        return all(g.check(site) is None for g in all_guards(p)[:2])
    except Exception:  # noqa: BLE001 - a relaxed match can bind odd things; then it is no near miss
        return False


def guard_fn(p: "Pattern") -> Callable[[pm.Match], bool]:
    """The `extra_check` of every entry of `p`: all guards pass, or the first failure is recorded."""
    def extra_check(match: pm.Match) -> bool:
        run = active_run()
        if run is None or p.id not in run.record.enabled:
            return False
        anchor = match.output_nodes()[0]
        site = Site(match, run)
        for g in all_guards(p):
            reason = g.check(site)
            if reason is not None:
                if not g.quiet:
                    run.near_miss(p.id, anchor, f"{g.name}: {reason}")
                return False
        from .stats import describe

        run.current_site = f"graph {run.record.graph_id}: {describe(anchor)}"
        return True

    return extra_check


class SiteFailure(Exception):
    """A replacement failed after the graph may have been touched; the pass restores and retries."""

    def __init__(self, pattern: str, node: torch.fx.Node, exc: BaseException) -> None:
        super().__init__(f"{pattern} at {node.name}: {exc}")
        self.pattern, self.node, self.exc = pattern, node, exc


def harden_entries(p: "Pattern", pass_: pm.PatternMatcherPass,
                   precheck: Callable[[pm.Match], bool] | None = None) -> None:
    """An exception while checking a site skips that site; one while rewriting aborts the rewrite
    (the pass then restores the graph). Either way it is recorded, never raised into torch.compile.
    `precheck` (the rule's guards) runs first, on the match as found: a site it rejects never reaches
    Inductor's own check, which makes fake tensors of every argument and matches again."""
    for entries in pass_.patterns.values():
        for e in entries:
            if getattr(e, "_fusekit_hardened", False):
                continue
            check, apply = e.extra_check, e.apply

            def safe_check(match: pm.Match, _check: Any = check) -> bool:
                try:
                    return (precheck is None or bool(precheck(match))) and bool(_check(match))
                except Exception as exc:  # noqa: BLE001 - any failure here only skips the site
                    run = active_run()
                    if run is not None:
                        run.error(p.id, match.output_nodes()[0], exc)
                    return False

            def safe_apply(match: pm.Match, graph: Any, node: Any, _apply: Any = apply) -> None:
                run = active_run()
                if run is not None:
                    run.replaced.update((n, p.id) for n in match.nodes)
                try:
                    _apply(match, graph, node)
                except Exception as exc:  # noqa: BLE001
                    raise SiteFailure(p.id, node, exc) from exc
                if run is not None:
                    run.record.sites[p.id] += 1
                    run.record.nodes_replaced[p.id] += len({n for n in match.nodes if n.op == "call_function"})
                    run.record.fused_sites.append((p.id, run.current_site))

            e.extra_check, e.apply, e._fusekit_hardened = safe_check, safe_apply, True

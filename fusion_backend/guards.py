"""Guards: named checks on a match, run before a site is rewritten.

A guard returns None when the site is fine, or a short reason; the first failing guard stops the rewrite and
becomes a near miss in the report (pattern, site, guard, reason). Two kinds:
- *can fire* guards state what the op and its kernels take (dtype, device, a kernel built for it, shapes,
  strides); every pattern gets the scalar, dtype and device ones, the table adds its own;
- *policy* guards (``policy=True``) state where the rule should fire: measured choices, such as the rule's CUDA
  default and size threshold, or the rows up to which a kernel beats Inductor's. Naming a rule in
  ``options["patterns"]`` overrides them (never the can-fire guards).
Can-fire guards run first. A site that fails one is reported only for a rule that would fire there by
default (or was named): elsewhere it is noise (an opt-in rule's shape check on every LayerNorm).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import Tensor
from torch._inductor import pattern_matcher as pm

from . import _ext, ops

aten = torch.ops.aten

if TYPE_CHECKING:
    from .registry import Pattern


@dataclasses.dataclass(frozen=True)
class Guard:
    name: str
    check: Callable[["Site"], str | None]
    quiet: bool = False   # a structural mismatch (not this pattern at all): not reported as a near miss
    policy: bool = False  # a measured choice (should fire), not a limit of the op (can fire)


class Site:
    """A candidate match, with each argument's value (a FakeTensor or a Python scalar)."""

    def __init__(self, match: pm.Match, run: Any, pattern: "Pattern") -> None:
        self.match, self.run, self.pattern = match, run, pattern

    def arg(self, name: str) -> Any:
        v = self.match.kwargs[name]
        return v.meta.get("val") if isinstance(v, torch.fx.Node) else v

    def tensor(self, name: str) -> Tensor:
        return self.arg(name)

    @property
    def first_tensor(self) -> Tensor:
        return self.tensor(next(n for n, k in self.pattern.params if k == "tensor"))

    def kernel_arch(self) -> str | None:
        """The arch of the kernels that run the rule's op here ("9.0a", ...): None on CPU or where the op has no
        CUDA kernel. Rules whose measured limits depend on an arch-specific kernel read it."""
        return _ext.kernel_arch(self.pattern.op, self.first_tensor.device)

    def fires_by_default(self) -> bool:
        """Whether the rule would fire unnamed at a site like this one: on CUDA by its measured default there, on
        CPU by its default on an H100/H200 (what a CPU run with cpu_reference stands for)."""
        if self.pattern.id in self.run.options.forced:
            return True
        t = self.first_tensor
        arch = self.kernel_arch() if t.device.type == "cuda" else _ext.REFERENCE_ARCH
        return self.pattern.on_by_default(t.dtype, arch)


# ---- shared checks: 4-D q/k/v, unit strides, masks ------------------------------------------------
def qkv_problem(names: tuple[str, str, str], tq: Tensor, tk: Tensor, tv: Tensor) -> str | None:
    """q, k, v are 4-D and of one dtype."""
    q, k, v = names
    if not (tq.dim() == tk.dim() == tv.dim() == 4):
        return f"{q}, {k}, {v} must be 4-D: {tq.dim()}, {tk.dim()}, {tv.dim()} dims"
    if not (tq.dtype == tk.dtype == tv.dtype):
        return f"dtypes differ: {tq.dtype}, {tk.dtype}, {tv.dtype}"
    return None


def unit_last_stride_problem(*ts: Tensor) -> str | None:
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    if all(known(t.stride(-1) == 1) for t in ts):
        return None
    return f"last-dim stride is not 1: {', '.join(str(t.stride()) for t in ts)}"


def mask_problem(name: str, m: Tensor, dtypes: tuple[torch.dtype, ...], full: tuple, label: str) -> str | None:
    """An attention mask: one of `dtypes`, and broadcastable to `full` (named `label`, as [B,H,Sq,Sk])."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    if m.dtype not in dtypes:
        return f"{name} is {m.dtype}; want {' or '.join(str(d) for d in dtypes)}"
    if m.dim() > 4 or not all(known(a == 1) or known(a == b) for a, b in zip(reversed(m.shape), reversed(full))):
        return f"{name} {tuple(m.shape)} does not broadcast to {label} {full}"
    return None


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
    """Can fire: the tensors are on one device, CPU with cpu_reference (the op's reference runs there) or a CUDA
    device whose loaded kernels hold the op, in this dtype."""
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
            if missing is None and not ops.cuda_kernel_takes(p.op, dtype):
                return f"fusekit::{p.op} has no CUDA kernel for {dtype}"
            return missing
        return f"device {dev.type} is not supported"

    return Guard("device", check)


def _selection_guard(p: "Pattern") -> Guard:
    """Policy, on CUDA: the rule's measured default in this dtype with these kernels, and its size threshold."""
    def check(s: Site) -> str | None:
        t = s.first_tensor
        if t.device.type != "cuda":
            return None
        if not p.on_by_default(t.dtype, s.kernel_arch()):
            return f"off by default on CUDA in {t.dtype}: not faster than what it replaces in the benchmark"
        n, floor = t.numel(), p.min_numel(t.dtype)
        if isinstance(n, int) and n < floor:
            return (f"{n:,} elements, below the size threshold ({floor:,} in {t.dtype}): Inductor's kernels "
                    f"measured faster there")
        return None

    return Guard("selection", check, policy=True)


def _short(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"tensor {tuple(v.shape)} {v.dtype}"
    return repr(v)


@functools.cache
def all_guards(p: "Pattern") -> tuple[Guard, ...]:
    """The rule's guards in the order they run: the can-fire ones first (the common ones, then the table's), then
    the policy ones."""
    common = (_scalar_guard(p), _dtype_guard(p), _device_guard(p), _selection_guard(p))
    return tuple(g for g in (*common, *p.guards) if not g.policy) + \
        tuple(g for g in (*common, *p.guards) if g.policy)


def fits(p: "Pattern", match: pm.Match, run: Any) -> bool:
    """Whether the match's arguments and dtype are ones the rule takes (its first two guards), at a site where it
    would fire by default (a reused intermediate of an opt-in rule is not worth reporting)."""
    site = Site(match, run, p)
    try:
        return all(g.check(site) is None for g in all_guards(p)[:2]) and site.fires_by_default()
    except Exception:  # noqa: BLE001 - a relaxed match can bind odd things; then it is no near miss
        return False


def check_site(p: "Pattern", match: pm.Match, run: Any) -> bool:
    """Whether `run` may rewrite this site with `p`: the rule is enabled and every guard passes (a named rule
    skips the policy guards); else the first failing guard is recorded as a near miss where worth reporting."""
    if p.id not in run.record.enabled:
        return False
    anchor = match.output_nodes()[0]
    site = Site(match, run, p)
    forced = p.id in run.options.forced
    for g in all_guards(p):
        if g.policy and forced:
            continue
        reason = g.check(site)
        if reason is not None:
            if not g.quiet and (g.policy or site.fires_by_default()):
                if g.policy:
                    reason += f"; name it to fire anyway: options={{'enable': ['{p.id}']}}"
                run.near_miss(p.id, anchor, f"{g.name}: {reason}", policy=g.policy)
            return False
    from .stats import describe

    run.current_site = f"graph {run.record.graph_id}: {describe(anchor)}"
    return True


class SiteFailure(Exception):
    """A replacement failed after the graph may have been touched; the pass restores and retries."""

    def __init__(self, pattern: str, node: torch.fx.Node, exc: BaseException) -> None:
        super().__init__(f"{pattern} at {node.name}: {exc}")
        self.pattern, self.node, self.exc = pattern, node, exc


def bind(p: "Pattern", entry: pm.PatternEntry, run: Any) -> pm.PatternEntry:
    """`entry` (made once per process) for one pass over one graph: its check runs `p`'s guards with `run`
    first, on the match as found (a site they reject never reaches Inductor's own check, which makes fake
    tensors of every argument and matches again), and records what happens in `run`. An exception while
    checking a site skips that site; one while rewriting aborts the rewrite (the pass then restores the
    graph). Either way it is recorded, never raised into torch.compile."""
    check, apply = entry.extra_check, entry.apply

    def bound_check(match: pm.Match) -> bool:
        try:
            return check_site(p, match, run) and bool(check(match))
        except Exception as exc:  # noqa: BLE001 - any failure here only skips the site
            run.error(p.id, match.output_nodes()[0], exc)
            return False

    def bound_apply(match: pm.Match, graph: Any, node: Any) -> None:
        run.replaced.update((n, p.id) for n in match.nodes)
        try:
            apply(match, graph, node)
        except Exception as exc:  # noqa: BLE001
            raise SiteFailure(p.id, node, exc) from exc
        if run.options.verify:  # the replacement leaves the site's name to the pass, which knows it
            for v in graph.find_nodes(op="call_function", target=torch.ops.fusekit.verify.default):
                if v.args[4] == "":
                    v.update_arg(4, run.current_site)
        run.record.sites[p.id] += 1
        run.record.nodes_replaced[p.id] += len({n for n in match.nodes if n.op == "call_function"})
        run.record.fused_sites.append((p.id, run.current_site))

    bound = copy.copy(entry)
    bound.extra_check, bound.apply = bound_check, bound_apply  # (apply: an instance attribute over the method)
    return bound

"""Declaring rules: the ``Pattern`` record (with its test ``Fixtures``), a family's ``InductorSettings``, and the
ops' CPU kernels.

A ``Pattern`` is data: its unfused ``reference`` is the search pattern (traced per dtype through
Inductor's own decompositions, ``tracing.py``), the op's CPU kernel, the test oracle and the benchmark
baseline; ``matcher.py`` turns it into pattern-matcher entries.

Matching is exact on literals (``ignore_types=()``), and ``add``/``mul`` operands are commuted where one
of them is a rule input, so ``v + q * k`` matches ``q * k + v``. A float parameter is bound to whatever feeds that
operand: a Python number, or a 0-dim floating tensor (the user's, or Dynamo's tensorified float); the
scalar guard rejects anything else.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from . import _ext, ops
from . import guards as G

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Tolerance against the same-dtype eager reference: (atol, rtol). Used by options={"verify": True}.
DEFAULT_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}
EXACT = {dt: (0.0, 0.0) for dt in (*FLOATS, torch.int8)}  # int8: rules whose first tensor is int8


def rand(shape: Sequence[int], dtype: torch.dtype, device: Any, scale: float = 1.0) -> Tensor:
    """Fresh random normal data (never zeros: they hide unwritten outputs)."""
    return (torch.randn(tuple(shape), device=device, dtype=torch.float32) * scale).to(dtype)


@dataclasses.dataclass(frozen=True)
class Fixtures:
    """What the generated tests and benchmarks feed a rule; never read by the pass."""

    cases: tuple[tuple, ...] = ((4, 33), (2, 3, 64))  # CPU test shapes, interpreted by the rule's `inputs`
    gpu_cases: tuple[tuple, ...] | None = None        # GPU kernel-test shapes (default: cases sized up)
    bad_layout: Callable[..., tuple] | None = None    # (dtype, device) -> inputs one of the rule's guards rejects
    bad_reason: str = "contiguous"                    # what that guard says
    # Same-dtype eager computation whose float64 error bounds the kernel's (default: the reference).
    baseline: Callable[..., Any] | None = None
    # How far Inductor's own code for the chain may be from eager where a rule does not fire, if wider than the
    # rule's tol ((atol, rtol) per dtype): Inductor quantizing x by x * (1 / 127.5) where eager divides moves an int8.
    inductor_tol: Mapping[torch.dtype, tuple[float, float]] | None = None


@dataclasses.dataclass(frozen=True)
class InductorSettings:
    """Inductor configuration a family needs for the rest of a compile where one of its rules fired (declared as
    ``INDUCTOR`` in its patterns/ file). The backend offers the keys the user did not set, on CUDA devices of at
    least `min_capability`; the pass sets them where the family fired; a compile that Inductor fails with them is
    compiled again without them."""

    config: Mapping[str, Any]
    min_capability: tuple[int, int] = (0, 0)


@dataclasses.dataclass(frozen=True, eq=False)  # identity hash: tables hold dicts
class Pattern:
    """One fusion rule. See patterns/*.py for the tables and README "Adding a pattern"."""

    id: str                                   # "<family>.<what>"
    reference: Callable[..., Any]             # unfused eager code; its signature is the op's signature
    op: str                                   # name of torch.ops.fusekit.<op>
    inputs: Callable[[tuple, torch.dtype, Any], tuple]  # (case, dtype, device) -> tensor arguments
    dtypes: tuple[torch.dtype, ...] = FLOATS  # dtype of the first tensor argument
    guards: tuple[G.Guard, ...] = ()          # shape/stride/contiguity guards beyond dtype/device/scalars
    static: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # non-tensor params fixed per rule
    # Static params the op takes in another form than the reference: name -> fn(the op's other arguments by
    # name). A rule without a zero point adds 0.0 in its reference; the op takes zeros like the scale.
    op_static: Mapping[str, Callable[[Mapping[str, Any]], Any]] = dataclasses.field(default_factory=dict)
    literals: tuple[str, ...] = ()            # float params matched only as Python numbers (no `_t`)
    # Other eager spellings of the same computation (same parameters, static ones omitted). Each is
    # registered as a search pattern too (duplicates of the reference's are skipped) and tested. A variant with the
    # attribute exact_clones = True (on a variant or the reference) is matched with the clones its trace_case trace
    # has, not every clone variant.
    variants: tuple[Callable[..., Any], ...] = ()
    # Spellings that exist only in a post-grad graph of another device (SDPA's fused CUDA ops): traced and
    # matched like variants, never run eagerly here; tests match them on their traced graphs.
    graph_forms: tuple[Callable[..., Any], ...] = ()
    trace_case: tuple = (2, 8)                # tiny shape used to trace the search pattern
    tol: Mapping[torch.dtype, tuple[float, float]] = dataclasses.field(default_factory=lambda: DEFAULT_TOL)
    # Measured selection (benchmarks/RESULTS.md): the dtypes in which the rule fires on CUDA by default, i.e.
    # where the kernel measured no slower than Inductor's for the same subgraph (within the 2% run-to-run noise)
    # at every benchmarked size. True = every dtype, False = none, or a predicate (dtype, arch) -> bool where that
    # depends on which kernels the build holds (arch: the loaded build's, e.g. "9.0a"). Elsewhere it fires on
    # CUDA only when named in options["patterns"].
    cuda_default: bool | tuple[torch.dtype, ...] | Callable[[torch.dtype, str | None], bool] = True
    # Measured selection by size: where it fires by default, the rule fires on CUDA only when its first
    # tensor has at least this many elements (per dtype, or one int for all): below it, bench_patterns'
    # CUDA-graph timings measured Inductor's kernels faster (launch-bound sizes). A symbolic size fires
    # (the kernel wins where the time is; the loss below measured <= 1.3 us). Named rules fire at any size.
    cuda_min_numel: int | Mapping[torch.dtype, int] = 0
    # How the search pattern is traced. "fwd_only": make_fx through Inductor's decompositions (enough for
    # elementwise chains). "inductor": the graph Inductor itself hands to its post-grad pass (its
    # view_to_reshape/clone/noop passes applied, SDPA on its math backend), so the rule tracks exactly
    # what Inductor emits; view/expand sizes are wildcards and every expand->reshape may carry the clone
    # that a non-contiguous input gets.
    trace: str = "fwd_only"
    # Output casts the op stores itself (its schema's `out_dtype`); passes.absorb_output_casts takes a cast
    # after the rule's match where the result is returned. A 16-bit rule whose traced pattern ends in the
    # downcast of an fp32 computation (an activation Inductor upcasts) then also matches that computation
    # without the downcast, where its fp32 result is a graph output, and writes it as out_dtype: the graph
    # Inductor's pointless_convert pass leaves of `act(...).float()`.
    output_casts: tuple[torch.dtype, ...] = ()
    # The fp32 form (output_casts) also where its result feeds more work, not only where it is returned: torch
    # 2.11's pointless_convert folds a downcast into the upcast of the consumer after it (SiLU of SwiGLU's gate), and
    # the rule's fp32 result is then all the graph holds (its consumer reads 4 bytes an element: a decode step's
    # few rows, where that is nothing against the weight).
    cast_any_user: bool = False
    # Also match without the expands of arguments that a traced torch.matmul carries (a direct torch.bmm).
    expand_optional: bool = False
    # Tensor parameters that must bind distinct graph nodes. A rule of several outputs that share only an
    # input (q/k/v projections of one x) finds each further output among that input's users; without this,
    # two outputs of the pattern could bind one projection of the graph.
    exclusive: tuple[str, ...] = ()
    # The op that does this op's work over two caches (its k and v) that it first moves one slot to the left in
    # place, a new row into each last slot: a full sliding window's decode step (kv_cache.py fuses the window's two
    # rolls into it). Its arguments: this op's first three, the two new rows, then this op's others.
    rolling_op: str | None = None
    fixtures: Fixtures = Fixtures()  # test and benchmark inputs (the pass never reads them)

    def on_by_default(self, dtype: torch.dtype, arch: str | None = _ext.REFERENCE_ARCH) -> bool:
        """Whether the rule fires on CUDA unnamed, in `dtype`, with kernels built for `arch` (default: an H100/H200's)."""
        d = self.cuda_default
        if callable(d):
            return d(dtype, arch)
        return d is True or (isinstance(d, tuple) and dtype in d)

    def min_numel(self, dtype: torch.dtype) -> int:
        m = self.cuda_min_numel
        return m if isinstance(m, int) else m.get(dtype, 0)

    @functools.cached_property
    def params(self) -> list[tuple[str, str]]:
        """(name, kind) for each reference parameter; kind in tensor/float/int/static."""
        out = []
        for name, p in inspect.signature(self.reference).parameters.items():
            ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            if name in self.static:
                kind = "static"
            elif "Tensor" in ann:
                kind = "tensor"
            elif ann in ("float", "int"):
                kind = ann
            else:
                raise TypeError(f"{self.id}: parameter {name!r} needs a Tensor/float/int annotation "
                                f"or a value in static=")
            out.append((name, kind))
        return out

    @property
    def arg_names(self) -> list[str]:
        """Parameters bound by the match (everything but static)."""
        return [n for n, k in self.params if k != "static"]

    @property
    def tensor_scalars(self) -> list[str]:
        """Float params that may also arrive as 0-dim tensors (and have a `_t` companion in the op)."""
        return [n for n, k in self.params if k == "float" and n not in self.literals]

    @property
    def scalar_defaults(self) -> dict[str, float | int]:
        sig = inspect.signature(self.reference).parameters
        return {n: sig[n].default for n, k in self.params if k in ("float", "int")}

    def make_args(self, case: tuple, dtype: torch.dtype, device: Any) -> tuple:
        """Arguments for the search function: tensors from `inputs`, scalars at their defaults."""
        tensors = iter(self.inputs(case, dtype, device))
        defaults = self.scalar_defaults
        return tuple(next(tensors) if k == "tensor" else defaults[n]
                     for n, k in self.params if k != "static")

    def search_fn(self) -> Callable[..., Any]:
        return _with_signature(lambda *a: self.reference(**dict(zip(self.arg_names, a)), **self.static),
                               self.arg_names)

    def eager(self, *args: Any) -> Any:
        """The reference evaluated on matched arguments (static params filled in)."""
        return self.reference(**dict(zip(self.arg_names, args)), **self.static)


def _with_signature(fn: Callable[..., Any], names: Sequence[str]) -> Callable[..., Any]:
    P = inspect.Parameter
    fn.__signature__ = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names])
    return fn


def op_overload(name: str) -> torch._ops.OpOverload:
    return getattr(torch.ops.fusekit, name).default


def op_arguments(pattern: Pattern, args: Sequence[Any], static: Mapping[str, Any] = {}) -> dict[str, Any]:
    """The op's arguments by name for matched `args`: the rule's static parameters (`static` overrides them),
    those the op takes in another form (op_static) computed from the rest."""
    bound = dict(zip(pattern.arg_names, args)) | dict(pattern.static) | dict(static)
    return bound | {n: f(bound) for n, f in pattern.op_static.items()}


def call_op(pattern: Pattern, args: Sequence[Any], static: Mapping[str, Any] = {}) -> Any:
    """Call the pattern's op on matched arguments (`static` overrides the rule's static parameters); a tensor
    in a float slot goes to its `_t` companion."""
    bound = op_arguments(pattern, args, static)
    call_args, call_kwargs = [], {}
    for name, kind in pattern.params:
        v = bound[name]
        if isinstance(v, Tensor) and name in pattern.tensor_scalars:
            call_kwargs[f"{name}_t"], v = v, 0.0
        call_args.append(v)
    return op_overload(pattern.op)(*call_args, **call_kwargs)


def _cpu_kernel(pattern: Pattern) -> Callable[..., Any]:
    # every float of the shared reference may come as a `_t` companion (a rule may hold it static)
    float_names = [n for n, p in inspect.signature(pattern.reference).parameters.items()
                   if "float" in str(p.annotation) and n not in pattern.literals]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        names = [n for n, _ in pattern.params]
        for n in float_names:  # a `_t` companion replaces its float
            t = kwargs.pop(f"{n}_t", None)
            if t is not None:
                args[names.index(n)] = t
        out = pattern.reference(*args, **kwargs)
        if ops.OPS[pattern.op].out_like_first:  # the fake's layout: q's
            return torch.empty_like(args[0]).copy_(out)
        return out.contiguous() if isinstance(out, Tensor) else tuple(o.contiguous() for o in out)

    return kernel


def register_cpu_references(patterns: Sequence[Pattern]) -> None:
    """The CPU kernel of each op is its patterns' shared reference function (registered once)."""
    first: dict[str, Pattern] = {}
    for p in patterns:
        if first.setdefault(p.op, p).reference is not p.reference:
            raise ValueError(f"op fusekit::{p.op}: patterns must share one reference function")
    for op, p in first.items():
        torch.library.impl(f"fusekit::{op}", "CPU")(_cpu_kernel(p))

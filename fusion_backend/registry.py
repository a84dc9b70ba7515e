"""Pattern declarations -> Inductor pattern-matcher entries.

A ``Pattern`` is data: its unfused ``reference`` is the search pattern (traced per dtype through
Inductor's own decompositions), the op's CPU kernel, the test oracle and the benchmark baseline. This
module turns each one into ``register_replacement`` entries, one ``PatternMatcherPass`` per pattern so
that the enabled set can change per compile and matches are counted per pattern.

Matching is exact on literals (``ignore_types=()``), and every commuted order of ``add``/``mul`` operands
is registered, so ``v + q * k`` matches ``q * k + v``. A float parameter is bound to whatever feeds that
operand: a Python number, or a 0-dim floating tensor (the user's, or Dynamo's tensorified float); the
scalar guard rejects anything else.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch._inductor import pattern_matcher as pm

from . import guards as G
from . import ops
from .stats import active_run

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Tolerance against the same-dtype eager reference: (atol, rtol). Used by options={"verify": True}.
DEFAULT_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}
EXACT = {dt: (0.0, 0.0) for dt in FLOATS}
_COMMUTATIVE = {aten.add.Tensor, aten.mul.Tensor}


def rand(shape: Sequence[int], dtype: torch.dtype, device: Any, scale: float = 1.0) -> Tensor:
    """Fresh random normal data (never zeros: they hide unwritten outputs)."""
    return (torch.randn(tuple(shape), device=device, dtype=torch.float32) * scale).to(dtype)


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
    literals: tuple[str, ...] = ()            # float params matched only as Python numbers (no `_t`)
    # Other eager spellings of the same computation (same parameters, static ones omitted). Each is
    # registered as a search pattern too (duplicates of the reference's are skipped) and tested.
    variants: tuple[Callable[..., Any], ...] = ()
    cases: tuple[tuple, ...] = ((4, 33), (2, 3, 64))  # test shapes, interpreted by `inputs`
    trace_case: tuple = (2, 8)                # tiny shape used to trace the search pattern
    bad_layout: Callable[..., tuple] | None = None  # (dtype, device) -> inputs a layout guard rejects
    tol: Mapping[torch.dtype, tuple[float, float]] = dataclasses.field(default_factory=lambda: DEFAULT_TOL)
    # Measured selection (benchmarks/results/): the dtypes in which the rule fires on CUDA by default,
    # i.e. where the kernel measured no slower than Inductor's for the same subgraph (within the 2%
    # run-to-run noise) at every benchmarked size. True = every dtype, False = none. Elsewhere it fires on
    # CUDA only when named in options["patterns"].
    cuda_default: bool | tuple[torch.dtype, ...] = True
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
    bad_reason: str = "contiguous"            # what the failing guard of `bad_layout` says
    # Same-dtype eager computation whose float64 error bounds the kernel's (default: the reference).
    baseline: Callable[..., Any] | None = None
    gpu_cases: tuple[tuple, ...] | None = None  # GPU kernel-test cases, where `inputs` is not (n,)-sized
    # Output casts the op stores itself (its schema's `out_dtype`); passes.absorb_output_casts takes a cast
    # after the rule's match where the result is returned. A 16-bit rule whose traced pattern ends in the
    # downcast of an fp32 computation (an activation Inductor upcasts) then also matches that computation
    # without the downcast, where its fp32 result is a graph output, and writes it as out_dtype: the graph
    # Inductor's pointless_convert pass leaves of `act(...).float()`.
    output_casts: tuple[torch.dtype, ...] = ()
    # Also match without the expands of arguments that a traced torch.matmul carries (a direct torch.bmm).
    expand_optional: bool = False

    def on_by_default(self, dtype: torch.dtype) -> bool:
        return self.cuda_default is True or (isinstance(self.cuda_default, tuple) and dtype in self.cuda_default)

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


def call_op(pattern: Pattern, args: Sequence[Any], static: Mapping[str, Any] = {}) -> Any:
    """Call the pattern's op on matched arguments (`static` overrides the rule's static parameters); a tensor
    in a float slot goes to its `_t` companion."""
    bound = dict(zip(pattern.arg_names, args)) | dict(pattern.static) | dict(static)
    call_args, call_kwargs = [], {}
    for name, kind in pattern.params:
        v = bound[name]
        if isinstance(v, Tensor) and name in pattern.tensor_scalars:
            call_kwargs[f"{name}_t"], v = v, 0.0
        call_args.append(v)
    return op_overload(pattern.op)(*call_args, **call_kwargs)


def _replacement_fn(pattern: Pattern, inverse: Mapping[str, Callable[[Any], Any]] = {},
                    static: Mapping[str, Any] = {}) -> Callable[..., Any]:
    def replace(*args: Any) -> Any:
        args = [inverse[n](a) if n in inverse else a for n, a in zip(pattern.arg_names, args)]
        out = call_op(pattern, args, static)
        run = active_run()
        if run is not None and run.options.verify:
            out = _verified(pattern, args, out, run.current_site)
        return out

    return _with_signature(replace, pattern.arg_names)


def _verified(pattern: Pattern, args: Sequence[Any], out: Any, site: str) -> Any:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    tensors = [a if isinstance(a, Tensor) else None for a in args]
    floats = [0.0 if isinstance(a, Tensor) else float(a) for a in args]
    checked = torch.ops.fusekit.verify(outs, tensors, floats, pattern.id, site)
    return tuple(checked) if isinstance(out, (tuple, list)) else checked[0]


# ---- search-pattern construction ----------------------------------------------------------------
def _dummy_scalars(pattern: Pattern) -> dict[str, float | int]:
    """Distinctive stand-ins so each scalar shows up as its own literal in the traced graph."""
    out: dict[str, float | int] = {}
    for i, (name, kind) in enumerate(pattern.params):
        if kind == "float":
            out[name] = 0.2718 + 0.0137 * i
        elif kind == "int":
            out[name] = -77 + i
    return out


def _map_dag(expr: Any, fn: Callable[[Any, list[Any], dict[str, Any]], Any]) -> Any:
    """Rebuild the pattern DAG `expr` bottom-up: each CallFunction becomes fn(node, new args, new kwargs).
    A node shared by several users (one PatternExpr object) is rebuilt once and stays shared."""
    memo: dict[int, Any] = {}

    def go(e: Any) -> Any:
        if isinstance(e, pm.MultiOutputPattern):
            return pm.MultiOutputPattern([go(o) for o in e.outputs])
        if not isinstance(e, pm.CallFunction):
            return e
        if id(e) not in memo:
            memo[id(e)] = fn(e, [go(a) for a in e.args], {k: go(v) for k, v in e.kwargs.items()})
        return memo[id(e)]

    return go(expr)


def _dag_variants(expr: Any, is_site: Callable[[Any], bool],
                  rewrite: Callable[[Any, list[Any]], Any]) -> list[Any]:
    """Every variant of the pattern DAG `expr` where each node with `is_site` is rewritten or not. A node
    shared by several users (one PatternExpr object) is rewritten consistently, once."""
    roots = list(expr.outputs) if isinstance(expr, pm.MultiOutputPattern) else [expr]
    sites: list[Any] = []
    seen: set[int] = set()

    def find(e: Any) -> None:
        if not isinstance(e, pm.CallFunction) or id(e) in seen:
            return
        seen.add(id(e))
        for a in (*e.args, *e.kwargs.values()):
            find(a)
        if is_site(e):
            sites.append(e)

    for r in roots:
        find(r)
    out = []
    for chosen in itertools.product((False, True), repeat=len(sites)):
        picked = {id(x) for x, c in zip(sites, chosen) if c}
        out.append(_map_dag(expr, lambda e, args, kwargs: (
            rewrite(e, args) if id(e) in picked else pm.CallFunction(e.fns, *args, _users=e.users, **kwargs))))
    return out


def _commuted(expr: Any) -> list[Any]:
    """Every variant of `expr` with operands of commutative aten ops swapped."""
    return _dag_variants(
        expr,
        lambda e: (len(e.args) == 2 and bool(set(e.fns) & _COMMUTATIVE)
                   and all(isinstance(a, pm.PatternExpr) for a in e.args)),
        lambda e, args: pm.CallFunction(e.fns, *args[::-1], _users=e.users, **e.kwargs))


def _relaxed(expr: Any) -> Any:
    """`expr` with the one-user constraint dropped, to explain sites where an intermediate is reused."""
    return _map_dag(expr, lambda e, args, kwargs: pm.CallFunction(e.fns, *args, _users=pm.MULTIPLE, **kwargs))


def _size(expr: Any) -> int:
    if isinstance(expr, pm.MultiOutputPattern):
        return sum(map(_size, expr.outputs))
    if isinstance(expr, pm.CallFunction):
        return 1 + sum(map(_size, (*expr.args, *expr.kwargs.values())))
    return 0


def _keyword_names(expr: Any) -> set[str]:
    if isinstance(expr, pm.KeywordArg):
        return {expr.name}
    if isinstance(expr, pm.MultiOutputPattern):
        return set().union(*map(_keyword_names, expr.outputs))
    if isinstance(expr, pm.CallFunction):
        return set().union(*[_keyword_names(a) for a in (*expr.args, *expr.kwargs.values())])
    return set()


# A decomposition may hold a float parameter s as sqrt(s) (SDPA's math backend scales q and k by
# sqrt(scale)) or 1/s (x / d); the rule then binds that literal and the replacement inverts it.
_SCALAR_FORMS: tuple[tuple[Callable[[float], float], Callable[[Any], Any]], ...] = (
    (lambda d: d, lambda x: x),
    (math.sqrt, lambda x: x * x),
    (lambda d: 1.0 / d, lambda x: 1.0 / x),
)


def trace_search_pattern(pattern: Pattern, dtype: torch.dtype, device: Any,
                         fn: Callable[..., Any] | None = None) -> Any:
    """The exact PatternExpr of `fn` (default: the reference), traced like Inductor's own graphs."""
    return trace_search_pattern_and_forms(pattern, dtype, device, fn)[0]


def trace_search_pattern_and_forms(pattern: Pattern, dtype: torch.dtype, device: Any,
                                   fn: Callable[..., Any] | None = None
                                   ) -> tuple[Any, dict[str, Callable[[Any], Any]]]:
    """(PatternExpr, {param: inverse}) where a parameter appears transformed in the traced graph."""
    dummies = _dummy_scalars(pattern)
    tensors = iter(pattern.inputs(pattern.trace_case, dtype, device))
    args = [next(tensors) if k == "tensor" else dummies[n] for n, k in pattern.params if k != "static"]
    fn = fn or pattern.search_fn()
    if pattern.trace == "inductor":
        names = [n for n, k in pattern.params if k == "tensor"]
        bound = dict(zip(pattern.arg_names, args))
        gm = post_grad_graph(_with_signature(
            lambda *t: fn(*[(bound | dict(zip(names, t)))[n] for n in pattern.arg_names]), names),
                             [bound[n] for n in names])
        argnames = names
    else:
        gm = pm.fwd_only(fn, args)
        argnames = pattern.arg_names
    floats, ints = _literals(gm)
    workaround, inverse = {}, {}
    for name, d in dummies.items():
        for form, inv in (_SCALAR_FORMS if isinstance(d, float) else _SCALAR_FORMS[:1]):
            if form(d) in (floats if isinstance(d, float) else ints):
                workaround[name] = form(d)
                if form(d) != d:
                    inverse[name] = inv
                break
    expr = pm.fx_to_pattern(gm, argnames=argnames, scalar_workaround=workaround)
    if pattern.trace == "inductor":
        expr = _shape_wildcards(expr)
    missing = set(pattern.arg_names) - _keyword_names(expr)
    if missing:  # a decomposition folded the scalar into another constant; the rule could not bind it
        raise ValueError(f"{pattern.id} ({dtype}): parameters {sorted(missing)} vanish from the traced "
                         f"graph; use a different dummy or restructure the reference")
    return expr, inverse


def _literals(gm: torch.fx.GraphModule) -> tuple[set[float], set[int]]:
    """The float and the int constants in the node arguments of `gm`."""
    leaves = [a for n in gm.graph.nodes for a in pytree.tree_leaves((n.args, n.kwargs))
              if not isinstance(a, torch.fx.Node)]
    return ({a for a in leaves if isinstance(a, float)},
            {a for a in leaves if isinstance(a, int) and not isinstance(a, bool)})


class _Captured(Exception):
    pass


def post_grad_graph(fn: Callable[..., Any], args: Sequence[Tensor]) -> torch.fx.GraphModule:
    """The graph Inductor hands to its post-grad custom pass for ``fn(*args)``, captured by stopping
    ``compile_fx`` there. SDPA is traced on its math backend: that is the decomposition Inductor emits
    whenever it does not pick a fused attention kernel."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    box: dict[str, torch.fx.Graph] = {}

    class Capture:
        def __call__(self, graph: torch.fx.Graph) -> None:
            box["graph"] = graph
            raise _Captured

        def uuid(self) -> None:  # never cached
            return None

    gm = torch.fx.symbolic_trace(_positional(fn))
    with torch._guards.tracing(None), torch.no_grad(), sdpa_kernel(SDPBackend.MATH), \
            inductor_config.patch(post_grad_custom_post_pass=Capture(), post_grad_custom_pre_pass=None):
        try:
            compile_fx(gm, list(args))
        except Exception as e:  # noqa: BLE001 - the capture aborts the compile on purpose
            if "graph" not in box:
                raise
    out = torch.fx.GraphModule(torch.nn.Module(), box["graph"])
    node = next(n for n in out.graph.nodes if n.op == "output")
    if isinstance(node.args[0], (tuple, list)) and len(node.args[0]) == 1:
        node.args = (node.args[0][0],)
    out.recompile()
    return out


def _positional(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function with named positional parameters (what fx.symbolic_trace needs)."""
    names = list(inspect.signature(fn).parameters)
    src = f"def traced({', '.join(names)}):\n    return fn({', '.join(names)})\n"
    scope: dict[str, Any] = {"fn": fn}
    exec(src, scope)  # noqa: S102 - names are Python identifiers from a signature
    return scope["traced"]


_VIEW_OPS = [aten.reshape.default, aten.view.default, aten._unsafe_view.default]
_SHAPE_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
              aten.full.default}


def _shape_wildcards(expr: Any) -> Any:
    """Sizes in view/reshape/expand/full and device kwargs match anything (the graph's shapes, static or
    symbolic); reduction dims, permutations and dtypes stay exact. Shared nodes stay shared."""
    def wild(e: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if set(e.fns) & _SHAPE_OPS:
            args = [pm.Ignored() if isinstance(a, (list, tuple)) else a for a in args]
        kwargs = {k: pm.Ignored() if k == "device" else v for k, v in kwargs.items()}
        # a view, a reshape and matmul's _unsafe_view after a copy are one thing here
        fns = _VIEW_OPS if set(e.fns) & set(_VIEW_OPS) else e.fns
        return pm.CallFunction(fns, *args, _users=e.users, **kwargs)

    return _map_dag(expr, wild)


def _clone_variants(expr: Any) -> list[Any]:
    """`expr` with and without a contiguous clone between each expand and the reshape after it: Inductor's
    matmul decomposition copies a non-contiguous (e.g. head-transposed) operand there."""
    return _dag_variants(
        expr,
        lambda e: (aten._unsafe_view.default in e.fns and bool(e.args) and isinstance(e.args[0], pm.CallFunction)
                   and aten.expand.default in e.args[0].fns),
        lambda e, args: pm.CallFunction(
            e.fns, pm.CallFunction(aten.clone.default, args[0], memory_format=torch.contiguous_format),
            *args[1:], _users=e.users, **e.kwargs))


def _expand_variants(expr: Any) -> list[Any]:
    """`expr` with and without each expand of an argument: matmul's decomposition expands its operands to
    the batch shape (a no-op at equal sizes), which a direct torch.bmm call does not."""
    return _dag_variants(expr, lambda e: aten.expand.default in e.fns and bool(e.args)
                         and isinstance(e.args[0], pm.KeywordArg), lambda e, args: args[0])


def _downcast_root(expr: Any, dtype: torch.dtype) -> Any:
    """What `expr` downcasts to `dtype` at its root (convert_element_type(X, dtype), X computed wider), or None."""
    if isinstance(expr, pm.CallFunction) and torch.ops.prims.convert_element_type.default in expr.fns \
            and len(expr.args) == 2 and expr.args[1] == dtype and isinstance(expr.args[0], pm.CallFunction):
        return expr.args[0]
    return None


def _returned(check: Callable[[pm.Match], bool]) -> Callable[[pm.Match], bool]:
    """`check`, and the match's result is only returned from the graph: an fp32 result that feeds more work
    is read back by Inductor's kernel for it, and fp32 costs that kernel twice the bytes of 16 bits."""
    def extra_check(match: pm.Match) -> bool:
        out = match.output_nodes()[0]
        return all(u.op == "output" for u in out.users) and check(match)

    return extra_check


class Compiled:
    """A pattern's matcher pass, filled lazily: search patterns are traced only for the (dtype, device)
    pairs that a graph actually holds, so a fp16 CUDA model never pays for tracing fp32/bf16/CPU rules."""

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.pass_ = pm.PatternMatcherPass(pass_name=f"fusekit:{pattern.id}")
        self.relaxed: list[Any] = []  # one-user constraint dropped: explains reused intermediates
        self._done: set[tuple[torch.dtype, str]] = set()
        self._seen: set[str] = set()
        self._seen_relaxed: set[str] = set()

    def ensure(self, dtype: torch.dtype, device: str) -> None:
        # an unsupported dtype still gets the first dtype's rule, so its sites show as dtype near misses
        dtype = dtype if dtype in self.pattern.dtypes else self.pattern.dtypes[0]
        if (dtype, device) in self._done:
            return
        self._done.add((dtype, device))
        p = self.pattern
        search, check, dummies = p.search_fn(), G.guard_fn(p), _dummy_scalars(p)
        for fn in (None, *p.variants):
            tensors = list(p.inputs(p.trace_case, dtype, device))
            traced, inverse = trace_search_pattern_and_forms(p, dtype, device, fn)
            forms = [(traced, _replacement_fn(p, inverse), check)]
            cast = _downcast_root(traced, dtype) if torch.float32 in p.output_casts and dtype != torch.float32 \
                else None
            if cast is not None:  # the computation without its downcast: its fp32 result written by the op
                forms.append((cast, _replacement_fn(p, inverse, {"out_dtype": torch.float32}), _returned(check)))
            for i, (form, replace, chk) in enumerate(forms):
                shapes = _clone_variants(form) if p.trace == "inductor" else [form]
                if p.expand_optional:
                    shapes = [x for c in shapes for x in _expand_variants(c)]
                for expr in [c for e in shapes for c in _commuted(e)]:
                    key = pm.PatternPrettyPrinter.run(expr)
                    if key in self._seen:
                        continue
                    self._seen.add(key)
                    pm.register_replacement(search, replace, tensors, pm.fwd_only, [self.pass_],
                                            extra_check=chk, scalar_workaround=dummies,
                                            search_fn_pattern=expr, skip_duplicates=True)
                    if i:
                        continue  # near misses are explained for the rule's own form only
                    r = _relaxed(expr)
                    key = pm.PatternPrettyPrinter.run(r)
                    if key not in self._seen_relaxed:
                        self._seen_relaxed.add(key)
                        self.relaxed.append(r)
        G.harden_entries(p, self.pass_)
        for entries in self.pass_.patterns.values():  # longest match first: an fp16 rule that includes
            entries.sort(key=lambda e: -_size(e.pattern))  # the upcast beats the fp32 rule after it

    def apply(self, graph: torch.fx.Graph, dtypes: set[tuple[torch.dtype, str]]) -> int:
        """Run the rule over `graph`; `dtypes` is `graph_dtypes(graph)`, computed once per pass."""
        for dtype, device in dtypes:
            self.ensure(dtype, device)
        return self.pass_.apply(graph)


def graph_dtypes(graph: torch.fx.Graph) -> set[tuple[torch.dtype, str]]:
    """(floating dtype, device type) pairs of the tensors in `graph` that fusekit can trace for."""
    traceable = {"cpu"} | ({"cuda"} if torch.cuda.is_available() else set())
    out = set()
    for n in graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, Tensor) and v.is_floating_point() and v.device.type in traceable:
            out.add((v.dtype, v.device.type))
    return out


@functools.cache
def all_patterns() -> tuple[Pattern, ...]:
    from .patterns import PATTERNS

    ids = [p.id for p in PATTERNS]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate pattern ids: {sorted(dup)}")
    register_cpu_references(PATTERNS)
    return tuple(PATTERNS)


def by_id(pattern_id: str) -> Pattern:
    for p in all_patterns():
        if p.id == pattern_id:
            return p
    raise KeyError(pattern_id)


@functools.cache
def compiled(pattern_id: str) -> Compiled:
    """Trace and register one pattern, once per process."""
    return Compiled(by_id(pattern_id))


def select(patterns: Sequence[str] | None, disable: Sequence[str] = ()) -> tuple[str, ...]:
    """Resolve `options["patterns"]`/`["disable"]` (ids or family names) to pattern ids, in table order."""
    every = [p.id for p in all_patterns()]

    def expand(names: Sequence[str], what: str) -> set[str]:
        out = set()
        for n in names:
            hit = [i for i in every if i == n or i.split(".", 1)[0] == n]
            if not hit:
                raise ValueError(f"fusekit: unknown pattern or family {n!r} in options[{what!r}]; "
                                 f"known: {every}")
            out.update(hit)
        return out

    chosen = set(every) if patterns is None else expand(patterns, "patterns")
    chosen -= expand(disable, "disable")
    return tuple(i for i in every if i in chosen)


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
        if pattern.op in ops.OUT_LIKE_FIRST:  # the fake's layout: q's
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

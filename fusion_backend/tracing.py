"""Tracing: each rule's reference traced into a search pattern (PatternExpr), as Inductor's own graphs are
(``fwd_only``, or ``trace="inductor"``: the graph Inductor hands its post-grad pass), and the rewrites of a
traced pattern into the other graphs it must match (commuted operands, the copy a head-transposed matmul
operand gets, a direct bmm, the fp32 form without its downcast). forms.py applies them and keeps the result."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch._inductor import pattern_matcher as pm

from .registry import Pattern, _with_signature

aten = torch.ops.aten
_COMMUTATIVE = {aten.add.Tensor, aten.mul.Tensor}


def _dummy_scalars(pattern: Pattern) -> dict[str, float | int]:
    """Distinctive stand-ins so each scalar shows up as its own literal in the traced graph."""
    out: dict[str, float | int] = {}
    for i, (name, kind) in enumerate(pattern.params):
        if kind == "float":
            out[name] = 0.2718 + 0.0137 * i
        elif kind == "int":
            out[name] = -77 + i
    return out


# A rule input in a pattern: a plain one, or one that must bind a node no other exclusive input binds
# (Pattern.exclusive).
_ARGS = (pm.KeywordArg, pm.ExclusiveKeywordArg)


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
    """Every variant of `expr` with the operands of commutative aten ops swapped where one operand is an
    input of the rule (`v + q * k`, `bias + y * s`: how user code may spell it). Inside a decomposition
    (GELU's erf/tanh chain, SDPA's math) torch fixes the order, so those are matched as traced: swapping
    them too made 2^n variants of a rule (204 for the tanh-GELU matmul epilogue) that no graph holds."""
    return _dag_variants(
        expr,
        lambda e: (len(e.args) == 2 and bool(set(e.fns) & _COMMUTATIVE)
                   and all(isinstance(a, pm.PatternExpr) for a in e.args)
                   and any(isinstance(a, _ARGS) for a in e.args)),
        lambda e, args: pm.CallFunction(e.fns, *args[::-1], _users=e.users, **e.kwargs))


def _relaxed(expr: Any) -> Any:
    """`expr` with the one-user constraint dropped, to explain sites where an intermediate is reused."""
    return _map_dag(expr, lambda e, args, kwargs: pm.CallFunction(e.fns, *args, _users=pm.MULTIPLE, **kwargs))


def _size(expr: Any, memo: dict[int, int] | None = None) -> int:
    """Calls in `expr` counted as a tree (a shared sub-pattern once per use), each sub-pattern's count made once."""
    memo = {} if memo is None else memo
    if id(expr) in memo:
        return memo[id(expr)]
    if isinstance(expr, pm.MultiOutputPattern):
        n = sum(_size(e, memo) for e in expr.outputs)
    elif isinstance(expr, pm.CallFunction):
        n = 1 + sum(_size(e, memo) for e in (*expr.args, *expr.kwargs.values()))
    else:
        n = 0
    memo[id(expr)] = n
    return n


def _keyword_names(expr: Any) -> set[str]:
    if isinstance(expr, _ARGS):
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


def inverse_fns(inverse: dict[str, int]) -> dict[str, Callable[[Any], Any]]:
    """{param: the function that undoes its traced form} from `trace_search_pattern_and_forms`'s indices."""
    return {name: _SCALAR_FORMS[i][1] for name, i in inverse.items()}


def trace_search_pattern_and_forms(pattern: Pattern, dtype: torch.dtype, device: Any,
                                   fn: Callable[..., Any] | None = None,
                                   pad: bool | None = None) -> tuple[Any, dict[str, int]]:
    """(PatternExpr, {param: index into _SCALAR_FORMS}) for the parameters that appear transformed.
    `pad` (``trace="inductor"``): Inductor's pad_mm off (False) or forced (True); None: its own choice."""
    dummies = _dummy_scalars(pattern)
    tensors = iter(pattern.inputs(pattern.trace_case, dtype, device))
    args = [next(tensors) if k == "tensor" else dummies[n] for n, k in pattern.params if k != "static"]
    fn = fn or pattern.search_fn()
    if pattern.trace == "inductor":
        names = [n for n, k in pattern.params if k == "tensor"]
        bound = dict(zip(pattern.arg_names, args))
        gm = post_grad_graph(_with_signature(
            lambda *t: fn(*[(bound | dict(zip(names, t)))[n] for n in pattern.arg_names]), names),
                             [bound[n] for n in names], pad)
        argnames = names
    else:
        gm = pm.fwd_only(fn, args)
        argnames = pattern.arg_names
    floats, ints = _literals(gm)
    workaround, inverse = {}, {}
    for name, d in dummies.items():
        for i, (form, _) in enumerate(_SCALAR_FORMS if isinstance(d, float) else _SCALAR_FORMS[:1]):
            if form(d) in (floats if isinstance(d, float) else ints):
                workaround[name] = form(d)
                if form(d) != d:
                    inverse[name] = i
                break
    expr = pm.fx_to_pattern(gm, argnames=argnames, scalar_workaround=workaround, exclusive_arg_names=pattern.exclusive)
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


@contextlib.contextmanager
def woq_lowering_off() -> Any:
    """Inductor's woq_int8 lowering (a bf16 int8 weight-only linear into aten._weight_int8pack_mm) switched off, so
    that a trace does not depend on whether this process registered it or whether it fires: a rule declares the
    lowered form as a graph form (patterns/decode_gemm.py's int8 weight-only rules)."""
    from torch._inductor.fx_passes import post_grad

    from .lowered import is_woq_lowering

    post_grad.lazy_init()
    woq = [e for d in post_grad.pass_patterns for es in d.patterns.values() for e in es
           if is_woq_lowering(getattr(e, "handler", None))]
    checks = [e.extra_check for e in woq]
    for e in woq:
        e.extra_check = lambda match: False
    try:
        yield
    finally:
        for e, c in zip(woq, checks):
            e.extra_check = c


def post_grad_graph(fn: Callable[..., Any], args: Sequence[Tensor], pad: bool | None = None) -> torch.fx.GraphModule:
    """The graph Inductor hands to its post-grad custom pass for ``fn(*args)``, captured by stopping
    ``compile_fx`` there. SDPA is traced on its math backend: that is the decomposition Inductor emits
    whenever it does not pick a fused attention kernel. `pad`: Inductor's pad_mm pass (zero-pads a
    misaligned fp16/bf16 bmm on CUDA when its on-device benchmark finds that faster, then slices the result
    back) off (False) or forced (True), so that a traced form does not depend on a benchmark's outcome."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    box: dict[str, torch.fx.Graph] = {}

    class Capture:
        def __call__(self, graph: torch.fx.Graph) -> None:
            from . import lowered

            lowered.expand(graph)  # as the pass sees it
            box["graph"] = graph
            raise _Captured

        def uuid(self) -> None:  # never cached
            return None

    gm = torch.fx.symbolic_trace(_positional(fn))
    padding = {} if pad is None else {"shape_padding": pad, "force_shape_pad": pad}
    with torch._guards.tracing(None), torch.no_grad(), sdpa_kernel(SDPBackend.MATH), woq_lowering_off(), \
            inductor_config.patch(post_grad_custom_post_pass=Capture(), post_grad_custom_pre_pass=None, **padding):
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


_SPLIT_OPS = {aten.split.Tensor, aten.split_with_sizes.default}


def _shape_wildcards(expr: Any) -> Any:
    """Sizes in view/reshape/expand/full and the split size of split/split_with_sizes, and device kwargs, match
    anything (the graph's shapes, static or symbolic; a rule whose result depends on where a split falls checks it
    in a guard); reduction dims, split dims, permutations and dtypes stay exact. Shared nodes stay shared."""
    def wild(e: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if set(e.fns) & _SHAPE_OPS:
            args = [pm.Ignored() if isinstance(a, (list, tuple)) else a for a in args]
        if set(e.fns) & _SPLIT_OPS and len(args) > 1:
            args = [args[0], pm.Ignored(), *args[2:]]
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
                         and isinstance(e.args[0], _ARGS), lambda e, args: args[0])


def _downcast_root(expr: Any, dtype: torch.dtype | tuple[torch.dtype, ...]) -> Any:
    """What `expr` downcasts to `dtype` (or one of several) at its root (convert_element_type(X, dtype), X computed
    wider), or None."""
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if isinstance(expr, pm.CallFunction) and torch.ops.prims.convert_element_type.default in expr.fns \
            and len(expr.args) == 2 and expr.args[1] in dtypes and isinstance(expr.args[0], pm.CallFunction):
        return expr.args[0]
    return None

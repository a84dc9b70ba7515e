"""Matching: each rule's search forms become Inductor pattern-matcher entries once; a compile runs them in
one pass per family.

Entries are made once per (rule, dtype, device) and kept. A compile builds one ``PatternMatcherPass`` per
family, in table order (a family's chains may hold another's: patterns/__init__.py orders them), and offers it only the entries that can match this graph: every op of the entry occurs in it,
and every parent -> child edge at its argument position. Inside a family a node is offered the entries
anchored at its op in table order, longest first, so a chain wins over a rule for its own suffix; the pass
walks the graph from its outputs, so a chain also wins over a rule for its prefix (anchored earlier).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor
from torch._inductor import pattern_matcher as pm

from . import guards as G
from . import forms, ops, registry, tracing, table
from .registry import Pattern
from .stats import PassRun

Ops = forms.Ops


@dataclasses.dataclass(frozen=True, eq=False)
class Entry:
    """A pattern-matcher entry and what a graph must hold for it to match anywhere."""

    key: tuple[str, Any]                      # (op, target) of the node it is anchored at
    entry: pm.PatternEntry
    pattern_id: str
    order: int                                # its rule's place in the table
    size: int                                 # nodes in the pattern: longer first at one anchor
    ops: frozenset[Ops]                       # each must meet the graph's targets
    edges: frozenset[tuple[Ops, int, Ops]]    # (parent, argument index, child), each must occur


class GraphIndex:
    """The targets and the (parent, argument index, child) target edges of a graph's call_function nodes."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.targets: set[Any] = set()
        self.edges: set[tuple[Any, int, Any]] = set()
        for n in graph.nodes:
            if n.op != "call_function":
                continue
            self.targets.add(n.target)
            for i, a in enumerate(n.args):
                if isinstance(a, torch.fx.Node) and a.op == "call_function":
                    self.edges.add((n.target, i, a.target))

    def fits(self, ops: Iterable[Ops], edges: Iterable[tuple[Ops, int, Ops]]) -> bool:
        return all(not f.isdisjoint(self.targets) for f in ops) and all(
            any((p, i, c) in self.edges for p in parents for c in children) for parents, i, children in edges)


def rule_dtype(p: Pattern, dtype: torch.dtype) -> torch.dtype:
    """The dtype whose entries `p` offers a graph holding `dtype`: an unsupported dtype still gets the
    first one's, so that its sites show up as dtype near misses."""
    return dtype if dtype in p.dtypes else p.dtypes[0]


def rule_pairs(p: Pattern, dtypes: Sequence[tuple[torch.dtype, str]],
               firing_only: bool = False) -> list[tuple[torch.dtype, str]]:
    """The (rule dtype, device) pairs whose entries `p` offers a graph holding `dtypes`, each once. `firing_only`:
    without the pairs that could only explain a near miss (a CUDA dtype the op's kernel does not take: Falcon's
    float32 rotary and softmax gave the decode rules 39% of its match attempts)."""
    pairs = dict.fromkeys((rule_dtype(p, dt), dev) for dt, dev in dtypes)
    return [(dt, dev) for dt, dev in pairs
            if not firing_only or dev != "cuda" or ops.cuda_kernel_takes(p.op, dt)]


@functools.cache
def _form_entries(pattern_id: str, dtype: torch.dtype, device: str, i: int, verify: bool) -> tuple[Entry, ...]:
    """The entries of one search form, made once per process, on first use. They hold no guards: a pass
    binds them to its run (guards.bind)."""
    p = table.by_id(pattern_id)
    form = forms.search_forms(p, dtype, device)[i]
    # a plain dict, not a PatternMatcherPass: register_replacement would pretty-print the pattern to find duplicates in
    # it (most of the entries' making time), and a store that holds one form has none
    store: collections.defaultdict = collections.defaultdict(list)
    pm.register_replacement(p.search_fn(), _replacement_fn(p, tracing.inverse_fns(form.inverse),
                                                           {"out_dtype": torch.float32} if form.cast else {}, verify),
                            list(p.inputs(p.trace_case, dtype, device)), pm.fwd_only, [store],
                            scalar_workaround=tracing._dummy_scalars(p), search_fn_pattern=form.expr,
                            **({"extra_check": _returned} if form.cast and not p.cast_any_user else {}))
    order = table.position(pattern_id)
    unique = {id(e): e for es in store.values() for e in es}  # (one entry under several keys)
    size = {i: tracing._size(e.pattern) for i, e in unique.items()}
    out = tuple(Entry(key, e, pattern_id, order, size[id(e)], *form.needs) for key, es in store.items() for e in es)
    for e in unique.values():
        e.pattern = Prechecked.of(e.pattern)
    return out


class Prechecked:
    """An entry's search pattern behind a test of the anchor's inputs: the op each argument that the pattern
    spells as a call must come from. Inductor's matcher builds a match context for every entry offered at a node;
    most of a graph's attempts fail at once, on the anchor's first argument (Falcon's SDPA decomposition offered
    each of 22 casts 192 decode entries), and this fails them before that."""

    __slots__ = ("pattern", "nargs", "needs")

    def __init__(self, pattern: pm.CallFunction, nargs: int, needs: tuple[tuple[int, str, Any], ...]) -> None:
        self.pattern, self.nargs, self.needs = pattern, nargs, needs

    @classmethod
    def of(cls, pattern: Any) -> Any:
        if type(pattern) is not pm.CallFunction:
            return pattern
        needs = tuple((i, a.op, a.fns_set) for i, a in enumerate(pattern.args) if type(a) is pm.CallFunction)
        return cls(pattern, len(pattern.args), needs) if needs else pattern

    def match(self, node: torch.fx.Node) -> Any:
        args = node.args
        if len(args) != self.nargs:
            return _DIFFERENT_INPUTS
        for i, op, fns in self.needs:
            a = args[i]
            if not isinstance(a, torch.fx.Node) or a.op != op or pm.extract_target(a) not in fns:
                return _DIFFERENT_INPUTS
        return self.pattern.match(node)

    def __getattr__(self, name: str) -> Any:  # the rest of the pattern's interface
        if name == "pattern":
            raise AttributeError(name)
        return getattr(self.pattern, name)

    def __repr__(self) -> str:
        return repr(self.pattern)


_DIFFERENT_INPUTS = pm.FailedMatch("the anchor's inputs come from other ops")


def entries(pattern_id: str, dtype: torch.dtype, device: str, index: GraphIndex | None = None,
            verify: bool = False) -> list[Entry]:
    """The entries of one rule in one dtype on one device; with `index`, only those of the search forms
    that fit that graph (no other form is loaded or made into entries)."""
    p = table.by_id(pattern_id)
    if index is not None and not index.fits(*forms.common_requirements(p, dtype, device)):
        return []
    return [e for i, f in enumerate(forms.search_forms(p, dtype, device))
            if index is None or index.fits(*f.needs) for e in _form_entries(pattern_id, dtype, device, i, verify)]


@functools.cache
def relaxed(pattern_id: str, dtype: torch.dtype, device: str) -> tuple[tuple[Any, frozenset, frozenset], ...]:
    """The rule's own search forms with the one-user constraint dropped, with their requirements: they
    find the sites where an intermediate value is reused (for the report only)."""
    out, seen = [], set()
    for form in forms.search_forms(table.by_id(pattern_id), dtype, device):
        if form.cast:
            continue  # near misses are explained for the rule's own form only
        r = tracing._relaxed(form.expr)
        key = pm.PatternPrettyPrinter.run(r)
        if key not in seen:
            seen.add(key)
            out.append((r, *form.needs))  # (the one-user constraint is not a requirement)
    return tuple(out)


def graph_dtypes(graph: torch.fx.Graph) -> list[tuple[torch.dtype, str]]:
    """(floating dtype, device type) pairs of the tensors in `graph` that fusekit can trace for, sorted."""
    traceable = {"cpu"} | ({"cuda"} if torch.cuda.is_available() else set())
    out = set()
    for n in graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, Tensor) and v.is_floating_point() and v.device.type in traceable:
            out.add((v.dtype, v.device.type))
    return sorted(out, key=str)


@dataclasses.dataclass
class FamilyPass:
    family: str
    pattern_ids: list[str]
    pass_: pm.PatternMatcherPass
    attempts: int            # match attempts it will make: entries offered, summed over the graph's nodes


def family_passes(graph: torch.fx.Graph, pattern_ids: Sequence[str], dtypes: Sequence[tuple[torch.dtype, str]],
                  run: PassRun, firing_only: bool = False) -> list[FamilyPass]:
    """One pass per family of `pattern_ids` (table order), each holding only the entries that fit `graph`,
    bound to `run` (its options, and where it records what it did)."""
    index = GraphIndex(graph)
    out: dict[str, FamilyPass] = {}
    chosen: dict[str, list[Entry]] = {}
    for pid in pattern_ids:
        family = pid.split(".", 1)[0]
        fp = out.setdefault(family, FamilyPass(family, [], pm.PatternMatcherPass(pass_name=f"fusekit:{family}"), 0))
        fp.pattern_ids.append(pid)
        for dtype, device in rule_pairs(table.by_id(pid), dtypes, firing_only):
            chosen.setdefault(family, []).extend(entries(pid, dtype, device, index, run.options.verify))
    for family, es in chosen.items():
        patterns = out[family].pass_.patterns
        for e in sorted(es, key=lambda e: (e.order, -e.size)):  # stable: registration order breaks ties
            patterns[e.key].append(G.bind(table.by_id(e.pattern_id), e.entry, run))
    for fp in out.values():
        fp.attempts = sum(len(fp.pass_.patterns.get((n.op, n.target), ())) for n in graph.nodes)
    return list(out.values())


def near_misses(graph: torch.fx.Graph, pid: str, dtypes: Sequence[tuple[torch.dtype, str]],
                index: GraphIndex) -> Iterable[tuple[torch.fx.Node, pm.Match, list[torch.fx.Node]]]:
    """(anchor, relaxed match, reused intermediates) where `pid`'s chain occurs but an intermediate value
    has another user, so the rule itself cannot match."""
    p = table.by_id(pid)
    for dtype, device in rule_pairs(p, dtypes):
        if not index.fits(*forms.common_requirements(p, dtype, device)):
            continue
        for expr, ops, edges in relaxed(pid, dtype, device):
            if not index.fits(ops, edges):
                continue
            for node in [n for fn in dict.fromkeys(expr.fns) for n in graph.find_nodes(op="call_function", target=fn)]:
                m = expr.match(node)
                if not pm.is_match(m):
                    continue
                inside = set(m.nodes)
                shared = [n for n in m.nodes if n is not node and any(u not in inside for u in n.users)]
                if shared:
                    yield node, m, shared


# ---- replacements -------------------------------------------------------------------------------
def _replacement_fn(pattern: Pattern, inverse: Mapping[str, Callable[[Any], Any]] = {},
                    static: Mapping[str, Any] = {}, verify: bool = False) -> Callable[..., Any]:
    def replace(*args: Any) -> Any:
        args = [inverse[n](a) if n in inverse else a for n, a in zip(pattern.arg_names, args)]
        out = registry.call_op(pattern, args, static)
        return _verified(pattern, args, out) if verify else out

    return registry._with_signature(replace, pattern.arg_names)


def _verified(pattern: Pattern, args: Sequence[Any], out: Any) -> Any:
    """`out` through fusekit::verify; its site ("" here) is filled in by the pass (guards.bind)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    tensors = [a if isinstance(a, Tensor) else None for a in args]
    floats = [0.0 if isinstance(a, Tensor) else float(a) for a in args]
    checked = torch.ops.fusekit.verify(outs, tensors, floats, pattern.id, "")
    return tuple(checked) if isinstance(out, (tuple, list)) else checked[0]


def _returned(match: pm.Match) -> bool:
    """The match's result is only returned from the graph (the check of a search form with an fp32 cast): an
    fp32 result that feeds more work is read back by Inductor's kernel for it, and fp32 costs that kernel
    twice the bytes of 16 bits."""
    return all(u.op == "output" for u in match.output_nodes()[0].users)

"""Matching: each rule's search forms become Inductor pattern-matcher entries once; a compile runs them in
one pass per family.

Entries are made once per (rule, dtype, device) and kept. A compile builds one ``PatternMatcherPass`` per
family, in table order (a family's chains may hold another's: patterns/__init__.py orders them), each when the one
before has run, and offers it only the entries that can match the graph as the families before left it: the entry's
whole tree of calls occurs in it (forms.Call: each call at a node of one of its ops, with its argument count and its
argument calls at their positions), not only each op and each parent -> child edge somewhere. Inside a family a
node is offered the entries anchored at its op in table order, longest first, so a chain wins over a rule for its own
suffix; the pass walks the graph from its outputs, so a chain also wins over a rule for its prefix (anchored earlier).
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


class GraphIndex:
    """A graph's call_function nodes by target, and their (parent, argument index, child) target edges."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.nodes: dict[Any, list[torch.fx.Node]] = collections.defaultdict(list)
        self.edges: set[tuple[Any, int, Any]] = set()
        for n in graph.nodes:
            if n.op != "call_function":
                continue
            self.nodes[n.target].append(n)
            for i, a in enumerate(n.args):
                if isinstance(a, torch.fx.Node) and a.op == "call_function":
                    self.edges.add((n.target, i, a.target))
        self._holds: dict[tuple[int, torch.fx.Node], bool] = {}  # (id of a Call, node): the call's tree is there

    def fits(self, ops: Iterable[Ops], edges: Iterable[tuple[Ops, int, Ops]]) -> bool:
        return all(not f.isdisjoint(self.nodes) for f in ops) and all(
            any((p, i, c) in self.edges for p in parents for c in children) for parents, i, children in edges)

    def occurs(self, calls: Iterable[forms.Call]) -> bool:
        """Each call tree (a search form's, at each of its outputs) is somewhere in the graph."""
        return all(any(self._at(c, n) for fn in c.fns for n in self.nodes.get(fn, ())) for c in calls)

    def _at(self, call: forms.Call, node: torch.fx.Node) -> bool:
        """`call`'s tree holds at `node`, whose target is one of the call's."""
        key = (id(call), node)
        if key not in self._holds:
            args = node.args
            self._holds[key] = len(args) == call.nargs and all(
                isinstance(a := args[i], torch.fx.Node) and a.op == "call_function" and a.target in c.fns
                and self._at(c, a) for i, c in call.args)
        return self._holds[key]


def rule_dtype(p: Pattern, dtype: torch.dtype) -> torch.dtype:
    """The dtype whose entries `p` offers a graph holding `dtype`: an unsupported dtype still gets the
    first one's, so that its sites show up as dtype near misses."""
    return dtype if dtype in p.dtypes else p.dtypes[0]


def rule_pairs(p: Pattern, dtypes: Sequence[tuple[torch.dtype, str]],
               firing_only: bool = False) -> list[tuple[torch.dtype, str]]:
    """The (rule dtype, device) pairs whose entries `p` offers a graph holding `dtypes`, each once. `firing_only`:
    without the pairs that could only explain a near miss: a graph dtype the rule lacks (its first dtype's forms
    stand in; a float32 CUDA graph was offered, and traced, every bf16-only rule's float16 forms) or a CUDA dtype the
    op's kernel does not take (Falcon's float32 rotary and softmax gave the decode rules 39% of its match attempts)."""
    pairs = dict.fromkeys((rule_dtype(p, dt), dev) for dt, dev in dtypes
                          # an int8 rule (dequantize) is offered for the floating graph dtypes it is found by
                          if not firing_only or dt in p.dtypes or not p.dtypes[0].is_floating_point)
    return [(dt, dev) for dt, dev in pairs
            if not firing_only or dev != "cuda" or ops.cuda_kernel_takes(p.op, dt)]


@functools.cache
def _form_entries(pattern_id: str, dtype: torch.dtype, device: str, i: int, verify: bool) -> tuple[Entry, ...]:
    """The entries of one search form, made once per process, on first use. They hold no guards: a pass
    binds them to its run (guards.bind)."""
    p = table.by_id(pattern_id)
    form = forms.search_form(p, dtype, device, i)
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
    out = tuple(Entry(key, e, pattern_id, order, size[id(e)]) for key, es in store.items() for e in es)
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
    that can match that graph (no other form is unpickled or made into entries)."""
    p = table.by_id(pattern_id)
    if index is not None and not index.fits(*forms.common_requirements(p, dtype, device)):
        return []
    return [e for i, h in enumerate(forms.heads(p, dtype, device)) if index is None or _fits(index, h)
            for e in _form_entries(pattern_id, dtype, device, i, verify)]


def _fits(index: GraphIndex, head: forms.Head) -> bool:
    return index.fits(*head.needs) and index.occurs(head.calls)  # (the ops and edges first: they cost less)


@functools.cache
def relaxed(pattern_id: str, dtype: torch.dtype, device: str, i: int) -> Any:
    """The rule's i-th search form with the one-user constraint dropped: it finds the sites where an intermediate
    value is reused (for the report only)."""
    return tracing._relaxed(forms.search_form(table.by_id(pattern_id), dtype, device, i).expr)


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


def families(pattern_ids: Sequence[str]) -> dict[str, list[str]]:
    """{family: its rules among `pattern_ids`}, both in table order."""
    out: dict[str, list[str]] = {}
    for pid in pattern_ids:
        out.setdefault(table.family(pid), []).append(pid)
    return out


def family_pass(graph: torch.fx.Graph, family: str, pattern_ids: Sequence[str],
                dtypes: Sequence[tuple[torch.dtype, str]], run: PassRun, firing_only: bool = False) -> FamilyPass:
    """The pass of `family`'s rules `pattern_ids`, holding only the entries that can match `graph` as it is now (made
    after the families before have run: their rewrites take nodes its rules would otherwise be offered at), bound to
    `run` (its options, and where it records what it did)."""
    index = GraphIndex(graph)
    fp = FamilyPass(family, list(pattern_ids), pm.PatternMatcherPass(pass_name=f"fusekit:{family}"), 0)
    chosen = [e for pid in pattern_ids for dtype, device in rule_pairs(table.by_id(pid), dtypes, firing_only)
              for e in entries(pid, dtype, device, index, run.options.verify)]
    for e in sorted(chosen, key=lambda e: (e.order, -e.size)):  # stable: registration order breaks ties
        fp.pass_.patterns[e.key].append(G.bind(table.by_id(e.pattern_id), e.entry, run))
    fp.attempts = sum(len(fp.pass_.patterns.get(("call_function", t), ())) * len(ns) for t, ns in index.nodes.items())
    return fp


def near_misses(graph: torch.fx.Graph, pid: str, dtypes: Sequence[tuple[torch.dtype, str]],
                index: GraphIndex) -> Iterable[tuple[torch.fx.Node, pm.Match, list[torch.fx.Node]]]:
    """(anchor, relaxed match, reused intermediates) where `pid`'s chain occurs but an intermediate value
    has another user, so the rule itself cannot match."""
    p = table.by_id(pid)
    for dtype, device in rule_pairs(p, dtypes):
        if not index.fits(*forms.common_requirements(p, dtype, device)):
            continue
        for i, head in enumerate(forms.heads(p, dtype, device)):
            if not head.explains or not _fits(index, head):
                continue
            expr = relaxed(pid, dtype, device, i)
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

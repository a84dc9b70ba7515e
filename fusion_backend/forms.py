"""Search forms: what each rule is matched as. Every traced pattern of a rule (tracing.py), expanded into the
graphs it must also match (commuted operands, the copy a head-transposed operand gets, a direct bmm, the
fp32 form without its downcast), each with a head: what a graph must hold for it to match anywhere.
Tracing costs about a second a rule, so the forms are kept in memory for the process and pickled under
``$FUSEKIT_CACHE/patterns/`` (keyed by torch's version and the sources that shape a trace), as Inductor keeps
its serialized SDPA patterns: a new process loads them instead of tracing again. A rule's file holds its forms'
heads apart from their patterns, so a compile reads the heads and unpickles only the forms its graph could match.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import inspect
import io
import itertools
import os
import pathlib
import pickle
import sys
import warnings
from typing import Any, NamedTuple

import torch
from torch._inductor import pattern_matcher as pm

from .registry import Pattern
from .tracing import (_clone_variants, _commuted, _downcast_root, _expand_variants, _relaxed,
                      trace_search_pattern_and_forms)


Ops = frozenset  # the targets one pattern node accepts (a view, a reshape and an _unsafe_view are one)
Requirements = tuple[frozenset, frozenset]  # (ops, (parent, argument index, child) edges)


def requirements(expr: Any) -> Requirements:
    """The ops, and the positional parent -> child edges, that every graph `expr` matches in holds (what
    Inductor's ``_TargetArgsExpr._match`` checks first: the node's target, then each argument's)."""
    ops: set[Ops] = set()
    edges: set[tuple[Ops, int, Ops]] = set()
    seen: set[int] = set()

    def go(e: Any) -> None:
        if isinstance(e, (list, tuple)):
            for x in e:
                go(x)
        elif isinstance(e, pm.MultiOutputPattern):
            for o in e.outputs:
                go(o)
        elif isinstance(e, pm.CallFunction) and id(e) not in seen:
            seen.add(id(e))
            fns = Ops(e.fns)
            ops.add(fns)
            for i, a in enumerate(e.args):
                if isinstance(a, pm.CallFunction):
                    edges.add((fns, i, Ops(a.fns)))
                go(a)
            for v in e.kwargs.values():
                go(v)

    go(expr)
    return frozenset(ops), frozenset(edges)


class Call(NamedTuple):
    """A call of a search form as a graph must hold it: one of `fns` with `nargs` positional arguments, those at the
    positions in `args` calls themselves (Inductor's ``_TargetArgsExpr._match`` checks the target and the argument
    count, then each argument). A rule input, a literal and a keyword argument match anything here."""

    fns: Ops
    nargs: int
    args: tuple[tuple[int, "Call"], ...]


def calls(expr: Any, made: dict[tuple, Call]) -> tuple[Call, ...]:
    """The call trees at `expr`'s outputs (its anchor first). `made` holds the calls made so far, by their targets,
    argument count and argument calls: the forms of a rule share one Call per distinct sub-tree (a graph check of
    one holds for all)."""
    def go(e: pm.CallFunction) -> Call:
        args = tuple((i, go(a)) for i, a in enumerate(e.args) if type(a) is pm.CallFunction)
        key = (Ops(e.fns), len(e.args), tuple((i, id(c)) for i, c in args))
        return made.setdefault(key, Call(*key[:2], args))

    outs = expr.outputs if isinstance(expr, pm.MultiOutputPattern) else [expr]
    return tuple(go(o) for o in outs if type(o) is pm.CallFunction)


@dataclasses.dataclass(frozen=True)
class Head:
    """What a graph must hold for a search form to match anywhere: its ops and edges, and the call trees at its
    outputs. `explains`: its pattern, relaxed, explains near misses (a rule's own form, the first of its kind)."""

    needs: Requirements
    calls: tuple[Call, ...]
    explains: bool


@dataclasses.dataclass(frozen=True)
class SearchForm:
    """One search pattern of a rule: the PatternExpr, the scalar forms its replacement undoes, and whether it
    is the fp32 computation without the rule's downcast (the op then stores out_dtype=float32)."""

    expr: Any
    inverse: dict[str, int]
    cast: bool


class _Rule:
    """A rule's search forms in one dtype on one device: what all of them need, each one's head, and each form;
    the heads and each form held as their pickles until first used (most rules a graph is offered fail on what all
    forms need, most forms of the others on their heads)."""

    def __init__(self, common: Requirements, heads: list[Head] | bytes, forms: list[SearchForm | bytes]) -> None:
        self.common, self._heads, self.forms = common, heads, forms

    @property
    def heads(self) -> list[Head]:
        if isinstance(self._heads, bytes):
            self._heads = _unpickle(self._heads)
        return self._heads


_RULES: dict[tuple[str, torch.dtype, str], _Rule] = {}


def _rule(pattern: Pattern, dtype: torch.dtype, device: str) -> _Rule:
    """From memory, else from the disk cache, else traced (and then written to both)."""
    key = (pattern.id, dtype, device)
    if key not in _RULES:
        path = _cache_path(pattern, dtype, device)
        rule = _load(path)
        if rule is None:
            forms, heads = _trace_forms(pattern, dtype, device)
            rule = _Rule(_common(heads), heads, forms)
            _store(path, rule)
        _RULES[key] = rule
    return _RULES[key]


def common_requirements(pattern: Pattern, dtype: torch.dtype, device: str) -> Requirements:
    """What every search form of the rule needs: a graph without it is not offered the rule at all."""
    return _rule(pattern, dtype, device).common


def heads(pattern: Pattern, dtype: torch.dtype, device: str) -> list[Head]:
    """The head of each search form of `pattern` in `dtype` on `device` (search_form(..., i) is the i-th form)."""
    return _rule(pattern, dtype, device).heads


def search_form(pattern: Pattern, dtype: torch.dtype, device: str, i: int) -> SearchForm:
    rule = _rule(pattern, dtype, device)
    if isinstance(rule.forms[i], bytes):
        rule.forms[i] = _unpickle(rule.forms[i])
    return rule.forms[i]


def search_forms(pattern: Pattern, dtype: torch.dtype, device: str) -> list[SearchForm]:
    """Every search pattern of `pattern` in `dtype` on `device`, commuted and shape variants included, each once."""
    return [search_form(pattern, dtype, device, i) for i in range(len(heads(pattern, dtype, device)))]


def _common(heads: list[Head]) -> Requirements:
    ops = frozenset.intersection(*(h.needs[0] for h in heads))
    edges = frozenset.intersection(*(h.needs[1] for h in heads))
    return ops, edges


def _trace_forms(p: Pattern, dtype: torch.dtype, device: str) -> tuple[list[SearchForm], list[Head]]:
    out: list[SearchForm] = []
    heads: list[Head] = []
    seen: set[str] = set()
    relaxed: set[str] = set()  # near misses are explained once per relaxed pattern, by the rule's own forms
    made: dict[tuple, Call] = {}
    # A rule traced through Inductor is traced with pad_mm off: the pass matches the unpadded graph (unpad.py)
    pad = False if p.trace == "inductor" and device == "cuda" else None
    for fn in (None, *p.variants, *p.graph_forms):
        traced, inverse = trace_search_pattern_and_forms(p, dtype, device, fn, pad)
        forms = [(traced, False)]
        if torch.float32 in p.output_casts and dtype != torch.float32:
            # (an int8 rule's result: the 16-bit dtype its trace downcasts to)
            cast = _downcast_root(traced, dtype if dtype.is_floating_point else (torch.float16, torch.bfloat16))
            if cast is not None:  # the computation without its downcast: its fp32 result written by the op
                forms.append((cast, True))
        for form, is_cast in forms:
            # a variant marked exact_clones keeps the clones its trace has (one decode shape) instead of taking
            # every expand->reshape with and without one: 2^n forms, each offered at every node of the root's op
            exact = getattr(p.reference if fn is None else fn, "exact_clones", False)
            shapes = _clone_variants(form) if p.trace == "inductor" and not exact else [form]
            if p.expand_optional:
                shapes = [x for c in shapes for x in _expand_variants(c)]
            for expr in [c for e in shapes for c in _commuted(e)]:
                key = pm.PatternPrettyPrinter.run(expr)
                if key not in seen:
                    seen.add(key)
                    loose = None if is_cast else pm.PatternPrettyPrinter.run(_relaxed(expr))
                    explains = loose is not None and loose not in relaxed
                    relaxed.add(loose)
                    out.append(SearchForm(expr, inverse, is_cast))
                    heads.append(Head(requirements(expr), calls(expr, made), explains))
    return out, heads


# ---- the disk cache -------------------------------------------------------------------------------
def _load_op(namespace: str, name: str, overload: str) -> Any:
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _multiple() -> Any:
    return pm.MULTIPLE


class _Pickler(pickle.Pickler):
    """OpOverloads by name (they do not pickle), and the MULTIPLE singleton as itself (tested with `is`)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return _load_op, (obj.namespace, obj._opname, obj._overloadname)
        if obj is pm.MULTIPLE:
            return _multiple, ()
        return NotImplemented


@functools.cache
def source_key() -> str:
    """What a traced pattern depends on: torch, Python, the pattern tables and the engine that traces them."""
    from . import patterns

    files = sorted(pathlib.Path(patterns.__file__).parent.glob("*.py"))
    files += [pathlib.Path(__file__), pathlib.Path(inspect.getfile(_commuted)),
              pathlib.Path(inspect.getfile(Pattern))]
    h = hashlib.sha256(f"{torch.__version__} {sys.version_info[:2]}".encode())
    for f in files:
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> pathlib.Path:
    root = pathlib.Path(os.environ.get("FUSEKIT_CACHE", "~/.cache/fusekit")).expanduser()
    return root / "patterns" / f"torch{torch.__version__}-{source_key()}"



def _cache_path(p: Pattern, dtype: torch.dtype, device: str) -> pathlib.Path:
    return cache_dir() / f"{p.id}-{str(dtype)[6:]}-{device}.pkl"


def _unpickle(data: bytes) -> Any:
    # without the cyclic GC: the objects unpickled all live on, and the full collections their allocation set off
    # each walk the whole compile's heap (CPU Falcon decode step: 0.47 of 0.49 s unpickling its rules)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch 2.13+: the pytree specs of list arguments
            return pickle.loads(data)
    finally:
        if enabled:
            gc.enable()


def _load(path: pathlib.Path) -> _Rule | None:
    """The rule in the cache file: what all its forms need and the lengths of the pickles after it (the heads', then
    each form's), unpickled; those pickles read and kept."""
    try:
        data = path.read_bytes()
        f = io.BytesIO(data)
        common, sizes = pickle.load(f)
        ends = list(itertools.accumulate(sizes, initial=f.tell()))
        if ends[-1] != len(data):
            return None  # from another build of the format
        heads, *forms = (data[a:b] for a, b in zip(ends, ends[1:]))
        return _Rule(common, heads, forms)
    except Exception:  # noqa: BLE001 - missing, truncated or from another build: trace again
        return None


def _pickled(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _store(path: pathlib.Path, rule: _Rule) -> None:
    # apart: a compile reads what all forms need, then the heads of a rule that has it, then the forms that fit
    parts = [_pickled(rule.heads), *(_pickled(f) for f in rule.forms)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(b"".join([_pickled((rule.common, [len(b) for b in parts])), *parts]))
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only cache only costs the next process a trace

"""Search forms: what each rule is matched as. Every traced pattern of a rule (tracing.py), expanded into the
graphs it must also match (commuted operands, the copy a head-transposed operand gets, a direct bmm, the
fp32 form without its downcast), each with the ops and edges a graph must hold for it to match anywhere.
Tracing costs about a second a rule, so the forms are kept in memory for the process and pickled under
``$FUSEKIT_CACHE/patterns/`` (keyed by torch's version and the sources that shape a trace), as Inductor keeps
its serialized SDPA patterns: a new process loads them instead of tracing again.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import io
import os
import pathlib
import pickle
import sys
import warnings
from typing import Any

import torch
from torch._inductor import pattern_matcher as pm

from .registry import Pattern
from .tracing import _clone_variants, _commuted, _downcast_root, _expand_variants, trace_search_pattern_and_forms


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


@dataclasses.dataclass(frozen=True)
class SearchForm:
    """One search pattern of a rule: the PatternExpr, the scalar forms its replacement undoes, whether it
    is the fp32 computation without the rule's downcast (the op then stores out_dtype=float32), and what a
    graph must hold for it to match anywhere."""

    expr: Any
    inverse: dict[str, int]
    cast: bool
    needs: Requirements


_COMMON: dict[tuple[str, torch.dtype, str], Requirements] = {}
_FORMS: dict[tuple[str, torch.dtype, str], list[SearchForm]] = {}


def common_requirements(pattern: Pattern, dtype: torch.dtype, device: str) -> Requirements:
    """What every search form of the rule needs: a graph without it is not offered the rule at all (and
    its forms are not even loaded)."""
    key = (pattern.id, dtype, device)
    if key not in _COMMON:
        loaded = _load(_cache_path(pattern, dtype, device), header_only=True)
        if loaded is None:
            search_forms(pattern, dtype, device)
        else:
            _COMMON[key] = loaded[0]
    return _COMMON[key]


def search_forms(pattern: Pattern, dtype: torch.dtype, device: str) -> list[SearchForm]:
    """Every search pattern of `pattern` in `dtype` on `device`, commuted and shape variants included, each
    once: from memory, else from the disk cache, else traced (and then written to both)."""
    key = (pattern.id, dtype, device)
    if key not in _FORMS:
        path = _cache_path(pattern, dtype, device)
        loaded = _load(path)
        if loaded is None:
            forms = _trace_forms(pattern, dtype, device)
            loaded = (_common(forms), forms)
            _store(path, loaded)
        _COMMON[key], _FORMS[key] = loaded
    return _FORMS[key]


def _common(forms: list[SearchForm]) -> Requirements:
    ops = frozenset.intersection(*(f.needs[0] for f in forms))
    edges = frozenset.intersection(*(f.needs[1] for f in forms))
    return ops, edges


def _trace_forms(p: Pattern, dtype: torch.dtype, device: str) -> list[SearchForm]:
    out: list[SearchForm] = []
    seen: set[str] = set()
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
                    out.append(SearchForm(expr, inverse, is_cast, requirements(expr)))
    return out


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


def _load(path: pathlib.Path, header_only: bool = False) -> tuple | None:
    """(common requirements, forms) from the cache file; with header_only, (common requirements,)."""
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch 2.13+: the pytree specs of list arguments
            common = pickle.load(f)
            return (common,) if header_only else (common, pickle.load(f))
    except Exception:  # noqa: BLE001 - missing, truncated or from another build: trace again
        return None


def _store(path: pathlib.Path, loaded: tuple) -> None:
    buf = io.BytesIO()
    for obj in loaded:  # two pickles: the header can be read alone
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only cache only costs the next process a trace

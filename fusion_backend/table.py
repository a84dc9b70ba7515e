"""The pattern table: every family's rules in one order (an earlier rule is tried first where two overlap),
looked up by id or family, and the Inductor settings families declare. Above both the families (patterns/) and
the engine's declarations (registry.py), so that neither imports the other back."""
from __future__ import annotations

import functools
from typing import Sequence

from . import registry


@functools.cache
def all_patterns() -> tuple[registry.Pattern, ...]:
    # imported on first use, not with the package: setup.py runs `python -m fusion_backend.build` from a
    # checkout that is not installed yet, where the tables are mapped in first (build._tables_from_checkout)
    from .patterns import PATTERNS

    ids = [p.id for p in PATTERNS]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate pattern ids: {sorted(dup)}")
    registry.register_cpu_references(PATTERNS)
    return tuple(PATTERNS)


def family(pattern_id: str) -> str:
    return pattern_id.split(".", 1)[0]


@functools.cache
def inductor_settings() -> dict[str, registry.InductorSettings]:
    """{family: the Inductor settings it declares} (patterns.INDUCTOR)."""
    from .patterns import INDUCTOR

    return dict(INDUCTOR)


@functools.cache
def position(pattern_id: str) -> int:
    """The rule's place in the table: an earlier rule is tried first where two overlap."""
    return [p.id for p in all_patterns()].index(pattern_id)


def by_id(pattern_id: str) -> registry.Pattern:
    for p in all_patterns():
        if p.id == pattern_id:
            return p
    raise KeyError(pattern_id)


def select(patterns: Sequence[str] | None, disable: Sequence[str] = ()) -> tuple[str, ...]:
    """Resolve `options["patterns"]`/`["disable"]` (ids or family names) to pattern ids, in table order."""
    every = [p.id for p in all_patterns()]

    def expand(names: Sequence[str], what: str) -> set[str]:
        out = set()
        for n in names:
            hit = [i for i in every if i == n or family(i) == n]
            if not hit:
                raise ValueError(f"fusekit: unknown pattern or family {n!r} in options[{what!r}]; "
                                 f"known: {every}")
            out.update(hit)
        return out

    chosen = set(every) if patterns is None else expand(patterns, "patterns")
    chosen -= expand(disable, "disable")
    return tuple(i for i in every if i in chosen)

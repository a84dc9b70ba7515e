"""fusekit's options: the user's ``mode`` and ``options=`` dict, parsed once into one typed record. Every key that is
not fusekit's is Inductor's and goes to it unchanged."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

KEYS = ("mode", "patterns", "enable", "disable", "cpu_reference", "verify", "report")  # fusekit's own keys


@dataclasses.dataclass(frozen=True)
class Options:
    patterns: tuple[str, ...]          # enabled rule ids, in table order
    forced: tuple[str, ...] = ()       # ids named in options["patterns"] or ["enable"]: they skip the policy guards
    cpu_reference: bool = False        # rules fire on CPU tensors too, running each op's reference
    verify: bool = False               # each rewritten site checks itself against its reference once
    report: bool = False               # explain reused intermediates and keep the graph's code
    # the rewrites of tensor-parallel all-reduces that are on (collectives.py: one-shot, fused with add + RMSNorm)
    collectives: tuple[str, ...] = ()
    window_roll: bool = True           # a full sliding window's roll in place (kv_cache.py)
    window_roll_reader: bool = True    # a layer's two rolls and the op that reads both caches in one (kv_cache.py)
    length_counters: bool = True       # the caches' per-layer length counters advanced in one launch (kv_cache.py)
    woq_int8_mm: bool = True           # Inductor's int8 weight-only fallback kernel undone on CUDA (lowered.py)
    # Inductor settings the pass may set, per family, where one of the family's rules fired (the backend offers
    # those of registry.InductorSettings that the device and the user's own options allow): (family, keys).
    inductor: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _as_names(v: Any, key: str) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise TypeError(f"fusekit: options[{key!r}] must be a pattern id, a family or a list of them")


def parse(mode: str | None, options: Mapping[str, Any] | None) -> tuple[Options, dict[str, Any]]:
    """-> (fusekit's Options, Inductor's config patches: the mode's, then every other key of `options`)."""
    from torch._inductor import list_mode_options

    from . import collectives, kv_cache, lowered, table

    opts = dict(options or {})
    opt_mode = opts.pop("mode", None)
    if opt_mode is not None and mode is not None and opt_mode != mode:
        raise ValueError(f"fusekit: mode={mode!r} and options['mode']={opt_mode!r} disagree")
    mode = mode or opt_mode
    patterns = opts.pop("patterns", None)
    disable = opts.pop("disable", ())
    enable = opts.pop("enable", ())
    named = None if patterns is None else _as_names(patterns, "patterns")
    extra = _as_names(enable, "enable") if enable else ()
    if named is not None and extra:
        raise ValueError("fusekit: options['patterns'] and ['enable'] together; name every rule in 'patterns'")
    off = _as_names(disable, "disable") if disable else ()
    # the collective and KV-cache rewrites are not table rules: on unless disabled, or left out of a list of named
    # rules (a family's name stands for its rules; the fused collective needs the one-shot one)
    coll = (collectives.FAMILY, *collectives.RULES)
    graph_rules = (*coll, kv_cache.FAMILY, kv_cache.RULE, kv_cache.READER_RULE, kv_cache.COUNTERS_RULE,
                   lowered.FAMILY, lowered.WOQ_RULE)

    def on(rule: str, family: str = collectives.FAMILY) -> bool:
        return not any(n in (family, rule) for n in off) and (
            named is None or any(n in (family, rule) for n in named))

    norm = on(collectives.NORM_RULE) and collectives.RULE not in off  # (naming it alone names the one-shot too)
    coll_on = tuple(r for r, v in ((collectives.RULE, on(collectives.RULE) or norm), (collectives.NORM_RULE, norm))
                    if v)
    roll = on(kv_cache.RULE, kv_cache.FAMILY)
    roll_reader = roll and on(kv_cache.READER_RULE, kv_cache.FAMILY)  # (it fuses the rolls' sites)
    counters = on(kv_cache.COUNTERS_RULE, kv_cache.FAMILY)
    woq = on(lowered.WOQ_RULE, lowered.FAMILY)
    off = tuple(n for n in off if n not in graph_rules)
    named = None if named is None else tuple(n for n in named if n not in graph_rules)
    fk = Options(
        patterns=table.select(named, off),
        forced=table.select(named) if named is not None else table.select(extra, off) if extra else (),
        collectives=coll_on,
        window_roll=roll,
        window_roll_reader=roll_reader,
        length_counters=counters,
        woq_int8_mm=woq,
        cpu_reference=bool(opts.pop("cpu_reference", False)),
        verify=bool(opts.pop("verify", False)),
        report=bool(opts.pop("report", False)),
    )
    patches: dict[str, Any] = {}
    if mode not in (None, "default"):
        try:
            patches.update(list_mode_options(mode))  # Inductor's own table and its error
        except KeyError:
            raise RuntimeError(f"Unrecognized mode={mode}") from None
    patches.update(opts)  # everything else is Inductor's, unchanged
    return fk, patches

"""The fusekit pass: Inductor's ``post_grad_custom_post_pass``.

It runs the enabled patterns over the post-grad ATen graph (one pattern-matcher pass per family,
``matcher.py``), then the user's own post pass (never replaced). Anything it does not rewrite is Inductor's.
Counts (sites, nodes replaced, match attempts, the pass's time) are always kept; the explanation of sites
where an intermediate value is reused, and the rewritten graph's code, only for a report (``explain``,
``options={"report": True}`` or DEBUG logging on ``fusion_backend``). Its ``uuid()`` covers the pattern
tables, the engine and op sources, the kernel sources, the options and the user's pass, so a changed
pattern can never replay a stale FX-graph or AOTAutograd cache entry.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import operator
import pathlib
import time
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from . import _ext, collectives, guards, kv_cache, lowered, matcher, registry, sdpa_scale, table, unpad
from .guards import SiteFailure
from .options import Options
from .stats import NearMiss, PassRun, new_record, publish

log = logging.getLogger("fusion_backend")
_PKG = pathlib.Path(__file__).resolve().parent


# The modules whose code decides what a compiled graph holds (not the CLI, the benchmarks, the report).
ENGINE = ("backend", "options", "passes", "registry", "table", "tracing", "forms", "matcher", "guards", "ops",
          "verify", "unpad", "lowered", "_ext", "collectives", "kv_cache", "sdpa_scale")


def source_files() -> tuple[str, ...]:
    from . import patterns

    pat_dir = pathlib.Path(patterns.__file__).resolve().parent
    return tuple(str(p) for p in sorted([*(_PKG / f"{m}.py" for m in ENGINE), *pat_dir.glob("*.py")]))


class FusekitPass(CustomGraphPass):
    def __init__(self, options: Options, user_pass: Any = None) -> None:
        self.options, self.user_pass = options, user_pass
        self.inductor_set: list[str] = []  # Inductor config keys this pass set (a family's settings)

    def uuid(self) -> str | None:
        if self.user_pass is not None and not hasattr(self.user_pass, "uuid"):
            return None  # a user pass with no uuid makes Inductor bypass its caches; keep that
        h = hashlib.sha256()
        for f in source_files():  # hashed each time (Inductor's get_hash_for_files caches per path)
            h.update(pathlib.Path(f).name.encode() + pathlib.Path(f).read_bytes())
        user_uuid = self.user_pass.uuid() if self.user_pass is not None else None
        h.update(json.dumps({"opts": dataclasses.asdict(self.options), "ext": _ext.build_id(),
                             "loaded": _ext.loaded_state(), "user": user_uuid,
                             "torch": torch.__version__, "collectives": collectives.environment()}).encode())
        return h.hexdigest()

    def __call__(self, graph: torch.fx.Graph) -> None:
        t0 = time.perf_counter()
        record = new_record(self.options.patterns)
        record.nodes_before = _count(graph)
        report = self.options.report or log.isEnabledFor(logging.DEBUG)
        try:
            self._rewrite(graph, record, report)
        except Exception as exc:  # noqa: BLE001 - never break the compile; Inductor takes the graph
            record.errors.append(NearMiss.from_exc("<pass>", None, exc))
        record.left_to_inductor = _count(graph, fusekit=False)
        fired = {table.family(pid) for pid, n in record.sites.items() if n}
        for family, keys in self.options.inductor:
            if family in fired:
                # read by Inductor's scheduler and codegen later in this compile; the backend's config patch holds
                # each key, so the values go back when the compile ends (and it compiles again without them if
                # Inductor then fails)
                for key in keys:
                    set_inductor_config(key, table.inductor_settings()[family].config[key])
                    self.inductor_set.append(key)
        if report:
            record.graph_code = str(graph)
        record.pass_s = time.perf_counter() - t0
        publish(record)
        _log_record(record)
        if self.user_pass is not None:
            self.user_pass(graph)

    def _rewrite(self, graph: torch.fx.Graph, record: Any, report: bool) -> None:
        skip: set[str] = set()
        dtypes = matcher.graph_dtypes(graph)  # which rules' entries to offer, found once for all rules
        while True:  # a failed rewrite restores the graph and retries without that pattern
            backup = _snapshot(graph)
            run = PassRun(self.options, record)
            try:
                enabled = [p for p in self.options.patterns if p not in skip]
                record.match_attempts, record.entries_s = 0, 0.0
                lowered.expand(graph)  # Inductor's woq_int8 lowering calls, as the ATen ops they stand for
                sdpa_scale.spell_out(graph)  # the fused forms bind scale: a call without one gets its default
                padded = unpad.strip(graph)  # rules match the unpadded chain; padding goes back where none did
                for family, pattern_ids in matcher.families(enabled).items():
                    t_entries = time.perf_counter()
                    fp = matcher.family_pass(graph, family, pattern_ids, dtypes, run, firing_only=not report)
                    record.entries_s += time.perf_counter() - t_entries
                    # found before this family's rules take the nodes, recorded after them (a guard's own
                    # near miss at a site comes first)
                    misses = _reused_intermediates(graph, run, fp.pattern_ids, dtypes) if report else []
                    record.match_attempts += fp.attempts
                    fp.pass_.apply(graph)
                    _record_misses(run, misses)
                unpad.restore(graph, padded)
                absorb_output_casts(graph, record)
                if self.options.window_roll:
                    kv_cache.rewrite(graph, record, self.options.cpu_reference, self.options.window_roll_reader)
                if self.options.woq_int8_mm:
                    lowered.restore(graph, record, self.options.cpu_reference)
                if self.options.length_counters:
                    kv_cache.fold_counters(graph, record, self.options.cpu_reference)
                if self.options.collectives:
                    collectives.rewrite(graph, record, self.options.cpu_reference, self.options.collectives)
                return
            except SiteFailure as f:
                _restore(graph, backup)
                record.sites.clear()
                record.nodes_replaced.clear()
                record.fused_sites.clear()
                record.output_casts.clear()
                record.near_misses.clear()
                record.errors.append(NearMiss.from_exc(f.pattern, f.node, f.exc))
                skip.add(f.pattern)


def inductor_config_value(key: str, default: Any = None) -> Any:
    """Inductor's config value at a dotted key ("triton.enable_pdl"); `default` where this torch has no such key."""
    obj = inductor_config
    for part in key.split("."):
        if not hasattr(obj, part):
            return default
        obj = getattr(obj, part)
    return obj


def set_inductor_config(key: str, value: Any) -> None:
    *path, last = key.split(".")
    obj = inductor_config
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def _reused_intermediates(graph: torch.fx.Graph, run: PassRun, pattern_ids: list[str],
                          dtypes: list) -> list[tuple[str, torch.fx.Node, str]]:
    """Sites that match a pattern's shape but cannot be rewritten because an intermediate value has another
    user (guard failures are recorded when the guard runs). Only sites whose arguments and dtype fit the
    rule count: a float LayerNorm that looks like a dequantize is not a near miss."""
    index, out = matcher.GraphIndex(graph), []
    for pid in pattern_ids:
        pattern = table.by_id(pid)
        for node, m, shared in matcher.near_misses(graph, pid, dtypes, index):
            if guards.fits(pattern, m, run):
                names = ", ".join(f"{n.name} ({len(n.users)} users)" for n in shared)
                out.append((pid, node, f"intermediate reused outside the pattern: {names}"))
    return out


def _record_misses(run: PassRun, misses: list[tuple[str, torch.fx.Node, str]]) -> None:
    """Each of `misses` unless its site was rewritten by its own rule or one before it in the table (as
    when every rule ran in turn and explained its misses before the next one took nodes)."""
    for pid, node, reason in misses:
        by = run.replaced.get(node)
        if by is None or table.position(by) > table.position(pid):
            run.near_miss(pid, node, reason)


def absorb_output_casts(graph: torch.fx.Graph, record: Any) -> None:
    """``convert_element_type(op(...), dtype)``, where the op's result has no other user, the cast result
    is a graph output and the op can store `dtype`, becomes ``op(..., out_dtype=dtype)``: one fp32 store
    instead of a 16-bit store plus a cast kernel that reads it back and writes fp32 (e.g. logits returned as
    ``gelu(x @ w + b).float()``). Only for graph outputs: a cast that feeds more work is fused by Inductor
    into that work's kernel, which then reads 16 bits per element, not 32. The fused result skips the
    rounding to 16 bits in between (it is closer to the exact value, never farther)."""
    convert = torch.ops.prims.convert_element_type.default
    casts = {p.op: p.output_casts for p in table.all_patterns() if p.output_casts}  # op -> dtypes it stores
    for name, dtypes in casts.items():
        op = registry.op_overload(name)
        pos = [a.name for a in op._schema.arguments].index("out_dtype")
        for node in list(graph.find_nodes(op="call_function", target=op)):
            user = next(iter(node.users)) if len(node.users) == 1 else None
            if user is None or user.target is not convert or user.args[0] is not node \
                    or any(u.op != "output" for u in user.users):
                continue
            val, dtype = node.meta.get("val"), user.args[1]
            if dtype not in dtypes or val is None or val.dtype == dtype or "val" not in user.meta \
                    or (len(node.args) > pos and node.args[pos] is not None) or node.kwargs.get("out_dtype"):
                continue
            # as a keyword: Inductor's lowering of the op expects the positional arguments the node was made with
            node.args = node.args[:pos]
            node.kwargs = {**node.kwargs, "out_dtype": dtype}
            node.meta["val"] = user.meta["val"]
            user.replace_all_uses_with(node)
            graph.erase_node(user)
            record.output_casts[name] += 1


_getitem = operator.getitem


def _is_fusekit(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "fusekit"


def _count(graph: torch.fx.Graph, fusekit: bool = True) -> int:
    """ATen-level work in `graph`: call_function nodes, less tuple indexing (and fusekit's own ops)."""
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target is not _getitem
               and (fusekit or not _is_fusekit(n)))


def _copy_into(dst: torch.fx.Graph, src: torch.fx.Graph) -> None:
    rv, out = dst.graph_copy(src, {}, return_output_node=True)  # copies all but the output node
    dst.output(rv, type_expr=out.type).meta = dict(out.meta)


def _snapshot(graph: torch.fx.Graph) -> torch.fx.Graph:
    g = torch.fx.Graph(owning_module=graph.owning_module)
    _copy_into(g, graph)
    return g


def _restore(graph: torch.fx.Graph, backup: torch.fx.Graph) -> None:
    for n in reversed(list(graph.nodes)):  # users before producers
        graph.erase_node(n)
    _copy_into(graph, backup)


def _log_record(r: Any) -> None:
    fused = sum(r.sites.values())
    log.info("fusekit graph %d: %d sites fused (%s), %d near misses, %d errors, %d/%d nodes left "
             "to Inductor", r.graph_id, fused, dict(r.sites), len(r.near_misses), len(r.errors),
             r.left_to_inductor, r.nodes_before)
    for m in r.near_misses:
        log.debug("fusekit near miss: %s at %s: %s", m.pattern, m.site, m.reason)
    for e in r.errors:
        log.warning("fusekit skipped %s at %s: %s", e.pattern, e.site, e.reason)

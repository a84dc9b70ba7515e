"""``explain``: compile with fusekit and report, per pattern, what fused, what nearly did and why."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from typing import Any, Iterator, Sequence

import torch

from . import stats

log = logging.getLogger("fusion_backend")


@dataclasses.dataclass
class Report:
    graphs: list[stats.GraphRecord]
    output: Any = None  # what the compiled call returned (explain only)

    @property
    def sites(self) -> collections.Counter:
        return sum((g.sites for g in self.graphs), collections.Counter())

    @property
    def nodes_replaced(self) -> collections.Counter:
        return sum((g.nodes_replaced for g in self.graphs), collections.Counter())

    @property
    def near_misses(self) -> list[stats.NearMiss]:
        return [m for g in self.graphs for m in g.near_misses]

    @property
    def errors(self) -> list[stats.NearMiss]:
        return [e for g in self.graphs for e in g.errors]

    @property
    def total_sites(self) -> int:
        return sum(self.sites.values())

    @property
    def output_casts(self) -> collections.Counter:
        return sum((g.output_casts for g in self.graphs), collections.Counter())

    @property
    def left_to_inductor(self) -> int:
        return sum(g.left_to_inductor for g in self.graphs)

    def rows(self) -> list[dict[str, Any]]:
        ids: list[str] = []
        for g in self.graphs:
            ids += [i for i in g.enabled if i not in ids]
        miss = collections.Counter(m.pattern for m in self.near_misses)
        err = collections.Counter(e.pattern for e in self.errors)
        # rewrites outside the tables (collectives.py) where they did something
        ids += [i for i in dict.fromkeys((*self.sites, *miss)) if i not in ids and i != "<pass>"]
        return [{"pattern": i, "sites": self.sites[i], "nodes_replaced": self.nodes_replaced[i],
                 "near_misses": miss[i], "errors": err[i]} for i in ids]

    @property
    def pass_s(self) -> float:
        return sum(g.pass_s for g in self.graphs)

    @property
    def entries_s(self) -> float:
        return sum(g.entries_s for g in self.graphs)

    @property
    def match_attempts(self) -> int:
        return sum(g.match_attempts for g in self.graphs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "graphs": len(self.graphs), "sites": self.total_sites, "pass_s": self.pass_s,
            "entries_s": self.entries_s, "match_attempts": self.match_attempts,
            "nodes_before": sum(g.nodes_before for g in self.graphs),
            "left_to_inductor": self.left_to_inductor, "patterns": self.rows(),
            "output_casts": dict(self.output_casts),
            "near_misses": [dataclasses.asdict(m) for m in self.near_misses],
            "errors": [dataclasses.asdict(e) for e in self.errors],
        }

    def __str__(self) -> str:
        before = sum(g.nodes_before for g in self.graphs)
        lines = [f"fusekit: {len(self.graphs)} graph(s), {self.total_sites} site(s) fused, "
                 f"{sum(self.nodes_replaced.values())} of {before} ATen nodes replaced, "
                 f"{self.left_to_inductor} nodes left to Inductor; pass {self.pass_s:.2f} s "
                 f"({self.entries_s:.2f} s choosing entries), "
                 f"{self.match_attempts:,} match attempts"
                 + "".join(f", {n} output cast(s) stored by fusekit::{op}" for op, n in self.output_casts.items())]
        rows = [r for r in self.rows() if r["sites"] or r["near_misses"] or r["errors"]]
        if rows:
            w = max(len("pattern"), *(len(r["pattern"]) for r in rows))
            lines.append(f"{'pattern':<{w}}  {'sites':>5}  {'nodes replaced':>14}  "
                         f"{'near misses':>11}  {'errors':>6}")
            lines += [f"{r['pattern']:<{w}}  {r['sites']:>5}  {r['nodes_replaced']:>14}  "
                      f"{r['near_misses']:>11}  {r['errors']:>6}" for r in rows]
        else:
            lines.append("(no pattern matched or nearly matched)")
        for title, items in (("near misses: cannot fire (shape, dtype, layout, kernel)",
                              [m for m in self.near_misses if not m.policy]),
                             ("near misses: chose not to fire (measured: Inductor is as fast or faster there)",
                              [m for m in self.near_misses if m.policy]),
                             ("errors (site skipped)", self.errors)):
            if items:
                lines.append(f"{title}:")
                lines += [f"  {m.pattern} at {m.site}: {m.reason}" for m in items]
        return "\n".join(lines)


@contextlib.contextmanager
def no_compile_caches() -> Iterator[None]:
    """Compile from scratch: no FX-graph (local or remote) or AOTAutograd cache hits, which would also
    skip fusekit's pass and leave no report."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        yield


@contextlib.contextmanager
def _fresh_compile() -> Iterator[None]:
    """explain must see the pass run: no compile caches, no Dynamo cache."""
    torch._dynamo.reset()
    with no_compile_caches():
        yield
    torch._dynamo.reset()


def explain(model_or_fn: Any, *args: Any, options: dict[str, Any] | None = None,
            mode: str | None = None, **kwargs: Any) -> Report:
    """Compile `model_or_fn` with fusekit, call it once on `args`/`kwargs`, and return the report.

    `options` and `mode` are the backend's (see README); the report's explanations are on unless
    `options={"report": False}`. Resets Dynamo's cache before and after."""
    from .backend import backend

    options = {"report": True, **(options or {})}
    with _fresh_compile(), stats.collect() as records:
        compiled = torch.compile(model_or_fn, backend=backend(mode=mode, options=options))
        out = compiled(*args, **kwargs)
    rep = Report(list(records), out)
    log.info("%s", rep)
    return rep


def report(last: int | None = None) -> Report:
    """The records of the graphs fusekit compiled in this process (the most recent `last`)."""
    hist: Sequence[stats.GraphRecord] = list(stats.HISTORY)
    return Report(list(hist[-last:] if last else hist))


def near_miss_groups(rep: Report, top: int | None = None) -> list[dict[str, Any]]:
    """The report's near misses grouped by rule and guard, the most frequent first: {pattern, guard, count,
    example} (the guard: the reason up to its first colon; example: one full reason and its site)."""
    groups: dict[tuple[str, str], list[stats.NearMiss]] = collections.defaultdict(list)
    for m in rep.near_misses:
        groups[(m.pattern, m.reason.split(":", 1)[0])].append(m)
    out = [{"pattern": p, "guard": g, "count": len(ms), "example": f"{ms[0].site}: {ms[0].reason}"}
           for (p, g), ms in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    return out[:top] if top else out

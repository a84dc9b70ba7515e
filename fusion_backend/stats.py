"""What the fusekit pass did to each graph: sites fused, nodes replaced, near misses, errors.

The pass publishes one ``GraphRecord`` per graph it sees. ``explain`` collects them for one compile;
``fusion_backend.report()`` shows the recent history of this process.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from .options import Options


@dataclasses.dataclass
class NearMiss:
    pattern: str
    site: str
    reason: str
    policy: bool = False  # the rule chose not to fire (a measured policy), rather than could not

    @classmethod
    def from_exc(cls, pattern: str, node: torch.fx.Node | None, exc: BaseException) -> "NearMiss":
        """A skipped site (or graph, for node None) and the exception that skipped it."""
        return cls(pattern, describe(node) if node is not None else "<graph>", f"{type(exc).__name__}: {exc}")


@dataclasses.dataclass
class GraphRecord:
    graph_id: int
    enabled: tuple[str, ...]
    nodes_before: int = 0
    left_to_inductor: int = 0           # call_function nodes after the pass that fusekit did not emit
    sites: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    nodes_replaced: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)
    errors: list[NearMiss] = dataclasses.field(default_factory=list)
    fused_sites: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (pattern, site)
    # op -> output casts it now stores itself (passes.absorb_output_casts)
    output_casts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    graph_code: str = ""                # the graph after fusekit's pass (report mode only)
    match_attempts: int = 0             # pattern-matcher entries offered, summed over the graph's nodes
    pass_s: float = 0.0                 # the pass's wall time, this graph
    entries_s: float = 0.0              # of it: choosing the entries to offer (a process's first use makes them)


@dataclasses.dataclass
class PassRun:
    """State of one pass over one graph, handed to the entries it binds (guards.bind)."""

    options: "Options"
    record: GraphRecord
    current_site: str = ""
    replaced: dict = dataclasses.field(default_factory=dict)  # node -> id of the rule that replaced it
    _missed: set = dataclasses.field(default_factory=set)

    def near_miss(self, pattern: str, node: torch.fx.Node, reason: str, policy: bool = False) -> None:
        if (pattern, node.name) not in self._missed:
            self._missed.add((pattern, node.name))
            self.record.near_misses.append(NearMiss(pattern, describe(node), reason, policy))

    def error(self, pattern: str, node: torch.fx.Node | None, exc: BaseException) -> None:
        self.record.errors.append(NearMiss.from_exc(pattern, node, exc))


_COLLECTORS: list[list[GraphRecord]] = []
HISTORY: collections.deque[GraphRecord] = collections.deque(maxlen=64)
_graph_ids = iter(range(1, 1 << 62))


def new_record(enabled: tuple[str, ...]) -> GraphRecord:
    return GraphRecord(next(_graph_ids), enabled)


def publish(record: GraphRecord) -> None:
    HISTORY.append(record)
    for c in _COLLECTORS:
        c.append(record)


@contextlib.contextmanager
def collect() -> Iterator[list[GraphRecord]]:
    """Gather the records of every graph compiled inside the block."""
    records: list[GraphRecord] = []
    _COLLECTORS.append(records)
    try:
        yield records
    finally:
        _COLLECTORS.remove(records)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def describe(node: torch.fx.Node) -> str:
    """`node (file.py:LINE in fn)`: where in the user's code a graph node came from."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return node.name
    path, line, fn = frames[-1]
    return f"{node.name} ({path.rsplit('/', 1)[-1]}:{line} in {fn})"

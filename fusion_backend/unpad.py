"""Inductor's pad_mm, undone for matching and redone where nothing matched.

On CUDA, pad_mm rewrites a misaligned fp16/bf16 ``(b)mm(a, b)`` as ``slice(bmm(pad(a), pad(b)))`` (zeros on
the right, the product sliced back; ``addmm(bias, a, b)`` likewise, rows included: a 6-row q/k/v projection with
Qwen2's biases arrives as ``slice(addmm(bias, pad(x), w.T))``) wherever its on-device benchmark finds
that faster: per matmul, per machine, so it varies from run to run. A rule's chain then holds pads for some of
its matmuls and not for others, in any combination. The pass therefore matches on the unpadded graph: ``strip``
turns every exact pad_mm rewrite back into the plain matmul (the same product: zero rows and columns added, then
cut off), and ``restore`` puts the padding back around each of those matmuls that no rule took, so Inductor
keeps what its benchmark chose.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten
_MMS = (aten.bmm.default, aten.mm.default, aten.addmm.default)
_PAD, _SLICE = aten.constant_pad_nd.default, aten.slice.Tensor


@dataclasses.dataclass
class Padded:
    """A matmul `strip` made plain, and what pad_mm had around it (to put back)."""

    plain: torch.fx.Node
    target: Any
    operands: tuple[list[tuple[tuple, dict]], list[tuple[tuple, dict]]]  # per operand: (pad args, meta), in order
    mm_meta: dict
    slices: list[tuple[tuple, dict]]                                      # (slice args after the input, meta)


def _pads(n: Any) -> tuple[Any, list[torch.fx.Node]]:
    """(the unpadded operand, its pad_mm pads from the inside out): zero pads on the right only, each used
    only by the next."""
    chain: list[torch.fx.Node] = []
    while isinstance(n, torch.fx.Node) and n.target is _PAD and len(n.users) == 1:
        pad = n.args[1]
        value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
        if value != 0 or not all(isinstance(x, int) and x >= 0 for x in pad) or any(pad[0::2]):
            break
        chain.append(n)
        n = n.args[0]
    return n, chain[::-1]


def _first(target: Any) -> int:
    """Where the two matmul operands start in the args: after addmm's input."""
    return 1 if target is aten.addmm.default else 0


def _same_shape(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _broadcasts(shape: Any, want: Any) -> bool:
    """`shape` (addmm's input) broadcasts to `want` (the unpadded product) as it is."""
    if len(shape) > len(want):
        return False
    return all(statically_known_true(x == 1) or statically_known_true(x == y)
               for x, y in zip(reversed(shape), reversed(want)))


def strip(graph: torch.fx.Graph) -> list[Padded]:
    """Make every exact pad_mm rewrite in `graph` a plain matmul again; the records let `restore` undo it."""
    out = []
    for mm in [n for t in _MMS for n in graph.find_nodes(op="call_function", target=t)]:
        i = _first(mm.target)
        (a, pads_a), (b, pads_b) = _pads(mm.args[i]), _pads(mm.args[i + 1])
        extra = list(mm.args[:i])  # addmm's input: kept as it is (a padded one is not undone)
        if not (pads_a or pads_b) or any("val" not in getattr(x, "meta", {}) for x in (a, b, *extra)):
            continue
        end, slices = mm, []
        while len(end.users) == 1 and (u := next(iter(end.users))).target is _SLICE and u.args[0] is end:
            start = u.args[2] if len(u.args) > 2 else 0
            step = u.args[4] if len(u.args) > 4 else 1
            if start != 0 or step != 1 or u.kwargs:
                break
            slices.append(u)
            end = u
        av, bv = a.meta["val"], b.meta["val"]
        want = (*av.shape[:-1], bv.shape[-1])
        if not (_same_shape(end.meta["val"].shape, want) and statically_known_true(av.shape[-1] == bv.shape[-2])):
            continue  # not the unpadded product: leave it
        if extra and not _broadcasts(extra[0].meta["val"].shape, want):
            continue  # addmm's input padded with the product: leave it
        with graph.inserting_before(mm):
            plain = graph.call_function(mm.target, (*extra, a, b), dict(mm.kwargs))
        with detect_fake_mode([av, bv]) or contextlib.nullcontext():
            val = mm.target(*[x.meta["val"] for x in extra], av, bv, **mm.kwargs)
        plain.meta = {**{k: v for k, v in mm.meta.items() if k != "tensor_meta"}, "val": val}
        rec = Padded(plain, mm.target, ([(p.args[1:], dict(p.meta)) for p in pads_a],
                                        [(p.args[1:], dict(p.meta)) for p in pads_b]),
                     dict(mm.meta), [(s.args[1:], dict(s.meta)) for s in slices])
        end.replace_all_uses_with(plain)
        for n in [*reversed(slices), mm, *reversed(pads_a), *reversed(pads_b)]:
            if not n.users:
                graph.erase_node(n)
        out.append(rec)
    return out


def restore(graph: torch.fx.Graph, records: list[Padded]) -> int:
    """Pad again each stripped matmul that is still in `graph` (no rule took it); returns how many."""
    alive = {n for t in _MMS for n in graph.find_nodes(op="call_function", target=t)}
    n_restored = 0
    for r in records:
        if r.plain not in alive:
            continue
        i = _first(r.target)
        with graph.inserting_before(r.plain):
            operands = list(r.plain.args[:i])
            for x, pads in zip(r.plain.args[i:i + 2], r.operands):
                for args, meta in pads:
                    x = graph.call_function(_PAD, (x, *args))
                    x.meta = meta
                operands.append(x)
            y = graph.call_function(r.target, tuple(operands), dict(r.plain.kwargs))
            y.meta = r.mm_meta
            for args, meta in r.slices:
                y = graph.call_function(_SLICE, (y, *args))
                y.meta = meta
        r.plain.replace_all_uses_with(y)
        graph.erase_node(r.plain)
        n_restored += 1
    return n_restored

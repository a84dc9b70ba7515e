"""SDPA's default scale written out before matching, so that the rules' fused-SDPA forms (which bind `scale`) match
a call that left it out.

A model that calls ``F.scaled_dot_product_attention`` without ``scale`` (Falcon) reaches the post-grad graph as a fused
op whose ``scale`` argument is absent: the op then uses ``1 / sqrt(q.size(-1))``. Writing that value in changes
nothing the op computes (c10's ``calculate_scale`` takes the same double), and every rule's search form spells
``scale``. On torch 2.14's CPU, SDPA takes Falcon's one KV head as it is (the flash op, no scale argument), where
torch 2.11-2.13 run the math decomposition. The ops are told by their schema (an ATen op whose first argument is
``query`` and whose keyword-only ``scale`` defaults to None: SDPA's fused kernels), not by name.
"""
from __future__ import annotations

import functools
import math

import torch


@functools.cache
def _takes_default_scale(op: object) -> bool:
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    args = op._schema.arguments
    return bool(args) and args[0].name == "query" and any(
        a.name == "scale" and a.kwarg_only and a.has_default_value() and a.default_value is None for a in args)


def spell_out(graph: torch.fx.Graph) -> int:
    """Each fused SDPA call without a scale gets its default as a keyword; returns how many."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or not _takes_default_scale(node.target) or node.kwargs.get("scale") is not None:
            continue
        q = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
        d = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else None
        if not isinstance(d, int) or d <= 0:
            continue  # a symbolic head dim: left as it is
        node.kwargs = {**node.kwargs, "scale": 1.0 / math.sqrt(d)}
        count += 1
    return count

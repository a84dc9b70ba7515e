"""SDPA's default scale written out before matching, so that the rules' fused-SDPA forms (which bind `scale`) match
a call that left it out.

A model that calls ``F.scaled_dot_product_attention`` without ``scale`` (Falcon) reaches the post-grad graph as a fused
op whose ``scale`` argument is absent: the op then uses ``1 / sqrt(q.size(-1))``. Writing that value in changes
nothing the op computes (c10's ``calculate_scale`` takes the same double), and every rule's search form spells
``scale``. On torch 2.14's CPU, SDPA takes Falcon's one KV head as it is (the flash op, no scale argument), where
torch 2.11-2.13 run the math decomposition.
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _fused_ops() -> tuple:
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention")
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))


def spell_out(graph: torch.fx.Graph) -> int:
    """Each fused SDPA call without a scale gets its default as a keyword; returns how many."""
    count = 0
    for op in _fused_ops():
        for node in graph.find_nodes(op="call_function", target=op):
            if node.kwargs.get("scale") is not None:
                continue
            q = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            d = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else None
            if not isinstance(d, int) or d <= 0:
                continue  # a symbolic head dim: left as it is
            node.kwargs = {**node.kwargs, "scale": 1.0 / math.sqrt(d)}
            count += 1
    return count

"""Inductor's own lowering-pattern nodes, written back as the ATen ops they lower to, so that rules can match them.

Inductor's ``woq_int8`` lowering pattern (torch/_inductor/fx_passes/quantization.py) takes a bfloat16 int8
weight-only linear, ``F.linear(x, w.to(x.dtype)) * scales`` (torchao's Int8WeightOnlyConfig), before the post-grad
custom pass runs, and leaves a call of its lowering function in the graph: ``reshape(x, [-1, K])``, then
``aten._weight_int8pack_mm``, then a reshape back. ``expand`` writes those three ATen nodes in its place. Inductor
lowers them exactly as that function would have (aten._weight_int8pack_mm's fallback kernel), so a node no rule
takes compiles as before.
"""
from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

aten = torch.ops.aten
_WOQ_MODULE = "torch._inductor.fx_passes.quantization"


def is_woq_lowering(fn: object) -> bool:
    """`fn` is the woq_int8 lowering function (a pattern entry's handler, then a graph node's target)."""
    return getattr(fn, "__name__", "") == "woq_int8" and getattr(fn, "__module__", "") == _WOQ_MODULE


def _is_woq(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and is_woq_lowering(n.target) and set(n.kwargs) == {"x", "weight", "scales"}


def _static(*shapes: torch.Size) -> bool:
    return all(isinstance(d, int) for s in shapes for d in s)


def expand(graph: torch.fx.Graph) -> int:
    """Replace each woq_int8 lowering call of static shapes by its ATen ops; returns how many."""
    done = 0
    for n in [n for n in graph.nodes if _is_woq(n)]:
        args = [n.kwargs[k] for k in ("x", "weight", "scales")]
        vals = [getattr(a, "meta", {}).get("val") for a in args]
        out_val = n.meta.get("val")
        if any(not isinstance(v, torch.Tensor) for v in (*vals, out_val)) or not _static(
                *(v.shape for v in vals), out_val.shape):
            continue  # symbolic sizes: Inductor's lowering keeps it
        x, w, s = args
        xv, wv, sv = vals
        k = xv.shape[-1]
        with detect_fake_mode(vals) or contextlib.nullcontext():
            x2v = xv.reshape(-1, k)
            mmv = aten._weight_int8pack_mm.default(x2v, wv, sv)
            yv = mmv.reshape(out_val.shape)
        meta = {key: v for key, v in n.meta.items() if key not in ("val", "tensor_meta")}
        with graph.inserting_before(n):
            x2 = graph.call_function(aten.reshape.default, (x, [-1, k]))
            mm = graph.call_function(aten._weight_int8pack_mm.default, (x2, w, s))
            y = graph.call_function(aten.reshape.default, (mm, list(out_val.shape)))
        for node, val in ((x2, x2v), (mm, mmv), (y, yv)):
            node.meta = {**meta, "val": val}
        n.replace_all_uses_with(y)
        graph.erase_node(n)
        done += 1
    return done

"""Inductor's own lowering-pattern nodes, written back as the ATen ops they lower to, so that rules can match them.

Inductor's ``woq_int8`` lowering pattern (torch/_inductor/fx_passes/quantization.py) takes a bfloat16 int8
weight-only linear, ``F.linear(x, w.to(x.dtype)) * scales`` (torchao's Int8WeightOnlyConfig), before the post-grad
custom pass runs, and leaves a call of its lowering function in the graph: ``reshape(x, [-1, K])``, then
``aten._weight_int8pack_mm``, then a reshape back. ``expand`` writes those three ATen nodes in its place. Inductor
lowers them exactly as that function would have (aten._weight_int8pack_mm's fallback kernel).

``lowered.woq_int8_mm`` (on by default): on CUDA that fallback kernel is one thread per output and a dot product of
K loads from global memory each, with no tiling (aten/src/ATen/native/cuda/int8mm.cu), far from the tensor cores at
every row count. ``restore`` writes each such node that no rule took back as the linear torchao wrote,
``mm(x, w.to(x.dtype).t()) * scales``: Inductor then widens the weight in a kernel of its own, runs cuBLAS and
fuses the scales into what follows. The numbers are eager torchao's, not the fallback's (which rounds once).
"""
from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from .stats import describe

aten = torch.ops.aten
_WOQ_MODULE = "torch._inductor.fx_passes.quantization"
FAMILY = "lowered"
WOQ_RULE = "lowered.woq_int8_mm"


def is_woq_lowering(fn: object) -> bool:
    """`fn` is the woq_int8 lowering function (a pattern entry's handler, then a graph node's target)."""
    return getattr(fn, "__name__", "") == "woq_int8" and getattr(fn, "__module__", "") == _WOQ_MODULE


def _is_woq(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and is_woq_lowering(n.target) and set(n.kwargs) == {"x", "weight", "scales"}


def _static(*shapes: torch.Size) -> bool:
    return all(isinstance(d, int) for s in shapes for d in s)


def _emit(graph: torch.fx.Graph, target, args: tuple, meta: dict) -> torch.fx.Node:
    """`target(*args)` as a node at the graph's insertion point, its meta `meta` plus the value computed from its
    arguments' values (under their fake mode)."""
    vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    with detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)]) or contextlib.nullcontext():
        val = target(*vals)
    node = graph.call_function(target, args)
    node.meta = {**meta, "val": val}
    return node


def _meta(n: torch.fx.Node) -> dict:
    """n's meta but its value: what the nodes that replace it keep (stack trace, ...)."""
    return {key: v for key, v in n.meta.items() if key not in ("val", "tensor_meta")}


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
        meta = _meta(n)
        with graph.inserting_before(n):
            x2 = _emit(graph, aten.reshape.default, (x, [-1, vals[0].shape[-1]]), meta)
            mm = _emit(graph, aten._weight_int8pack_mm.default, (x2, w, s), meta)
            y = _emit(graph, aten.reshape.default, (mm, list(out_val.shape)), meta)
        n.replace_all_uses_with(y)
        graph.erase_node(n)
        done += 1
    return done


def restore(graph: torch.fx.Graph, record, cpu_reference: bool = False) -> int:
    """Each ``aten._weight_int8pack_mm(x, w, scales)`` left in `graph` on CUDA (or on CPU with `cpu_reference`, to
    test it) as ``mul(mm(x, permute(convert(w, x.dtype))), scales)``; returns how many."""
    done = 0
    for n in list(graph.find_nodes(op="call_function", target=aten._weight_int8pack_mm.default)):
        vals = [getattr(a, "meta", {}).get("val") for a in n.args[:3]]
        if len(n.args) != 3 or n.kwargs or any(not isinstance(v, torch.Tensor) for v in vals):
            continue
        xv, wv, sv = vals
        if xv.device.type != "cuda" and not (cpu_reference and xv.device.type == "cpu"):
            continue
        if xv.dim() != 2 or wv.dim() != 2 or sv.dim() != 1 or wv.dtype != torch.int8:
            continue
        x, w, s = n.args
        meta = _meta(n)
        with graph.inserting_before(n):
            wd = _emit(graph, torch.ops.prims.convert_element_type.default, (w, xv.dtype), meta)
            wt = _emit(graph, aten.permute.default, (wd, [1, 0]), meta)
            mm = _emit(graph, aten.mm.default, (x, wt), meta)
            y = _emit(graph, aten.mul.Tensor, (mm, s), meta)
        n.replace_all_uses_with(y)
        graph.erase_node(n)
        record.sites[WOQ_RULE] += 1
        record.nodes_replaced[WOQ_RULE] += 1
        record.fused_sites.append((WOQ_RULE, describe(y)))
        done += 1
    return done

"""A full sliding-window KV cache's step, in place: ``fusekit::window_roll``.

Once its window is full, transformers' ``StaticSlidingWindowLayer`` moves the window one slot to the left at every
decode step: ``new = cache.roll(-1, dims=-2); new[:, :, [-1]] = k; cache.copy_(new)``. The post-grad graph holds
that as a gather (the roll: ``index`` by ``(arange(W) + 1) % W``), an ``index_put`` of the last slot, and a ``copy_``
of the result back into the cache (a graph input); the layer's attention reads the gathered buffer. Inductor runs
it as two reads and two writes of the window per layer (Mistral-style at batch 32, window 1024: 256 MB a layer);
the op does one of each, and the attention reads the cache itself.

The op mutates its ``cache`` argument (its schema says so: ``Tensor(a!)``); as vLLM's cache ops, its name has no
trailing underscore. Not a table rule: the rewrite removes a mutation of a graph input (the ``copy_``) and puts an
op that mutates it in place where the gathered buffer was made, which only holds when nothing else reads the cache
in between.
Where one op reads both rolled caches of a layer and nothing else does, and its rule names an op that rolls them
while it reads them (``Pattern.rolling_op``: the decode attention's ``fusekit::decode_attention_roll``), the two rolls
and that op become the rolling one (``cache.window_roll_reader``): the window is read once, not twice.
The roll's index and the last slot's index are evaluated (constants made of iota/arange/add/fmod/full), so
any spelling that computes the same permutation matches.

``cache.length_counters``: caches that count their own length (transformers >= 5.2x: each layer's
``cumulative_length.add_(n)``) leave one ``copy_(counter, add(counter, n))`` per layer at the end of a step, and Inductor
gives each its own kernel, after the layer that reads it (combo kernels do not join them): 8 launches at the end of
a Llama-style step. They become one ``aten._foreach_add_`` of all the counters, which Inductor lowers to one
horizontal kernel.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import _ext, registry, table
from .stats import NearMiss, describe

FAMILY = "cache"
RULE = "cache.window_roll"
KERNEL = "window_roll"  # csrc/cache/window_roll.cu
READER_RULE = "cache.window_roll_reader"
COUNTERS_RULE = "cache.length_counters"
_COUNTER_NUMEL = 16  # a counter is a small tensor: the rewrite leaves other in-place adds to Inductor
aten = torch.ops.aten
_CONST_OPS = {torch.ops.prims.iota.default, aten.arange.default, aten.arange.start, aten.arange.start_step,
              aten.add.Tensor, aten.add.Scalar, aten.fmod.Scalar, aten.fmod.Tensor, aten.remainder.Scalar,
              aten.remainder.Tensor, aten.full.default, aten.scalar_tensor.default, aten.lift_fresh_copy.default,
              aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_MAX_CONST = 1 << 20  # elements of an index evaluated at compile time


def _value(node: object, depth: int = 0) -> Tensor | int | float | None:
    """A compile-time constant's value (on the CPU), or None where `node` depends on an input."""
    if not isinstance(node, torch.fx.Node):
        return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None
    if node.op != "call_function" or node.target not in _CONST_OPS or depth > 8:
        return None
    val = node.meta.get("val")
    if isinstance(val, Tensor) and (val.numel() > _MAX_CONST or not all(isinstance(d, int) for d in val.shape)):
        return None
    args = []
    for a in node.args:
        v = _value(a, depth + 1) if isinstance(a, torch.fx.Node) else a
        if v is None or isinstance(v, torch.fx.Node):
            return None
        args.append(v)
    kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in node.kwargs.items()}
    if any(isinstance(v, torch.fx.Node) for v in kwargs.values()):
        return None
    try:
        return node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - not evaluable here: no match
        return None


def _index_arg(node: torch.fx.Node) -> tuple[torch.fx.Node, object] | None:
    """(source, the index along dim 2) of ``index(src, [None, None, i])`` or ``index_select(src, 2, i)``."""
    if node.target is aten.index.Tensor:
        src, idx = node.args[:2]
        if len(idx) == 3 and idx[0] is None and idx[1] is None and idx[2] is not None:
            return src, idx[2]
    elif node.target is aten.index_select.default and node.args[1] in (2, -2):
        return node.args[0], node.args[2]
    return None


def _match(copy: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, torch.fx.Node] | None:
    """(cache, put, gather, new) where ``copy`` is ``copy_(cache, index_put(gather(cache), [.., .., last], new))``
    with the gather the roll by one slot to the left; None elsewhere."""
    cache, put = copy.args[:2]
    if cache.op != "placeholder" or not isinstance(put, torch.fx.Node) or \
            put.target not in (aten.index_put_.default, aten.index_put.default):
        return None
    gather, idx, new = put.args[:3]
    accumulate = put.args[3] if len(put.args) > 3 else put.kwargs.get("accumulate", False)
    if accumulate or not isinstance(gather, torch.fx.Node) or len(idx) != 3 or idx[0] is not None \
            or idx[1] is not None:
        return None
    got = _index_arg(gather)
    if got is None or got[0] is not cache:
        return None
    cval, nval = cache.meta.get("val"), getattr(new, "meta", {}).get("val")
    if not isinstance(cval, Tensor) or not isinstance(nval, Tensor) or cval.dim() != 4 or not 1 <= nval.dim() <= 4:
        return None
    if not all(isinstance(d, int) for d in (*cval.shape, *nval.shape)):
        return None
    b, h, w, d = cval.shape
    shape = (1,) * (4 - nval.dim()) + tuple(nval.shape)  # index_put broadcasts its values ([H, 1, D] at batch 1)
    if shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2:] != (1, d) or w < 1:
        return None
    roll, last = _value(got[1]), _value(idx[2])
    if not isinstance(roll, Tensor) or not isinstance(last, Tensor) or roll.shape != (w,) or last.numel() != 1:
        return None
    if not torch.equal(roll.long(), (torch.arange(w) + 1) % w) or int(last.reshape(())) % w != w - 1:
        return None
    return cache, put, gather, new


def _why_not(cache: torch.fx.Node, put: torch.fx.Node, gather: torch.fx.Node, copy: torch.fx.Node,
             new: torch.fx.Node, cpu_reference: bool) -> str | None:
    if set(cache.users) != {gather, copy}:
        return f"the cache is read elsewhere in the step ({', '.join(u.name for u in cache.users)})"
    if set(gather.users) != {put}:
        return "the rolled window is read before its last slot is written"
    cval, nval = cache.meta["val"], new.meta["val"]
    if nval.dtype != cval.dtype:
        return f"new rows of {nval.dtype} into a {cval.dtype} cache"
    if cval.device.type == "cpu":
        return None if cpu_reference else "device cpu"
    if cval.device.type != "cuda":
        return f"device {cval.device.type}"
    es, d = cval.element_size(), cval.shape[3]
    if es not in (1, 2, 4) or cval.stride(3) != 1 or (d * es) % 16 or any(cval.stride(i) * es % 16 for i in range(3)):
        return f"cache layout {tuple(cval.shape)} strides {cval.stride()}: rows of 16-byte chunks only"
    if d * es > 4096:
        return f"rows of {d * es} bytes (the kernel takes up to 4096)"
    return _ext.missing_cuda_kernel(KERNEL, cval.device)


def rewrite(graph: torch.fx.Graph, record, cpu_reference: bool, readers: bool = True) -> None:
    """Each full sliding window's roll + last-slot write + copy back as ``fusekit::window_roll`` (in place); with
    `readers`, a layer's two rolls and the op that reads both caches as that op's rolling form (``rolling_op``)."""
    rolls: dict[torch.fx.Node, torch.fx.Node] = {}  # cache -> its window_roll
    for copy in list(graph.find_nodes(op="call_function", target=aten.copy_.default)):
        m = _match(copy)
        if m is None:
            continue
        cache, put, gather, new = m
        why = _why_not(cache, put, gather, copy, new, cpu_reference)
        if why is not None:
            record.near_misses.append(NearMiss(RULE, describe(put), why))
            continue
        with graph.inserting_before(put):
            new = _as_rows(graph, new, cache.meta["val"])
            op = graph.call_function(torch.ops.fusekit.window_roll.default, (cache, new))
        op.meta["val"] = None
        op.meta["stack_trace"] = put.meta.get("stack_trace")
        graph.erase_node(copy)
        put.replace_all_uses_with(cache)
        graph.erase_node(put)
        _erase_dead(graph, gather)
        rolls[cache] = op
    fused = _fuse_readers(graph, record, rolls, cpu_reference) if readers and rolls else set()
    for op in rolls.values():
        if op not in fused:
            record.sites[RULE] += 1
            record.nodes_replaced[RULE] += 3
            record.fused_sites.append((RULE, describe(op)))


def _cache_read(arg: object, rolls: dict) -> tuple[torch.fx.Node | None, list[torch.fx.Node]]:
    """(the rolled cache `arg` reads, the views in between) where `arg` is the cache, or a one-head cache repeated to
    the query heads (an MQA model's): ``expand(cache, [B, H, W, D])``, or repeat_kv's
    ``reshape(expand(unsqueeze(cache, 2), [B, 1, H, W, D]), [B, H, W, D])``; (None, []) elsewhere."""
    if arg in rolls:
        return arg, []
    steps = (_VIEW, _EXPAND, _UNSQUEEZE) if getattr(arg, "target", None) in _VIEW else (_EXPAND,)
    views, node = [], arg
    for targets in steps:
        if not isinstance(node, torch.fx.Node) or node.target not in targets or len(node.users) != 1:
            return None, []
        views.append(node)
        node = node.args[0]
    if node not in rolls:
        return None, []
    b, h, w, d = node.meta["val"].shape
    n = arg.meta["val"].shape[1]
    shapes = [tuple(v.meta["val"].shape) for v in views]
    if h != 1 or shapes[0] != (b, n, w, d) or (len(views) == 3 and (shapes[1] != (b, 1, n, w, d)
                                                                      or views[2].args[1] != 2)):
        return None, []
    return node, views


_VIEW = (aten.reshape.default, aten.view.default)
_EXPAND, _UNSQUEEZE = (aten.expand.default,), (aten.unsqueeze.default,)


def _rolling_ops() -> dict:
    """{op the rules emit: the name of its rolling form} (Pattern.rolling_op)."""
    return {registry.op_overload(p.op): p.rolling_op for p in table.all_patterns() if p.rolling_op}


def _fuse_readers(graph: torch.fx.Graph, record, rolls: dict, cpu_reference: bool) -> set[torch.fx.Node]:
    """Each op with a rolling form whose k and v are two caches rolled this step, read by nothing else, with its
    rolls as that form; -> the window_roll nodes it took."""
    taken: set[torch.fx.Node] = set()
    order = {n: i for i, n in enumerate(graph.nodes)}
    rolling = _rolling_ops()
    for reader in [n for n in graph.nodes if n.op == "call_function" and n.target in rolling]:
        (ck, kviews), (cv, vviews) = _cache_read(reader.args[1], rolls), _cache_read(reader.args[2], rolls)
        if ck is None or cv is None:
            continue
        name = rolling[reader.target]
        why = _why_not_fused(reader, ck, cv, rolls, kviews + vviews, order, name, cpu_reference)
        if why is not None:
            record.near_misses.append(NearMiss(READER_RULE, describe(reader), why))
            continue
        rk, rv = rolls[ck], rolls[cv]
        with graph.inserting_before(reader):
            op = graph.call_function(getattr(torch.ops.fusekit, name).default,
                                     (reader.args[0], ck, cv, rk.args[1], rv.args[1], *reader.args[3:]))
        op.meta["val"] = reader.meta.get("val")  # (not the rest: Inductor reads the reader's eager args from it)
        op.meta["stack_trace"] = reader.meta.get("stack_trace")
        reader.replace_all_uses_with(op)
        graph.erase_node(reader)
        for n in (*kviews, *vviews, rk, rv):
            graph.erase_node(n)
        taken |= {rk, rv}
        record.sites[READER_RULE] += 1
        record.nodes_replaced[READER_RULE] += 7  # each roll's gather, index_put and copy_, the reader
        record.fused_sites.append((READER_RULE, describe(op)))
    return taken


def _why_not_fused(reader: torch.fx.Node, ck: torch.fx.Node, cv: torch.fx.Node, rolls: dict, views: list,
                   order: dict, name: str, cpu_reference: bool) -> str | None:
    if ck is cv:
        return "k and v are one cache"
    for cache in (ck, cv):
        others = set(cache.users) - {rolls[cache], reader, *views}
        if others:
            return f"the cache {cache.name} is read elsewhere in the step ({', '.join(u.name for u in others)})"
        if order[rolls[cache]] > order[reader]:
            return f"the cache {cache.name} is rolled after {reader.name} reads it"
    dev = ck.meta["val"].device
    if dev.type == "cpu":
        return None if cpu_reference else "device cpu"
    return _ext.missing_cuda_kernel(name, dev)


def _as_rows(graph: torch.fx.Graph, new: torch.fx.Node, cache: Tensor) -> torch.fx.Node:
    """`new` as [B, H, 1, D] views (index_put broadcast it: at batch 1 the graph has [H, 1, D])."""
    b, h, _, d = cache.shape
    while new.meta["val"].dim() < 4:
        new = _call(graph, aten.unsqueeze.default, (new, 0))
    if tuple(new.meta["val"].shape) != (b, h, 1, d):
        new = _call(graph, aten.expand.default, (new, [b, h, 1, d]))
    return new


def _call(graph: torch.fx.Graph, target, args: tuple) -> torch.fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = target(args[0].meta["val"], *args[1:])
    return node


def _erase_dead(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """`node` and whatever fed only it (the roll's index chain), once nothing reads them."""
    todo = [node]
    while todo:
        n = todo.pop()
        if n.op != "call_function" or n.users:
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        todo += [a for a in inputs if not a.users and a.op == "call_function"]


def fold_counters(graph: torch.fx.Graph, record, cpu_reference: bool) -> None:
    """Every group of two or more ``copy_(n, add(n, k))`` (n a small graph input, the same k, dtype and device) as one
    ``aten._foreach_add_.Scalar(ns, k)`` where the last of the group's copies was. Only where nothing reads a
    counter after that point (a functional graph's reads come before its mutations' copies)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    groups: dict[tuple, list[tuple[torch.fx.Node, torch.fx.Node]]] = {}
    for copy in graph.find_nodes(op="call_function", target=aten.copy_.default):
        got = _counter_step(copy, cpu_reference)
        if got is not None:
            groups.setdefault(got[1], []).append((copy, got[0]))
    for (_, _, k), steps in groups.items():
        last = max((c for c, _ in steps), key=order.__getitem__)
        steps = [(c, a) for c, a in steps
                 if all(order[u] < order[last] for u in c.args[0].users if u not in (a, c))]
        if len(steps) < 2:
            continue
        with graph.inserting_after(last):
            op = graph.call_function(aten._foreach_add_.Scalar, ([c.args[0] for c, _ in steps], k))
        op.meta["val"] = None
        op.meta["stack_trace"] = steps[0][1].meta.get("stack_trace")
        for copy, add in steps:
            graph.erase_node(copy)
            graph.erase_node(add)
        record.sites[COUNTERS_RULE] += 1
        record.nodes_replaced[COUNTERS_RULE] += 2 * len(steps)
        record.fused_sites.append((COUNTERS_RULE, describe(op)))


def _counter_step(copy: torch.fx.Node, cpu_reference: bool) -> tuple[torch.fx.Node, tuple] | None:
    """(the add, its group's key (device, dtype, k)) where `copy` is ``copy_(n, add(n, k))``, n a graph input of at
    most _COUNTER_NUMEL elements, k an int and the add read by nothing else; None elsewhere."""
    counter, add = copy.args[:2]
    if counter.op != "placeholder" or copy.users or not isinstance(add, torch.fx.Node) or add.kwargs \
            or add.target not in (aten.add.Tensor, aten.add.Scalar) or len(add.args) != 2 \
            or add.args[0] is not counter or set(add.users) != {copy}:
        return None
    k, val = add.args[1], counter.meta.get("val")
    if not isinstance(k, int) or isinstance(k, bool) or not isinstance(val, Tensor) or val.is_floating_point() \
            or not isinstance(val.numel(), int) or val.numel() > _COUNTER_NUMEL:
        return None
    if val.device.type != "cuda" and not (cpu_reference and val.device.type == "cpu"):
        return None
    return add, (val.device, val.dtype, k)

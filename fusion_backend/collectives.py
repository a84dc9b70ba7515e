"""Tensor-parallel all-reduces of a decode step as one-shot all-reduces over symmetric memory.

A model sharded with DTensor (transformers' ``tp_plan="auto"``) reduces the o- and down-projections' partial sums
with ``_c10d_functional.all_reduce`` + ``wait_tensor`` in the post-grad graph, which Inductor lowers to NCCL's ring.
At a decode step's few rows the all-reduce is latency: measured on 2 H200s in CUDA graphs, NCCL 11-13 us against
6.6-9.6 us for torch's ``symm_mem.one_shot_all_reduce_copy`` (the local rows copied into a symmetric buffer and every
peer's rows summed in one kernel) from 1 to 64 rows of 2048 bf16, and the Llama-style TP 2 step 0.571 -> 0.479 ms at
batch 1 (benchmarks/RESULTS.md). Inductor's own one-shot lowering needs the input in a buffer it allocates, which a
fusekit op's output is not, so the pass rewrites the pair itself into ``fusekit::all_reduce_one_shot``.

Where the all-reduce's sum feeds a residual add and transformers' RMSNorm (or the RMSNorm alone: the embedding's
all-reduce), the three are ``fusekit::all_reduce_add_rms_norm``: one kernel (csrc/collective/) stores the rank's rows
into its slot of every peer's symmetric buffer, sums its own buffer as the peers' rows arrive (the data is its own
flag: a slot reads -0.0 until written), adds the residual and normalizes, instead of the one-shot kernel and
Inductor's add + RMSNorm kernel after it (4 H200s, TP 4: the Llama-style step 0.446 -> 0.387 ms at batch 1, 0.567 ->
0.503 at 32).

They are not patterns of the tables (their argument is a process-group name, and their tests need processes); they fire
where every rank of the group is on this host (``LOCAL_WORLD_SIZE``), on CUDA tensors of at most ``MAX_BYTES``
(CPU tensors with ``cpu_reference``, where the op is the functional all-reduce itself). Off with
``options={"disable": ["collective"]}`` (both) or by rule id.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch import Tensor

from . import _ext
from .ops import LIB
from .stats import NearMiss, describe

RULE = "collective.all_reduce_one_shot"
NORM_RULE = "collective.all_reduce_add_rms_norm"  # needs RULE: it takes the one-shot's all-reduces
RULES = (RULE, NORM_RULE)
KERNELS = ("all_reduce_add_rms_norm_p2p",)  # csrc/collective/
FAMILY = "collective"
# Measured faster than NCCL up to 64 rows of 2048 bf16 (256 KB) on 2 H200s; larger messages (prefill) stay NCCL's
MAX_BYTES = 256 * 1024
DTYPES = (torch.bfloat16, torch.float32)  # what torch's one-shot kernel dispatches (no float16)
ALIGN = 16  # bytes: the kernel's vector width; the symmetric buffer and the local rows must share it

c10d = torch.ops._c10d_functional

LIB.define("all_reduce_one_shot(Tensor x, str group_name) -> Tensor")
LIB.define("all_reduce_add_rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps, str group_name) "
           "-> (Tensor, Tensor)")
# its CUDA kernel, given this rank's symmetric buffer and the handle's device pointers (collectives.py calls it)
LIB.define("all_reduce_add_rms_norm_p2p(Tensor x, Tensor? residual, Tensor weight, float eps, Tensor(a!) buffer, "
           "Tensor(b!) epochs, int buffer_ptrs, int buffer_offset, int rank, int world_size, int max_blocks) "
           "-> (Tensor, Tensor)")


@torch.library.register_fake("fusekit::all_reduce_one_shot")
def _fake(x: Tensor, group_name: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def all_reduce_ref(x: Tensor, group_name: str) -> Tensor:
    """The sum over the group's ranks, as the graph had it (the functional all-reduce and its wait)."""
    return c10d.wait_tensor(c10d.all_reduce(x.contiguous(), "sum", group_name))


def _rms_norm(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' RMSNorm (Llama, Mistral, Qwen2 and their copies)."""
    h32 = h.to(torch.float32)
    return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


@torch.library.register_fake("fusekit::all_reduce_add_rms_norm")
def _fake_norm(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float,
               group_name: str) -> tuple[Tensor, Tensor]:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.register_fake("fusekit::all_reduce_add_rms_norm_p2p")
def _fake_p2p(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, buffer: Tensor, epochs: Tensor,
              *args: int) -> tuple[Tensor, Tensor]:
    return _fake_norm(x, residual, weight, eps, "")


def all_reduce_add_rms_norm_ref(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float,
                                group_name: str) -> tuple[Tensor, Tensor]:
    """The sum over the group's ranks, the residual added, and the RMSNorm of the result: (normed, sum)."""
    h = all_reduce_ref(x, group_name)
    if residual is not None:
        h = residual + h
    return _rms_norm(h, weight, eps), h


# the references are the CPU kernels (torch.library.impl's decorator would not return the function)
torch.library.impl("fusekit::all_reduce_one_shot", "CPU")(all_reduce_ref)
torch.library.impl("fusekit::all_reduce_add_rms_norm", "CPU")(all_reduce_add_rms_norm_ref)


_BUFFERS: dict[tuple[str, str, tuple[int, ...], torch.dtype, int], tuple[Tensor, Any]] = {}
_EPOCHS: dict[tuple[str, tuple[int, ...], torch.dtype, int], Tensor] = {}


def _aligned(x: Tensor) -> Tensor:
    x = x.contiguous()
    return x.clone() if x.data_ptr() % ALIGN else x  # a view at an odd offset: the kernels want 16-byte rows


def _symmetric(what: str, shape: tuple[int, ...], x: Tensor, group_name: str,
               fill: int | None = None) -> tuple[Tensor, Any]:
    """(this rank's symmetric buffer of `shape` and x's dtype, its handle), one per op, group, shape, dtype and
    device, allocated and exchanged (a collective: every rank reaches it in the same order) on the first call, which
    a CUDA graph's warm-up makes before its capture. `fill`: every element's bits, set on every rank before any
    rank returns (a barrier after the exchange)."""
    import torch.distributed._symmetric_memory as symm_mem

    key = (what, group_name, shape, x.dtype, x.device.index)
    got = _BUFFERS.get(key)
    if got is None:
        torch._check(not torch.cuda.is_current_stream_capturing(), lambda: (
            f"fusekit::{what}: first call inside a CUDA graph capture; run the step once before capturing"))
        buf = symm_mem.empty(shape, dtype=x.dtype, device=x.device)
        if fill is not None:
            buf.view(_BITS[x.element_size()]).fill_(fill)
        got = _BUFFERS[key] = (buf, symm_mem.rendezvous(buf, group_name))
        if fill is not None:  # filled on every rank before a peer writes into it
            import torch.distributed as dist

            group = _group(group_name)
            nccl = dist.get_backend(group) == "nccl"
            dist.barrier(group=group, device_ids=[x.device.index] if nccl else None)
            torch.cuda.synchronize(x.device)
    return got


def _check_sizes(what: str, x: Tensor) -> None:
    torch._check(x.dtype in DTYPES, lambda: f"fusekit::{what}: dtype {x.dtype} (bfloat16/float32)")
    torch._check(x.numel() * x.element_size() % ALIGN == 0,
                 lambda: f"fusekit::{what}: {x.numel() * x.element_size()} bytes, not a multiple of {ALIGN}")


@torch.library.impl("fusekit::all_reduce_one_shot", "CUDA")
def _one_shot(x: Tensor, group_name: str) -> Tensor:
    _check_sizes("all_reduce_one_shot", x)
    x = _aligned(x)
    buf, _ = _symmetric("all_reduce_one_shot", tuple(x.shape), x, group_name)
    return torch.ops.symm_mem.one_shot_all_reduce_copy(buf, x, "sum", group_name)


_BITS = {2: torch.int16, 4: torch.int32}
# the fused kernel's empty mark (-0.0) in an element's bits, by element size
_EMPTY = {2: -0x8000, 4: -0x80000000}


@torch.library.impl("fusekit::all_reduce_add_rms_norm", "CUDA")
def _fused_norm(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float,
                group_name: str) -> tuple[Tensor, Tensor]:
    import torch.distributed as dist

    _check_sizes("all_reduce_add_rms_norm", x)
    x = _aligned(x)
    world = dist.get_world_size(_group(group_name))
    # a slot per rank, in two halves the calls alternate, empty at first
    buf, h = _symmetric("all_reduce_add_rms_norm", (2, world, *x.shape), x, group_name, _EMPTY[x.element_size()])
    key = (group_name, tuple(x.shape), x.dtype, x.device.index)
    epochs = _EPOCHS.get(key)
    if epochs is None:  # each block's count of calls, on the device: it advances with every graph replay
        # a block waits for the same block of every peer: no more than the GPU runs at once (one a multiprocessor)
        blocks = torch.cuda.get_device_properties(x.device).multi_processor_count
        epochs = _EPOCHS[key] = torch.zeros(blocks, dtype=torch.int32, device=x.device)
    return torch.ops.fusekit.all_reduce_add_rms_norm_p2p(
        x, None if residual is None else _aligned(residual), weight.contiguous(), eps, buf, epochs,
        h.buffer_ptrs_dev, buf.data_ptr() - h.buffer_ptrs[h.rank], h.rank, h.world_size, epochs.numel())


def _group(group_name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def _group_is_local(group_name: str) -> bool:
    """Every rank of the group on this host: the group no larger than the launcher's LOCAL_WORLD_SIZE (torchrun and
    transformers' tensor-parallel loading set it) and this host's GPUs."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return False
    try:
        size = dist.get_world_size(_group(group_name))
    except Exception:  # noqa: BLE001 - an unknown group: leave it to Inductor
        return False
    return 1 < size <= _local_world_size()


def _why_not(x: torch.fx.Node, op: str, group: object, cpu_reference: bool) -> tuple[str, bool] | None:
    """(why the all-reduce stays NCCL's, whether that is a measured choice rather than what the op cannot take), or
    None where it is rewritten."""
    val = x.meta.get("val")
    if op != "sum":
        return f"reduce op {op!r}: only sums", False
    if not isinstance(group, str):
        return f"group {group!r}: not a process-group name", False
    if not isinstance(val, Tensor) or val.dtype not in DTYPES:
        return "dtype: bfloat16/float32 only (torch's one-shot kernel)", False
    if val.device.type != "cuda" and not (cpu_reference and val.device.type == "cpu"):
        return f"device {val.device.type}", False
    if not all(isinstance(d, int) for d in val.shape):
        return "symbolic shape: one symmetric buffer per shape", False
    nbytes = val.numel() * val.element_size()
    if nbytes % ALIGN:
        return f"{nbytes} bytes: not a multiple of {ALIGN}", False
    if nbytes > MAX_BYTES:
        return f"{nbytes} bytes (> {MAX_BYTES}): NCCL's ring is the faster one there", True
    if val.device.type == "cuda" and not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy"):
        return "this torch has no symm_mem.one_shot_all_reduce_copy", False
    if not _group_is_local(group):
        return "the group's ranks are not all on this host (LOCAL_WORLD_SIZE)", False
    if val.device.type == "cuda" and not _peers_reachable(min(_local_world_size(), torch.cuda.device_count())):
        return "this host's GPUs cannot all read each other's memory (peer access)", False
    return None


def _local_world_size() -> int:
    """The launcher's count of ranks on this host (torchrun, transformers' tensor-parallel loading); 0 if unset."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or 0)


def environment() -> tuple[str | None, int]:
    """What the rewrite's choice reads besides the graph (for the pass's cache key): the launcher's local world
    size and this host's GPU count."""
    return os.environ.get("LOCAL_WORLD_SIZE"), torch.cuda.device_count()


@functools.cache
def _peers_reachable(n: int) -> bool:
    """Every pair of this host's first n GPUs (those the local ranks use) has peer access (NVLink or PCIe P2P), which
    symmetric memory needs; asked once per n, not at every all-reduce of every graph."""
    return n > 1 and all(torch.cuda.can_device_access_peer(a, b) for a in range(n) for b in range(n) if a != b)


_EPS = 0.2718  # a stand-in the traced pattern shows as its own literal (the eps argument)


def _after_add(s: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    h = residual + s  # transformers: hidden_states = residual + hidden_states
    return _rms_norm(h, weight, eps), h


def _after_add_commuted(s: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    h = s + residual
    return _rms_norm(h, weight, eps), h


def _alone(s: Tensor, weight: Tensor, eps: float) -> Tensor:  # the embedding's all-reduce: no residual yet
    return _rms_norm(s, weight, eps)


@functools.cache
def _norm_patterns(dtype: torch.dtype) -> tuple[Any, ...]:
    """The search patterns of an all-reduce's sum (`s`) into the residual add and the RMSNorm, traced like
    Inductor's graphs for `dtype`, made once."""
    from torch._inductor import pattern_matcher as pm

    def t(*shape: int) -> Tensor:
        return torch.randn(shape).to(dtype)

    out = []
    for fn, args, names in ((_after_add, [t(2, 8), t(2, 8), t(8), _EPS], ["s", "residual", "weight", "eps"]),
                            (_after_add_commuted, [t(2, 8), t(2, 8), t(8), _EPS], ["s", "residual", "weight", "eps"]),
                            (_alone, [t(2, 8), t(8), _EPS], ["s", "weight", "eps"])):
        out.append(pm.fx_to_pattern(pm.fwd_only(fn, args), argnames=names, scalar_workaround={"eps": _EPS}))
    return tuple(out)


def _norm_matches(graph: torch.fx.Graph, sums: set[torch.fx.Node]) -> dict[torch.fx.Node, list[Any]]:
    """{an all-reduce's sum in `sums`: the matches of a residual add + RMSNorm after it}. An add of two sums
    matches for both (one of them is the residual); the checks (_why_not_norm) pick."""
    from torch._inductor import pattern_matcher as pm

    found: dict[torch.fx.Node, list[Any]] = {}
    store = pm.PatternMatcherPass()
    for dtype in sorted({n.meta["val"].dtype for n in sums}, key=str):
        for expr in _norm_patterns(dtype):
            pm.register_graph_pattern(expr, lambda m: m.kwargs["s"] in sums, pass_dict=store)(
                lambda m, *a, **k: found.setdefault(m.kwargs["s"], []).append(m))
    store.apply(graph)
    return found


def _why_not_norm(match: Any, s: torch.fx.Node, order: dict[torch.fx.Node, int]) -> str | None:
    """Why the matched add + RMSNorm cannot be the fused op's, or None."""
    if any(n._erased for n in match.nodes):
        return "its add was fused with another all-reduce"
    if s.meta["val"].device.type == "cuda" and (
            missing := _ext.missing_cuda_kernel(KERNELS[0], s.meta["val"].device)):
        return missing
    x, w, res, eps = s.meta["val"], match.kwargs["weight"], match.kwargs.get("residual"), match.kwargs["eps"]
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    if not isinstance(eps, float):
        return f"eps {eps!r}: not a number"
    if not isinstance(wv, Tensor) or wv.shape != x.shape[-1:] or wv.dtype != x.dtype:
        return f"weight {describe(w) if isinstance(w, torch.fx.Node) else w!r}: not [{x.shape[-1]}] {x.dtype}"
    if x.shape[-1] * x.element_size() % ALIGN:
        return f"rows of {x.shape[-1] * x.element_size()} bytes: not a multiple of {ALIGN}"
    if res is not None and (res.meta.get("val") is None or res.meta["val"].shape != x.shape
                            or res.meta["val"].dtype != x.dtype):
        return "the residual's shape or dtype differs from the all-reduce's"
    if res is not None and len(s.users) != 1:
        return "the all-reduce's sum has users besides the residual add"
    first = min(match.nodes, key=order.__getitem__)
    if any(order[n] > order[first] for n in (w, res) if isinstance(n, torch.fx.Node)):
        return "the weight or residual is computed after the add"
    inside = set(match.nodes)
    if res is None and any(order[u] < order[first] for u in s.users if u not in inside):
        return "the all-reduce's sum is used before its RMSNorm"
    return None


def rewrite(graph: torch.fx.Graph, record, cpu_reference: bool, rules: tuple[str, ...] = RULES) -> None:
    """Each ``wait_tensor(all_reduce(x, "sum", group))`` whose all-reduce has no other user, as
    ``fusekit::all_reduce_add_rms_norm`` with the residual add and RMSNorm after it (NORM_RULE), else as
    ``fusekit::all_reduce_one_shot(x, group)``."""
    pairs = []
    for wait in list(graph.nodes):
        ar = wait.args[0] if wait.op == "call_function" and wait.target is c10d.wait_tensor.default else None
        if not isinstance(ar, torch.fx.Node) or ar.target is not c10d.all_reduce.default or len(ar.users) != 1:
            continue
        x, op, group = ar.args[:3]
        why = _why_not(x, op, group, cpu_reference)
        if why is not None:
            record.near_misses.append(NearMiss(RULE, describe(ar), *why))
            continue
        pairs.append((wait, ar, x, group))
    matches = _norm_matches(graph, {w for w, *_ in pairs}) if NORM_RULE in rules and pairs else {}
    order = {n: i for i, n in enumerate(graph.nodes)}
    renamed: dict[torch.fx.Node, torch.fx.Node] = {}  # a fused site's sum, now its op's output (a later residual)
    for wait, ar, x, group in pairs:
        m, why = None, None
        for cand in matches.get(wait, ()):
            why = _why_not_norm(cand, wait, order)
            if why is None:
                m = cand
                break
        if why is not None:
            record.near_misses.append(NearMiss(NORM_RULE, describe(ar), why, False))
        if m is not None:
            renamed.update(_fuse_norm(graph, record, m, wait, ar, x, group, renamed, order))
            continue
        with graph.inserting_before(wait):
            new = graph.call_function(torch.ops.fusekit.all_reduce_one_shot.default, (x, group))
        new.meta["val"] = wait.meta["val"]  # not the rest: eager_input_vals would be the wait's arguments
        new.meta["stack_trace"] = ar.meta.get("stack_trace")
        wait.replace_all_uses_with(new)
        renamed[wait] = new
        graph.erase_node(wait)
        graph.erase_node(ar)
        record.sites[RULE] += 1
        record.nodes_replaced[RULE] += 2
        record.fused_sites.append((RULE, describe(ar)))


def _fuse_norm(graph: torch.fx.Graph, record, m: Any, wait: torch.fx.Node, ar: torch.fx.Node, x: torch.fx.Node,
               group: str, renamed: dict[torch.fx.Node, torch.fx.Node],
               order: dict[torch.fx.Node, int]) -> dict[torch.fx.Node, torch.fx.Node]:
    """The match as the fused op; -> {the nodes it replaced that a later match may name: their replacements}."""
    import operator

    outs = m.output_nodes()
    normed, h = outs[0], (outs[1] if len(outs) > 1 else wait)
    res = m.kwargs.get("residual")
    res = renamed.get(res, res)
    first = min(m.nodes, key=order.__getitem__)  # as _why_not_norm found it (the graph's order, not walked again)
    with graph.inserting_before(first):
        new = graph.call_function(torch.ops.fusekit.all_reduce_add_rms_norm.default,
                                  (x, res, m.kwargs["weight"], m.kwargs["eps"], group))
        got = [graph.call_function(operator.getitem, (new, i)) for i in range(2)]
    new.meta["val"] = (normed.meta["val"], h.meta["val"])
    new.meta["stack_trace"] = ar.meta.get("stack_trace")
    for g, old in zip(got, (normed, h)):
        g.meta["val"] = old.meta["val"]
        old.replace_all_uses_with(g)
    size = len(m.nodes) + 2
    m.erase_nodes()
    for n in (wait, ar):
        if not n.users:
            graph.erase_node(n)
    record.sites[NORM_RULE] += 1
    record.nodes_replaced[NORM_RULE] += size
    record.fused_sites.append((NORM_RULE, describe(ar)))
    return {normed: got[0], h: got[1]}


def drop_backward_hooks(model: torch.nn.Module) -> int:
    """Remove `model`'s module-level backward hooks, for inference; returns how many modules had them.

    transformers 5.17's tensor-parallel plans put one on Qwen3-, Gemma-3- and Qwen3-MoE-style per-head q/k norms
    (``replicated_with_grad_allreduce``: training's gradient all-reduce). Dynamo breaks the graph at every module that
    has one ("Module-level backwards hooks require compiled autograd"), for any backend, so each layer becomes
    several graphs, recompiled per layer until the recompile limit leaves the rest eager. Under ``torch.no_grad``
    these hooks never run. Newer transformers (5.24) registers parameter hooks only while grad is enabled instead.
    """
    n = 0
    for m in model.modules():
        if m._backward_hooks or m._backward_pre_hooks:
            m._backward_hooks.clear()
            m._backward_pre_hooks.clear()
            n += 1
    return n

"""Tensor-parallel all-reduces of a decode step as one-shot all-reduces over symmetric memory.

A model sharded with DTensor (transformers' ``tp_plan="auto"``) reduces the o- and down-projections' partial sums
with ``_c10d_functional.all_reduce`` + ``wait_tensor`` in the post-grad graph, which Inductor lowers to NCCL's ring.
At a decode step's few rows the all-reduce is latency: measured on 2 H200s in CUDA graphs, NCCL 11-13 us against
6.6-9.6 us for torch's ``symm_mem.one_shot_all_reduce_copy`` (the local rows copied into a symmetric buffer and every
peer's rows summed in one kernel) from 1 to 64 rows of 2048 bf16, and the Llama-style TP 2 step 0.571 -> 0.479 ms at
batch 1 (benchmarks/RESULTS.md). Inductor's own one-shot lowering needs the input in a buffer it allocates, which a
fusekit op's output is not, so the pass rewrites the pair itself into ``fusekit::all_reduce_one_shot``.

It is not a pattern of the tables (its argument is a process-group name, and its tests need processes); it fires
where every rank of the group is on this host (``LOCAL_WORLD_SIZE``), on CUDA tensors of at most ``MAX_BYTES``
(CPU tensors with ``cpu_reference``, where the op is the functional all-reduce itself). Off with
``options={"disable": ["collective"]}``.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .ops import LIB
from .stats import NearMiss, describe

RULE = "collective.all_reduce_one_shot"
FAMILY = "collective"
# Measured faster than NCCL up to 64 rows of 2048 bf16 (256 KB) on 2 H200s; larger messages (prefill) stay NCCL's
MAX_BYTES = 256 * 1024
DTYPES = (torch.bfloat16, torch.float32)  # what torch's one-shot kernel dispatches (no float16)
ALIGN = 16  # bytes: the kernel's vector width; the symmetric buffer and the local rows must share it

c10d = torch.ops._c10d_functional

LIB.define("all_reduce_one_shot(Tensor x, str group_name) -> Tensor")


@torch.library.register_fake("fusekit::all_reduce_one_shot")
def _fake(x: Tensor, group_name: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.impl("fusekit::all_reduce_one_shot", "CPU")
def _reference(x: Tensor, group_name: str) -> Tensor:
    """The sum over the group's ranks, as the graph had it (the functional all-reduce and its wait)."""
    return c10d.wait_tensor(c10d.all_reduce(x.contiguous(), "sum", group_name))


_BUFFERS: dict[tuple[str, tuple[int, ...], torch.dtype, int], Tensor] = {}


@torch.library.impl("fusekit::all_reduce_one_shot", "CUDA")
def _one_shot(x: Tensor, group_name: str) -> Tensor:
    """One symmetric buffer per group, shape, dtype and device, allocated and exchanged (a collective: every rank
    reaches it in the same order) on the first call, which a CUDA graph's warm-up makes before its capture."""
    import torch.distributed._symmetric_memory as symm_mem

    torch._check(x.dtype in DTYPES, lambda: f"fusekit::all_reduce_one_shot: dtype {x.dtype} (bfloat16/float32)")
    torch._check(x.numel() * x.element_size() % ALIGN == 0,
                 lambda: f"fusekit::all_reduce_one_shot: {x.numel() * x.element_size()} bytes, not a multiple of {ALIGN}")
    x = x.contiguous()
    if x.data_ptr() % ALIGN:  # a view at an odd offset: the kernel wants the buffer's alignment
        x = x.clone()
    key = (group_name, tuple(x.shape), x.dtype, x.device.index)
    buf = _BUFFERS.get(key)
    if buf is None:
        torch._check(not torch.cuda.is_current_stream_capturing(), lambda: (
            "fusekit::all_reduce_one_shot: first call inside a CUDA graph capture; run the step once before capturing"))
        buf = symm_mem.empty(x.shape, dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buf, group_name)
        _BUFFERS[key] = buf
    return torch.ops.symm_mem.one_shot_all_reduce_copy(buf, x, "sum", group_name)


def _group_is_local(group_name: str) -> bool:
    """Every rank of the group on this host: the group no larger than the launcher's LOCAL_WORLD_SIZE (torchrun and
    transformers' tensor-parallel loading set it) and this host's GPUs."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return False
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        size = dist.get_world_size(_resolve_process_group(group_name))
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


def rewrite(graph: torch.fx.Graph, record, cpu_reference: bool) -> None:
    """Each ``wait_tensor(all_reduce(x, "sum", group))`` whose all-reduce has no other user, as
    ``fusekit::all_reduce_one_shot(x, group)``."""

    for wait in list(graph.nodes):
        ar = wait.args[0] if wait.op == "call_function" and wait.target is c10d.wait_tensor.default else None
        if not isinstance(ar, torch.fx.Node) or ar.target is not c10d.all_reduce.default or len(ar.users) != 1:
            continue
        x, op, group = ar.args[:3]
        why = _why_not(x, op, group, cpu_reference)
        if why is not None:
            record.near_misses.append(NearMiss(RULE, describe(ar), *why))
            continue
        with graph.inserting_before(wait):
            new = graph.call_function(torch.ops.fusekit.all_reduce_one_shot.default, (x, group))
        new.meta["val"] = wait.meta["val"]  # not the rest: eager_input_vals would be the wait's arguments
        new.meta["stack_trace"] = ar.meta.get("stack_trace")
        wait.replace_all_uses_with(new)
        graph.erase_node(wait)
        graph.erase_node(ar)
        record.sites[RULE] += 1
        record.nodes_replaced[RULE] += 2
        record.fused_sites.append((RULE, describe(ar)))

"""fusekit's tensor-parallel collectives on 2-4 GPUs of one host (NCCL ranks, one process a GPU):
fusekit::all_reduce_add_rms_norm against a float64 reference (at most 2x the error of the same ops in eager
PyTorch: NCCL's all-reduce, the add, the RMSNorm in the same dtype), the residual stream bit-identical on every rank,
hundreds of back-to-back calls with the ranks skewed (the exchange: no rank overwrites a buffer a peer still
reads, none reads a slot before it is written), replays of a CUDA graph, all_reduce_one_shot against NCCL, and bad
direct calls (skipped below 2 GPUs)."""
import os

import pytest
import torch

from fusion_backend import _ext

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2
    or _ext.missing_cuda_kernel("all_reduce_add_rms_norm_p2p", torch.device("cuda")) is not None,
    reason="needs 2 CUDA GPUs and the all_reduce_add_rms_norm_p2p kernel")]

EPS = 1e-6
# (rows, hidden): a decode step's rows at Llama widths, odd row counts, the smallest row (16 bytes of bfloat16)
SHAPES = ((1, 2048), (5, 4096), (32, 2048), (64, 1024), (3, 8), (7, 5120))


def _f64_reference(xs, residual, weight):
    s = torch.stack(xs).double().sum(0)
    h = s if residual is None else residual.double() + s
    return weight.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS), h


def _same(rows, hidden, dtype, seed):
    """A tensor every rank draws the same (residual, weight)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(rows, hidden, generator=g, device="cuda").to(dtype)


def _check_against_eager(group, world, rank, dtype, rows, hidden, residual_too):
    import torch.distributed as dist

    from fusion_backend.collectives import all_reduce_add_rms_norm_ref

    x = torch.randn(rows, hidden, device="cuda").to(dtype)  # each rank its own partial sum
    res = _same(rows, hidden, dtype, 1) if residual_too else None
    w = (1 + 0.1 * _same(1, hidden, torch.float32, 2)[0]).to(dtype)
    normed, h = torch.ops.fusekit.all_reduce_add_rms_norm(x, res, w, EPS, group)
    e_normed, e_h = all_reduce_add_rms_norm_ref(x, res, w, EPS, group)  # NCCL and eager ops in dtype
    xs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(xs, x)
    r_normed, r_h = _f64_reference(xs, res, w)
    floor = 1e-6 if dtype == torch.float32 else 0.0
    for name, got, eager, ref in (("normed", normed, e_normed, r_normed), ("h", h, e_h, r_h)):
        err, err_eager = (got.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
        assert err <= 2 * err_eager + floor, (rank, dtype, rows, hidden, residual_too, name, err, err_eager)
    hs = [torch.empty_like(h) for _ in range(world)]
    dist.all_gather(hs, h)
    assert all(torch.equal(hs[0], o) for o in hs[1:]), "the residual stream differs between ranks"


def _rank(rank, world, port):
    import torch.distributed as dist

    from fusion_backend.collectives import all_reduce_add_rms_norm_ref
    from fusion_backend.tools.tp_bench import NO_MULTICAST, init_rank

    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    init_rank(rank, world, port, "nccl")
    try:
        group = dist.group.WORLD.group_name
        torch.manual_seed(100 + rank)
        for dtype in (torch.bfloat16, torch.float32):
            for rows, hidden in SHAPES:
                for residual_too in (True, False):
                    _check_against_eager(group, world, rank, dtype, rows, hidden, residual_too)

        # the one-shot all-reduce: at most 2x NCCL's error against the float64 sum (more than 2 ranks may sum in
        # another order, rounding to bfloat16 at each step)
        x = torch.randn(9, 2048, device="cuda", dtype=torch.bfloat16)
        one = torch.ops.fusekit.all_reduce_one_shot(x, group)
        nccl = x.clone()
        dist.all_reduce(nccl)
        xs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(xs, x)
        ref = torch.stack(xs).double().sum(0)
        assert (one.double() - ref).abs().max() <= 2 * (nccl.double() - ref).abs().max()

        # 300 back-to-back calls, one rank held back in turn, two shapes (two buffers) interleaved and -0.0 in
        # the rows (the kernel's empty mark): each result at most 2x eager's error (NCCL, the add and the RMSNorm
        # in bfloat16) against float64 from the same inputs
        rows, hidden, dtype = 4, 2048, torch.bfloat16
        w = (1 + 0.1 * _same(1, hidden, torch.float32, 3)[0]).to(dtype)
        res = _same(rows, hidden, dtype, 4)
        xs = [torch.randn(rows if i % 3 else 1, hidden, device="cuda", dtype=dtype) for i in range(300)]
        for x in xs[::2]:
            x[:, ::5] = -0.0
        got = []
        for i, x in enumerate(xs):
            if i % world == rank:
                torch.cuda._sleep(20_000)  # ~10 us: this rank arrives late
            got.append(torch.ops.fusekit.all_reduce_add_rms_norm(x, res[:len(x)], w, EPS, group))
        for x, (normed, h) in zip(xs, got):
            gathered = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(gathered, x)
            r_normed, r_h = _f64_reference(gathered, res[:len(x)], w)
            e_normed, e_h = all_reduce_add_rms_norm_ref(x, res[:len(x)], w, EPS, group)
            for v, e, r in ((normed, e_normed, r_normed), (h, e_h, r_h)):
                assert (v.double() - r).abs().max() <= 2 * (e.double() - r).abs().max()

        # a CUDA graph of three chained calls, replayed 50 times: the same outputs every time
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        res0 = _same(rows, hidden, dtype, 5)

        def step():
            n1, h1 = torch.ops.fusekit.all_reduce_add_rms_norm(x, res0, w, EPS, group)
            n2, h2 = torch.ops.fusekit.all_reduce_add_rms_norm(n1, h1, w, EPS, group)
            return torch.ops.fusekit.all_reduce_add_rms_norm(n2, h2, w, EPS, group)

        want = step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])

        # bad direct calls raise
        with pytest.raises(RuntimeError, match="dtype"):
            torch.ops.fusekit.all_reduce_add_rms_norm(x.half(), None, w.half(), EPS, group)
        with pytest.raises(RuntimeError, match="weight"):
            torch.ops.fusekit.all_reduce_add_rms_norm(x, None, w[:-8], EPS, group)
        with pytest.raises(RuntimeError, match="symmetric memory"):
            buf = torch.empty(2, world, *x.shape, dtype=dtype, device="cuda")
            epochs = torch.zeros(1, dtype=torch.int32, device="cuda")
            torch.ops.fusekit.all_reduce_add_rms_norm_p2p(x, None, w, EPS, buf, epochs, 0, 0, rank, world, 1)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_all_reduce_add_rms_norm_on_gpus(world):
    import torch.multiprocessing as mp

    from fusion_backend.tools.tp_bench import free_port

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    mp.spawn(_rank, args=(world, free_port()), nprocs=world)

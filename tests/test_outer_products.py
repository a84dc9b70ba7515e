"""A bmm with K = 1 (an outer product per batch, as rotary embeddings compute their angles) left to Inductor
becomes a broadcast multiply (passes.outer_products_as_multiplies): the same values, fused by Inductor into
the kernels that read it. Shapes it does not cover keep their bmm. On CPU Inductor's own decompositions
already turn such a matmul into a multiply before fusekit's pass, so the CPU tests run the rewrite on ATen
graphs traced here; the GPU tests (skipped without one) go through torch.compile."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusion_backend import stats
from fusion_backend.backend import backend
from fusion_backend.passes import outer_products_as_multiplies
from fusion_backend.report import Report, no_compile_caches

bmm = torch.ops.aten.bmm.default


def rotary_angles(inv_freq, position_ids):  # as transformers' LlamaRotaryEmbedding.forward computes them
    freqs = (inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
             @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rewritten(fn, *args, mode="fake"):
    """fn traced to ATen (bmm kept), rewritten by the pass's function; (graph module, outer products)."""
    gm = make_fx(fn, tracing_mode=mode, decomposition_table={})(*args)
    record = stats.new_record(())
    outer_products_as_multiplies(gm.graph, record)
    gm.recompile()
    return gm, record.outer_products


def _inputs(n=3, positions=1):
    return 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128)), torch.randint(0, 4096, (n, positions))


@pytest.mark.parametrize("positions", [1, 7])
def test_rotary_angles_as_a_multiply_equal_the_bmm(positions):
    args = _inputs(positions=positions)
    gm, n = _rewritten(rotary_angles, *args)
    assert n == 1 and not list(gm.graph.find_nodes(op="call_function", target=bmm)), gm.code
    for g, r in zip(gm(*args), rotary_angles(*args)):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_outer_product_bmm_equals_the_multiply(dtype):
    a, b = torch.randn(4, 33, 1, dtype=dtype), torch.randn(4, 1, 17, dtype=dtype)
    gm, n = _rewritten(lambda a, b: torch.bmm(a, b) * 2, a, b)
    out, ref = gm(a, b), torch.bmm(a.double(), b.double()) * 2  # one product: exact in float64
    assert n == 1 and out.dtype == dtype and out.shape == (4, 33, 17)
    torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)  # rounded once, as the bmm rounds


def test_other_bmms_keep_the_bmm():
    cases = [(torch.randn(2, 5, 2), torch.randn(2, 2, 3)),                               # K = 2: a sum
             (torch.randint(0, 5, (2, 5, 1)), torch.randint(0, 5, (2, 1, 3)))]            # not floating
    for a, b in cases:
        gm, n = _rewritten(torch.bmm, a, b, mode="real")
        assert n == 0 and len(gm.graph.find_nodes(op="call_function", target=bmm)) == 1


def test_symbolic_batch_still_rewritten():
    gm, n = _rewritten(lambda a, b: torch.bmm(a, b).exp(), torch.randn(3, 8, 1), torch.randn(3, 1, 6), mode="symbolic")
    assert n == 1
    for m in (2, 5):
        a, b = torch.randn(m, 8, 1), torch.randn(m, 1, 6)
        torch.testing.assert_close(gm(a, b), torch.bmm(a, b).exp(), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("enabled", [True, False])
def test_compiled_rotary_angles_on_the_gpu(enabled):
    """On CUDA Inductor keeps the bmm (its K = 1 decomposition is only under coordinate_descent_tuning)."""
    args = [x.cuda() for x in _inputs(n=8)]
    ref = rotary_angles(*args)  # (TF32 off by default: the bmm multiplies in float32, as the rewrite does)
    with stats.collect() as records, no_compile_caches():
        torch._dynamo.reset()
        out = torch.compile(rotary_angles, backend=backend(options={"outer_products": enabled}))(*args)
    rep = Report(list(records))
    assert rep.outer_products == (1 if enabled else 0), str(rep)
    for g, r in zip(out, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=0)

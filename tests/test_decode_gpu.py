"""fusekit::decode_attention on the GPU: masks of every kind at awkward sizes against a float64 reference
(at most 2x a same-dtype eager attention's error), fully masked rows as PyTorch's fused SDPA gives them, bad
direct calls, and a compiled decode step of a real-size model against Inductor (skipped without a GPU)."""
import pytest
import torch
import torch.nn.functional as F

from fusion_backend import _ext
from fusion_backend.patterns.decode import (decode_attention_eager, decode_attention_ref, decode_attention_softcap_ref,
                                            repeat_kv)
from fusion_backend.tools.cuda_graphs import capture_output

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or _ext.missing_cuda_kernel("decode_attention", torch.device("cuda")) is not None,
    reason="needs a CUDA GPU and the decode_attention kernel")]

op = torch.ops.fusekit.decode_attention


def _qkv(b, hq, hkv, lq, s, d, dt):
    q = torch.randn(b, lq, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    return q, torch.randn(b, hkv, s, d, device="cuda", dtype=dt), torch.randn(b, hkv, s, d, device="cuda", dtype=dt)


def _mask(kind, b, lq, s, pos):
    """keep [b, 1, lq, s]: True = attend."""
    j = torch.arange(s, device="cuda").view(1, 1, 1, s)
    i = (pos + torch.arange(lq, device="cuda")).view(1, 1, lq, 1)
    if kind == "causal":     # a static cache at position pos
        return (j <= i).expand(b, 1, lq, s)
    if kind == "window":     # Mistral's sliding window of 100
        return ((j <= i) & (j > i - 100)).expand(b, 1, lq, s)
    if kind == "padded":     # left padding: sequence r starts at slot 7 * r
        start = 7 * torch.arange(b, device="cuda").view(b, 1, 1, 1)
        return (j <= i) & (j >= start)
    if kind == "one":        # one visible slot per row
        return (j == i).expand(b, 1, lq, s)
    if kind == "all":
        return torch.ones(b, 1, lq, s, dtype=torch.bool, device="cuda")
    raise ValueError(kind)


def _check(q, k, v, mask, scale=0.0883, fn=op):
    out = fn(q, k, v, mask, scale)
    ref64 = decode_attention_ref(q.double(), k.double(), v.double(),
                                 None if mask is None else (mask if mask.dtype == torch.bool else mask.double()), scale)
    same = decode_attention_eager(q, k, v, mask, scale)
    err = (out.double() - ref64).abs().max().item()
    err_eager = (same.double() - ref64).abs().max().item()
    assert err <= 2 * err_eager + 1e-6, (err, err_eager)
    assert out.stride() == q.stride()
    return out


SHAPES = [(1, 32, 8, 1, 4096, 128), (4, 16, 4, 1, 1000, 128), (2, 8, 1, 4, 257, 64), (3, 4, 4, 16, 129, 256),
          (64, 16, 4, 1, 520, 128), (1, 12, 2, 1, 1, 64), (5, 28, 4, 2, 3000, 128), (2, 16, 2, 16, 700, 128),
          (1, 4, 1, 1, 70001, 64), (32, 16, 4, 1, 2500, 128), (16, 8, 8, 1, 2500, 64),
          (2, 32, 32, 1, 1000, 96), (4, 16, 4, 2, 300, 80), (3, 8, 1, 1, 2049, 160), (32, 16, 4, 1, 2500, 112),
          (2, 8, 2, 16, 520, 192)]
# (70001: a long cache, 1094 blocks, its last one partial; 2500 of a 4-row group at batch 32 and 64: splits of 5
# blocks, the 8-block splits' code path; the last five: head dims in a padded tile)


# additive masks as users and transformers build them: -inf, float16's min (transformers' bf16 masks hold it
# rounded, -65536), float32's min
HIDE = [(None, float("-inf")), (torch.float32, float("-inf")), (None, torch.finfo(torch.float16).min),
        (torch.float32, torch.finfo(torch.float32).min)]


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["causal", "window", "padded", "one", "all", "none"])
def test_masks_against_float64(shape, kind, dt):
    b, hq, hkv, lq, s, d = shape
    q, k, v = _qkv(b, hq, hkv, lq, s, d, dt)
    for pos in sorted({0, s // 3, max(s - lq, 0)}):  # position 0, the middle, a fully visible cache
        if pos + lq > s:
            continue
        mask = None if kind == "none" else _mask(kind, b, lq, s, pos)
        _check(q, k, v, mask)
        if mask is not None:  # the same mask as additive 0/-inf or 0/min, in q's dtype and in float32
            for mdt, hide in HIDE:
                _check(q, k, v, torch.zeros(mask.shape, dtype=mdt or dt, device="cuda").masked_fill(~mask, hide))


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 8, 4, 1, 4096, 256), (32, 16, 8, 1, 1000, 256), (4, 32, 16, 2, 300, 128)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["causal", "window", "padded"])
def test_softcap_against_float64(shape, kind, dt):
    """Gemma-2's soft-capped scores (cap 50, and 5 where the tanh bends most scores): at most 2x the error of the
    same chain run eagerly in q's dtype."""
    b, hq, hkv, lq, s, d = shape
    q, k, v = _qkv(b, hq, hkv, lq, s, d, dt)
    keep = _mask(kind, b, lq, s, s // 2)
    mask = torch.zeros(keep.shape, dtype=dt, device="cuda").masked_fill(~keep, torch.finfo(dt).min)
    for cap in (50.0, 5.0):
        out = torch.ops.fusekit.decode_attention_softcap(q, k, v, mask, 0.0625, cap)
        ref64 = decode_attention_softcap_ref(q.double(), k.double(), v.double(), mask.double(), 0.0625, cap)
        same = decode_attention_softcap_ref(q, k, v, mask, 0.0625, cap)
        err, err_eager = [(x.double() - ref64).abs().max().item() for x in (out, same)]
        assert err <= 2 * err_eager + 1e-6, (cap, err, err_eager)
    with pytest.raises(RuntimeError, match="softcap"):
        torch.ops.fusekit.decode_attention_softcap(q, k, v, mask, 0.0625, 0.0)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fully_masked_rows_as_fused_sdpa(dt):
    """A row the mask hides entirely: what PyTorch's own fused SDPA (the replaced op) returns for it."""
    b, hq, hkv, lq, s, d = 3, 16, 4, 2, 300, 128
    q, k, v = _qkv(b, hq, hkv, lq, s, d, dt)
    keep = _mask("causal", b, lq, s, 150).clone()
    keep[1, :, 0, :] = False
    bias = torch.zeros(keep.shape, dtype=dt, device="cuda").masked_fill(~keep, float("-inf"))
    out = op(q, k, v, bias, 0.0883)
    fused = F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=bias, scale=0.0883)
    torch.testing.assert_close(out[1, :, 0], fused[1, :, 0], atol=0, rtol=0)
    assert (out[1, :, 0] == 0).all()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("s", [40, 300, 5000])  # one split (hidden_rows kernel), a few, many
@pytest.mark.parametrize("d", [128, 96, 80, 192])
def test_rows_hidden_by_a_finite_mask_as_the_chain(dt, s, d):
    """A row whose every key is hidden by a finite minimum: the replaced chain still weighs every key by
    exp(score + min), so the output is that weighted mean (recomputed without skipping), not 0."""
    b, hq, hkv, lq = 3, 16, 4, 2
    q, k, v = _qkv(b, hq, hkv, lq, s, d, dt)
    keep = _mask("causal", b, lq, s, 150).clone()
    keep[1, :, 0, :] = False
    for hide in (torch.finfo(torch.float16).min, -1e9):
        mdt = dt if hide > -7e4 else torch.float32
        bias = torch.zeros(keep.shape, dtype=mdt, device="cuda").masked_fill(~keep, hide)
        out = _check(q, k, v, bias)
        assert out[1, :, 0].abs().amax() > 0


@pytest.mark.parametrize("shape", [(32, 16, 4, 1, 4096, 128), (1, 16, 4, 1, 4096, 128), (2, 8, 1, 4, 3000, 64),
                                   (3, 4, 4, 2, 2000, 256), (1, 16, 16, 1, 4096, 128), (8, 12, 12, 1, 1024, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_repeatable_and_replayable_in_a_cuda_graph(shape):
    """Many splits, their partial softmaxes combined by a second kernel in split order: two calls agree bit
    for bit, and a CUDA graph of the op, replayed on new inputs written in place, gives what a direct call
    gives (its workspace comes from the graph's pool)."""
    b, hq, hkv, lq, s, d = shape
    q, k, v = _qkv(b, hq, hkv, lq, s, d, torch.bfloat16)
    keep = _mask("causal", b, lq, s, 1024)
    first = _check(q, k, v, keep)
    torch.testing.assert_close(op(q, k, v, keep, 0.0883), first, atol=0, rtol=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op(q, k, v, keep, 0.0883)  # warm-up off the default stream, as torch.cuda.graph's docs do
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = op(q, k, v, keep, 0.0883)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.testing.assert_close(replayed, op(q, k, v, keep, 0.0883), atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(32, 16, 16, 1, 4096, 128), (1, 16, 16, 1, 4096, 128), (3, 12, 12, 1, 1024, 64),
                                   (2, 32, 32, 1, 1000, 96), (4, 8, 8, 1, 40, 80), (1, 4, 4, 1, 70001, 112)],
                         ids=lambda s: "x".join(map(str, s)))
def test_one_row_tile(shape, monkeypatch):
    """MHA decode (one query row per KV head) runs in a one-row tile: on sm_90 builds the streaming tile (bulk copies
    of whole K/V blocks, CUDA cores), elsewhere (and with FUSEKIT_DECODE_ATTN_ROWS=1) the tensor-core one with a
    deeper ring. With the splits forced equal (FUSEKIT_DECODE_ATTN_SPLITS) the tensor-core tile computes what the
    4-row tile (FUSEKIT_DECODE_ATTN_ROWS=4) computes for that row bit for bit; the default tile, with its own splits,
    splits of 1 and 16 blocks and rings of 1, 2 and 6 stages, and a cache whose rows are not contiguous (another
    tile then), is within 2x eager's error of a float64 reference. Masks that hide blocks, the cache's partial last
    block, one split (40 keys, with a row a finite mask hides entirely), many splits."""
    b, hq, hkv, lq, s, d = shape
    q, k, v = _qkv(b, hq, hkv, lq, s, d, torch.bfloat16)
    keep = _mask("padded", b, lq, s, min(1000, s - 1)).clone()
    if s == 40:
        keep[0, :, 0, :] = False
    masks = [keep, None, torch.zeros(keep.shape, dtype=torch.bfloat16, device="cuda").masked_fill(~keep, -65536.0)]
    nb = (s + 63) // 64
    wide = torch.randn(b, hkv, s, d + 8, device="cuda", dtype=torch.bfloat16)  # rows d + 8 apart
    for mask in masks:
        monkeypatch.setenv("FUSEKIT_DECODE_ATTN_SPLITS", str((nb + 7) // 8))  # 8 blocks: both tiles take it
        monkeypatch.setenv("FUSEKIT_DECODE_ATTN_ROWS", "1")
        one = op(q, k, v, mask, 0.0883)
        monkeypatch.setenv("FUSEKIT_DECODE_ATTN_ROWS", "4")
        four = op(q, k, v, mask, 0.0883)
        monkeypatch.delenv("FUSEKIT_DECODE_ATTN_ROWS")
        torch.testing.assert_close(one, four, atol=0, rtol=0)
        for splits in ("0", str(nb), str((nb + 15) // 16)):
            monkeypatch.setenv("FUSEKIT_DECODE_ATTN_SPLITS", splits)
            _check(q, k, v, mask)
        monkeypatch.delenv("FUSEKIT_DECODE_ATTN_SPLITS")
        for stages in ("1", "2", "6"):
            monkeypatch.setenv("FUSEKIT_DECODE_ATTN_STAGES", stages)
            _check(q, k, v, mask)
        monkeypatch.delenv("FUSEKIT_DECODE_ATTN_STAGES")
        _check(q, wide[..., :d], wide[..., 8:], mask)


@pytest.mark.parametrize("which", ["decode_attention", "decode_linear", "decode_qkv"])
def test_pdl_launches_wait_for_the_kernel_before(which, monkeypatch):
    """fusekit's decode kernels launch with programmatic dependent launch on sm_90+ (csrc/pdl.cuh: they may start
    while the kernel before them finishes, and wait before reading). Here that kernel is a long reduction that
    writes the op's input last; in a CUDA graph replayed on new data, the op must read the new input: its output
    equals a direct call's on that input, and the graph captured without PDL (FUSEKIT_PDL=0), bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    if which == "decode_attention":
        q, k, v = _qkv(32, 16, 4, 1, 4096, 128, dt)
        keep = _mask("causal", 32, 1, 4096, 1024)
        x = q.contiguous()
        op_fn = lambda t: op(t, k, v, keep, 0.0883)  # noqa: E731
    else:
        x = torch.empty(32, 2048, device="cuda", dtype=dt)
        w = [torch.randn(n, 2048, device="cuda", dtype=dt, generator=g) / 45 for n in (2048, 512, 512)]
        if which == "decode_linear":
            op_fn = lambda t: torch.ops.fusekit.decode_linear(t, w[0], None, "none")  # noqa: E731
        else:
            op_fn = lambda t: torch.ops.fusekit.decode_qkv(t, w[0], w[1], w[2], None, None, None)  # noqa: E731
    src = torch.empty(512, *x.shape, device="cuda", dtype=dt)

    def step():
        torch.sum(src, dim=0, out=x)  # one kernel, 64 MB read before x is written
        return op_fn(x)

    graphs = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv("FUSEKIT_PDL", pdl)  # read at each launch, so at the capture
        src.normal_(0, 0.02, generator=g)
        graphs[pdl] = capture_output(step)
        assert graphs[pdl][0] is not None
    monkeypatch.delenv("FUSEKIT_PDL")
    for _ in range(3):
        src.normal_(0, 0.02, generator=g)
        outs = []
        for graph, out in graphs.values():
            graph.replay()
            outs.append([t.clone() for t in (out if isinstance(out, (tuple, list)) else [out])])
        want = op_fn(torch.sum(src, dim=0))
        for got in outs:
            for a, b in zip(got, want if isinstance(want, (tuple, list)) else [want]):
                torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_bad_direct_calls_raise():
    q, k, v = _qkv(2, 8, 2, 1, 64, 64, torch.float16)
    bad = {
        "float16 or bfloat16": (q.float(), k.float(), v.float(), None),
        "head dim": (q[..., :48], k[..., :48], v[..., :48], None),
        "Hq % Hkv": (q[:, :6], *_qkv(2, 4, 4, 1, 64, 64, torch.float16)[1:], None),
        "aligned": (q, torch.randn(2, 2, 64 * 64 + 1, device="cuda", dtype=torch.float16)[..., 1:].view(2, 2, 64, 64),
                    v, None),
        "broadcast": (q, k, v, torch.zeros(2, 1, 1, 63, device="cuda", dtype=torch.float16)),
        "CUDA": (q.cpu(), k, v, None),
    }
    for what, args in bad.items():
        with pytest.raises(RuntimeError, match="fusekit"):
            op(*args, 0.125)


@pytest.mark.parametrize("d", [128, 96, 80])
def test_padded_head_dims_fire(d):
    """Head dims 96 and 80 (PADDED_HEAD_DIMS) fire on CUDA like 128, and the step matches SDPA."""
    import fusion_backend

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask, scale=0.1)
    q, k, v = _qkv(2, 16, 4, 1, 256, d, torch.float16)
    mask = torch.zeros(2, 1, 1, 256, device="cuda", dtype=torch.float16)
    rep = fusion_backend.explain(f, q, k, v, mask)
    assert rep.sites["decode.gqa"] == 1, str(rep)
    torch.testing.assert_close(rep.output, f(q, k, v, mask), atol=2e-3, rtol=2e-3)


def test_decode_step_fires_and_matches_inductor():
    """A Llama-style step (GQA 16/4, head dim 128, bf16) at batch 8, position 1000 of 2048 slots."""
    from fusion_backend import stats
    from fusion_backend.tools import decode_bench
    from fusion_backend.backend import backend
    from fusion_backend.report import Report, no_compile_caches

    st = decode_bench.Step("llama", "cuda", 8, 2048)
    with torch.no_grad():
        st.at(1000)
        eager = st(st.model).float()
        torch._dynamo.reset()
        st.at(1000)
        ind = st(torch.compile(st.model)).float()
        torch._dynamo.reset()
        with stats.collect() as records, no_compile_caches():
            st.at(1000)
            fk = st(torch.compile(st.model, backend=backend())).float()
    rep = Report(list(records))
    assert rep.sites["decode.gqa"] == st.model.config.num_hidden_layers, str(rep)
    err, err_eager = (fk - ind).abs().max().item(), (eager - ind).abs().max().item()
    assert err <= 2 * err_eager + 1e-3, (err, err_eager)


def test_caches_over_20_steps_under_cuda_graphs():
    """20 steps of a Llama-style model (bf16) with fusekit under CUDA graphs (reduce-overhead) and in
    eager: slots past the last step stay exactly as they were, the written rows agree within bf16 noise."""
    from fusion_backend.tools import decode_bench
    from fusion_backend.backend import backend

    runs = {}
    tokens = torch.randint(0, 32000, (4, 20), generator=torch.Generator().manual_seed(3)).cuda()
    for be in ("eager", "fusekit"):
        st = decode_bench.Step("llama", "cuda", 4, 512)
        torch._dynamo.reset()
        fn = st.model if be == "eager" else torch.compile(st.model, backend=backend(mode="reduce-overhead"))
        before = [layer.keys.clone() for layer in st.cache.layers]
        st.at(100)
        with torch.no_grad():
            for i in range(20):  # the same tokens for both (greedy tokens may part at a bf16 near-tie)
                st.token.copy_(tokens[:, i:i + 1])
                torch.compiler.cudagraph_mark_step_begin()
                st(fn)
                st.pos.add_(1)
        runs[be] = (st, before)
    (se, be_), (sf, bf) = runs["eager"], runs["fusekit"]
    for le, lf, b0e, b0f in zip(se.cache.layers, sf.cache.layers, be_, bf):
        assert torch.equal(lf.keys[:, :, 120:], b0f[:, :, 120:])  # untouched past the 20 written slots
        assert torch.equal(le.keys[:, :, :100], lf.keys[:, :, :100])  # the prompt rows: never rewritten
        rel = (lf.keys[:, :, 100:120].float() - le.keys[:, :, 100:120].float()).norm() / le.keys[:, :, 100:120].float().norm()
        assert rel < 0.05, rel.item()


# ---- fusekit::gqa_attention: a prompt's attention with grouped KV heads (PyTorch's cuDNN kernel) ----------
gqa = torch.ops.fusekit.gqa_attention


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["causal", "padded", "window", "all"])
@pytest.mark.parametrize("shape", [(1, 16, 4, 512, 4096, 128), (2, 12, 2, 100, 333, 128), (3, 8, 1, 40, 40, 64),
                                   (8, 16, 4, 17, 1000, 64)])
def test_gqa_attention_masks_against_float64(shape, kind, dt):
    b, hq, hkv, lq, s, d = shape
    q, k, v = _qkv(b, hq, hkv, lq, s, d, dt)
    keep = _mask(kind, b, lq, s, s - lq)
    for mask in (keep, torch.zeros(keep.shape, dtype=dt, device="cuda").masked_fill(~keep, float("-inf")), None):
        _check(q, k, v, mask, fn=gqa)


@pytest.mark.parametrize("cudnn", [True, False])
def test_gqa_attention_hidden_rows_fallback_and_graphs(cudnn):
    """Rows the mask hides entirely give 0 (bool and -inf); with cuDNN's attention switched off the op runs
    the replaced chain and gives the same answers; a CUDA-graph replay gives what a direct call gives."""
    q, k, v = _qkv(2, 16, 4, 64, 300, 128, torch.bfloat16)
    keep = _mask("causal", 2, 64, 300, 200).clone()
    keep[1, :, 5] = False  # one row sees nothing
    masks = (keep, torch.zeros(keep.shape, dtype=q.dtype, device="cuda").masked_fill(~keep, float("-inf")))
    prev = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    try:
        for mask in masks:
            out = _check(q, k, v, mask, fn=gqa)
            assert torch.equal(out[1, :, 5], torch.zeros_like(out[1, :, 5]))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            gqa(q, k, v, masks[1], 0.0883)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out_g = gqa(q, k, v, masks[1], 0.0883)
        q.normal_()  # new data, replayed
        g.replay()
        torch.testing.assert_close(out_g, gqa(q, k, v, masks[1], 0.0883), rtol=0, atol=0)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(prev)


def test_gqa_attention_bad_calls():
    q, k, v = _qkv(1, 8, 2, 20, 40, 64, torch.float16)
    bad = {
        "fp32": (q.float(), k.float(), v.float(), None),
        "heads": (q, k[:, :1].repeat(1, 3, 1, 1), v[:, :1].repeat(1, 3, 1, 1), None),
        "3-D": (q[0], k, v, None),
        "fp32 mask": (q, k, v, torch.zeros(1, 1, 20, 40, device="cuda")),
        "mask shape": (q, k, v, torch.zeros(1, 1, 20, 41, device="cuda", dtype=q.dtype)),
        "cpu k": (q, k.cpu(), v, None),
    }
    for what, args in bad.items():
        with pytest.raises(RuntimeError, match="fusekit"):
            gqa(*args, 0.125)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_prefill_against_a_static_cache_fires_and_matches_inductor(name):
    """A 300-token prompt (batch 2) into a 1024-slot StaticCache: prefill.gqa fires once per layer, the logits
    are as close to Inductor's as eager's are, and the cache rows written are eager's within bf16 noise."""
    from fusion_backend import stats
    from fusion_backend.backend import backend
    from fusion_backend.report import Report, no_compile_caches
    from fusion_backend.tools.decode_bench import Prompt

    p = Prompt(name, "cuda", 2, 300, 1024)
    with torch.no_grad():
        eager = p(p.model).float()
        k_eager = p.cache.layers[0].keys[:, :, :300].clone()
        torch._dynamo.reset()
        ind = p(torch.compile(p.model)).float()
        torch._dynamo.reset()
        with stats.collect() as records, no_compile_caches():
            fk = p(torch.compile(p.model, backend=backend())).float()
    rep = Report(list(records))
    assert rep.sites["prefill.gqa"] == p.model.config.num_hidden_layers, str(rep)
    err, err_eager = (fk - ind).abs().max().item(), (eager - ind).abs().max().item()
    assert err <= 2 * err_eager + 1e-3, (err, err_eager)
    k = p.cache.layers[0].keys[:, :, :300].float()
    assert (k - k_eager.float()).norm() / k_eager.float().norm() < 1e-2


# ---- fusekit::window_roll: a full sliding window's step, in place (fusion_backend/kv_cache.py) ----------------
roll = torch.ops.fusekit.window_roll


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn],
                         ids=["fp16", "bf16", "fp32", "fp8"])
@pytest.mark.parametrize("shape", [(32, 4, 1024, 128), (1, 1, 5, 64), (2, 3, 4096, 256), (3, 2, 1, 128),
                                   (2, 8, 1000, 80), (1, 2, 333, 16), (64, 1, 512, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_window_roll_exact(shape, dt):
    """Every slot moved bit for bit, the new row in the last; the cache a slice of a larger buffer (its first head
    untouched) and the new row strided, as they come in a model."""
    b, h, w, d = shape
    if d * dt.itemsize % 16:
        pytest.skip("rows of 16-byte chunks only")
    big = torch.randn(b, h + 1, w, d, device="cuda").to(dt)
    cache, head0 = big[:, 1:], big[:, 0].clone()
    new = torch.randn(b, 1, h, d, device="cuda").to(dt).transpose(1, 2)
    want = torch.cat([_bits(cache)[:, :, 1:], _bits(new)], 2)
    roll(cache, new)
    assert torch.equal(_bits(cache), want) and torch.equal(_bits(big[:, 0]), _bits(head0))


@pytest.mark.parametrize("piece", ["1", "2", "4", "16"])
def test_window_roll_every_column_piece(piece, monkeypatch):
    """The column pieces the launch can choose (FUSEKIT_WINDOW_ROLL_PIECE): one tile a CTA (1, 2 chunks) and several
    (4: 2 tiles, 16: 8 tiles of the 1000-slot window)."""
    monkeypatch.setenv("FUSEKIT_WINDOW_ROLL_PIECE", piece)
    cache = torch.randn(8, 4, 1000, 128, device="cuda", dtype=torch.bfloat16)
    new = torch.randn(8, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    want = torch.cat([cache[:, :, 1:], new], 2)
    roll(cache, new)
    assert torch.equal(cache, want)


def test_window_roll_in_a_cuda_graph():
    cache, new = torch.randn(8, 4, 1024, 128, device="cuda", dtype=torch.bfloat16), torch.randn(
        8, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    want = cache.clone()
    for _ in range(3):
        want = torch.cat([want[:, :, 1:], new], 2)
    g = torch.cuda.CUDAGraph()
    work = cache.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        roll(work, new)  # warm-up: a first step
        with torch.cuda.graph(g, stream=s):
            roll(work, new)
    torch.cuda.synchronize()
    g.replay()  # with the warm-up: three steps
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(work, want)


def test_window_roll_bad_calls():
    cache = torch.randn(2, 4, 64, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="window_roll"):
        roll(cache, torch.randn(2, 4, 2, 128, device="cuda", dtype=torch.bfloat16))  # two new rows
    with pytest.raises(RuntimeError, match="window_roll"):
        roll(cache, torch.randn(2, 4, 1, 128, device="cuda", dtype=torch.float16))  # another dtype
    with pytest.raises(RuntimeError, match="window_roll"):
        roll(torch.randn(2, 4, 64, 4, device="cuda", dtype=torch.bfloat16),
             torch.randn(2, 4, 1, 4, device="cuda", dtype=torch.bfloat16))  # 8-byte rows
    with pytest.raises(RuntimeError, match="window_roll"):
        roll(cache[..., ::2], torch.randn(2, 4, 1, 64, device="cuda", dtype=torch.bfloat16))  # strided rows


# ---- fusekit::decode_attention_roll: both rolls and the attention in one pass (fusion_backend/kv_cache.py) -------
roll_attention = torch.ops.fusekit.decode_attention_roll
ROLL_SHAPES = [(32, 16, 4, 1024, 128), (1, 16, 4, 1024, 128), (4, 8, 1, 512, 256), (3, 8, 2, 200, 64),
               (2, 12, 4, 1000, 96), (5, 4, 4, 70, 128), (2, 32, 2, 4096, 128), (2, 32, 1, 300, 64)]
# (b, Hq, Hkv, window, D): Mistral-style at batch 32 and 1, Gemma-3-style MQA, a window of partial blocks, a padded
# head dim, MHA, a long window (many splits), 32 query rows a KV head (more than one CTA row: the two-pass path)


def _roll_inputs(b, hq, hkv, w, d, dt):
    """q as a model gives it, the caches slices of larger buffers (their head 0 must stay), new rows strided."""
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    bufs = [torch.randn(b, hkv + 1, w, d, device="cuda", dtype=dt) for _ in range(2)]
    new = [torch.randn(b, 1, hkv, d, device="cuda", dtype=dt).transpose(1, 2) for _ in range(2)]
    return q, bufs, new


def _roll_mask(kind, b, w, dt):
    """Over the moved window: none; left padding (sequence r starts at slot 70 r: hidden blocks that still move);
    an additive mask whose finite minimum hides every key of sequence 1 (the row computed again)."""
    if kind is None:
        return None
    keep = _mask("padded", b, 1, w, w)
    keep = keep & (torch.arange(w, device="cuda") >= 70 * torch.arange(b, device="cuda").view(b, 1, 1, 1))
    if kind == "padded":
        return keep
    keep = keep.clone()
    keep[1 % b] = False
    return torch.zeros(keep.shape, dtype=dt, device="cuda").masked_fill(~keep, torch.finfo(torch.float16).min)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", ROLL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", [None, "padded", "finite"])
@pytest.mark.parametrize("splits", ["", "1", "3"], ids=["own-splits", "1-split", "3-splits"])
def test_roll_attention_is_the_rolls_then_the_attention(shape, kind, splits, dt, monkeypatch):
    """The caches moved bit for bit (the split boundaries' rows included), the output within 2x a same-dtype eager
    attention's error of float64 over the moved window, and bit for bit what window_roll then decode_attention
    give (FUSEKIT_ROLL_ATTENTION=separate) with the same splits (the op's own choice takes fewer with the roll)."""
    if splits:
        monkeypatch.setenv("FUSEKIT_DECODE_ATTN_SPLITS", splits)
    b, hq, hkv, w, d = shape
    q, (bk, bv), (nk, nv) = _roll_inputs(b, hq, hkv, w, d, dt)
    mask = _roll_mask(kind, b, w, dt)
    k, v, k2, v2 = bk[:, 1:], bv[:, 1:], bk[:, 1:].clone(), bv[:, 1:].clone()
    heads0 = bk[:, 0].clone(), bv[:, 0].clone()
    want_k, want_v = torch.cat([k[:, :, 1:], nk], 2), torch.cat([v[:, :, 1:], nv], 2)
    out = roll_attention(q, k, v, nk, nv, mask, 0.0883)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    assert torch.equal(bk[:, 0], heads0[0]) and torch.equal(bv[:, 0], heads0[1])
    mask64 = None if mask is None else mask if mask.dtype == torch.bool else mask.double()
    ref64 = decode_attention_ref(q.double(), want_k.double(), want_v.double(), mask64, 0.0883)
    same = decode_attention_eager(q, want_k, want_v, mask, 0.0883)
    err, err_eager = (out.double() - ref64).abs().max().item(), (same.double() - ref64).abs().max().item()
    assert err <= 2 * err_eager + 1e-6, (err, err_eager)
    if kind == "finite":
        assert out[1 % b].abs().amax() > 0  # the hidden row: weighed over every key, not 0
    monkeypatch.setenv("FUSEKIT_ROLL_ATTENTION", "separate")
    out2 = roll_attention(q, k2, v2, nk, nv, mask, 0.0883)
    assert torch.equal(k2, want_k) and torch.equal(v2, want_v)
    assert torch.equal(out, out2) if splits else (out2.double() - ref64).abs().max().item() <= 2 * err_eager + 1e-6


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_roll_attention_softcap(dt):
    """Gemma-2's soft-capped scores over the moved window."""
    b, hq, hkv, w, d = 4, 8, 4, 512, 256
    q, (bk, bv), (nk, nv) = _roll_inputs(b, hq, hkv, w, d, dt)
    k, v = bk[:, 1:], bv[:, 1:]
    want_k, want_v = torch.cat([k[:, :, 1:], nk], 2), torch.cat([v[:, :, 1:], nv], 2)
    mask = torch.zeros(b, 1, 1, w, device="cuda", dtype=dt)
    out = roll_attention(q, k, v, nk, nv, mask, 0.0625, 50.0)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    ref64 = decode_attention_softcap_ref(q.double(), want_k.double(), want_v.double(), mask.double(), 0.0625, 50.0)
    same = decode_attention_softcap_ref(q, want_k, want_v, mask, 0.0625, 50.0)
    err, err_eager = (out.double() - ref64).abs().max().item(), (same.double() - ref64).abs().max().item()
    assert err <= 2 * err_eager + 1e-6, (err, err_eager)


def test_roll_attention_in_a_cuda_graph():
    """Three steps (a warm-up and two replays): the caches as three rolls leave them, the output the last step's."""
    b, hq, hkv, w, d = 8, 16, 4, 1024, 128
    q, (bk, bv), (nk, nv) = _roll_inputs(b, hq, hkv, w, d, torch.bfloat16)
    k, v = bk[:, 1:].contiguous(), bv[:, 1:].contiguous()
    want_k, want_v = k.clone(), v.clone()
    for _ in range(3):
        want_k, want_v = torch.cat([want_k[:, :, 1:], nk], 2), torch.cat([want_v[:, :, 1:], nv], 2)
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(s):
        roll_attention(q, k, v, nk, nv, None, 0.0883)
        with torch.cuda.graph(g, stream=s):
            out = roll_attention(q, k, v, nk, nv, None, 0.0883)
    torch.cuda.synchronize()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    ref = decode_attention_ref(q.double(), want_k.double(), want_v.double(), None, 0.0883)
    assert (out.double() - ref).abs().max().item() < 2e-2


def test_roll_attention_bad_calls():
    q, (bk, bv), (nk, nv) = _roll_inputs(2, 8, 4, 64, 128, torch.bfloat16)
    k, v = bk[:, 1:], bv[:, 1:]
    with pytest.raises(RuntimeError, match="decode_attention_roll"):
        roll_attention(q, k, v, nk[:, :2], nv, None, 0.1)  # new rows of another head count
    with pytest.raises(RuntimeError, match="decode_attention_roll"):
        roll_attention(q, k, v, nk.half(), nv, None, 0.1)  # another dtype
    with pytest.raises(RuntimeError, match="decode_attention_roll"):
        roll_attention(q, k, v, nk, nv, None, 0.1, -1.0)  # a negative softcap
    with pytest.raises(RuntimeError, match="head dim"):
        roll_attention(q[..., :48], k[..., :48], v[..., :48], nk[..., :48], nv[..., :48], None, 0.1)


def test_full_sliding_window_steps_under_cuda_graphs():
    """A Mistral-style model (window 1024 of a 2048-slot cache) at positions 1500-1502: every layer's window is full
    and rolls. fusekit under CUDA graphs takes each layer's rolls and attention in one op; its logits within 2x
    Inductor's error against eager, the moved rows bit for bit eager's."""
    from fusion_backend import stats
    from fusion_backend.backend import backend
    from fusion_backend.report import Report, no_compile_caches
    from fusion_backend.tools import decode_bench

    st = decode_bench.Step("mistral", "cuda", 4, 2048)
    layers = st.model.config.num_hidden_layers

    def run(fn):
        st.restore()
        outs = []
        with torch.no_grad():
            for i in range(3):
                st.at(1500 + i)
                torch.compiler.cudagraph_mark_step_begin()
                outs.append(st(fn).float().clone())
        return outs, [(layer.keys.clone(), layer.values.clone()) for layer in st.cache.layers]

    eager, rows_e = run(st.model)
    torch._dynamo.reset()
    ind, _ = run(torch.compile(st.model, mode="reduce-overhead"))
    torch._dynamo.reset()
    with stats.collect() as records, no_compile_caches():
        fk, rows_f = run(torch.compile(st.model, backend=backend(mode="reduce-overhead")))
    torch._dynamo.reset()
    rep = Report(list(records))
    assert rep.sites["cache.window_roll_reader"] >= layers and not rep.errors, str(rep)
    for e, i, f in zip(eager, ind, fk):
        err, err_ind = (f - e).abs().max().item(), (i - e).abs().max().item()
        assert err <= 2 * err_ind + 1e-3, (err, err_ind)
    for (ke, ve), (kf, vf) in zip(rows_e, rows_f):
        w = ke.shape[2]
        assert torch.equal(ke[:, :, :w - 3], kf[:, :, :w - 3]) and torch.equal(ve[:, :, :w - 3], vf[:, :, :w - 3])
        for a, b in ((ke, kf), (ve, vf)):
            rel = (a[:, :, w - 3:].float() - b[:, :, w - 3:].float()).norm() / a[:, :, w - 3:].float().norm()
            assert rel < 0.05, rel.item()

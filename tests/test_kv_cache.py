"""fusekit::window_roll and its rewrite (kv_cache.py) on CPU: the op against torch.roll, opcheck, the rewrite where
a full sliding window rolls (transformers' StaticSlidingWindowLayer, and the same steps written by hand), the caches
and logits after the step as eager leaves them, and where it must not fire (another shift, the cache read elsewhere,
the rule disabled). The length counters' one launch (cache.length_counters) the same way. The kernel's own tests:
tests/test_decode_gpu.py."""
import pytest
import torch

import fusion_backend
from fusion_backend.kv_cache import COUNTERS_RULE, READER_RULE, RULE
from fusion_backend.ops import window_roll_ref

op = torch.ops.fusekit.window_roll


def _rolled(cache, new):
    out = cache.roll(-1, dims=-2)
    out[:, :, -1:] = new
    return out


@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (1, 1, 1, 4), (3, 2, 64, 16)])
def test_op_is_roll_and_last_slot(shape):
    cache = torch.randn(shape)
    new = torch.randn(shape[0], 1, shape[1], shape[3]).transpose(1, 2)  # strided, as q/k come
    want = _rolled(cache, new)
    op(cache, new)
    assert torch.equal(cache, want)
    torch.library.opcheck(op, (torch.randn(shape), torch.randn(shape[0], shape[1], 1, shape[3])))


def _step(cache, k, shift=-1):
    """The full sliding window's update as transformers writes it, then a read of the window."""
    new = cache.roll(shift, dims=-2)
    new[:, :, torch.tensor([-1])] = k
    cache.copy_(new)
    return cache.sum(-1) * 2


def _compiled(fn, *args, **options):
    rep = fusion_backend.explain(fn, *args, options={"cpu_reference": True, **options})
    return rep.output, rep


@pytest.mark.parametrize("shift,fires,k_shape", [(-1, True, (2, 4, 1, 8)), (-1, True, (4, 1, 8)), (-1, True, (1, 4, 1, 8)),
                                                  (-2, False, (2, 4, 1, 8)), (1, False, (2, 4, 1, 8))])
def test_rewrite_fires_only_for_the_roll_by_one(shift, fires, k_shape):
    """A roll by one slot to the left fires, with the new row as index_put broadcasts it (at batch 1 transformers'
    graph has [H, 1, D]); other shifts do not."""
    b = 1 if len(k_shape) == 3 else 2
    cache, k = torch.randn(b, 4, 16, 8), torch.randn(k_shape)
    want_cache = cache.clone()
    want = _step(want_cache, k, shift)
    got_cache = cache.clone()
    out, rep = _compiled(lambda c, x: _step(c, x, shift), got_cache, k)
    assert rep.sites[RULE] == int(fires), str(rep)
    torch.testing.assert_close(out, want)  # (Inductor's sums: another order)
    assert torch.equal(got_cache, want_cache)


def test_rewrite_keeps_a_cache_read_elsewhere():
    def step(cache, k):
        before = cache[:, :, 0].clone()  # the old window read besides the roll
        return _step(cache, k), before

    cache, k = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 1, 8)
    want_cache = cache.clone()
    want = step(want_cache, k)
    got_cache = cache.clone()
    out, rep = _compiled(step, got_cache, k)
    assert rep.sites[RULE] == 0 and any(m.pattern == RULE for m in rep.near_misses), str(rep)
    torch.testing.assert_close(out, want)
    assert torch.equal(got_cache, want_cache)


@pytest.mark.slow
@pytest.mark.parametrize("name,rolled,batch,disable", [("mistral", 2, 2, None), ("mistral", 2, 1, None),
                                                        ("mistral", 2, 2, RULE), ("mistral", 2, 2, READER_RULE),
                                                        ("gemma3", 2, 2, None), ("gemma3", 2, 1, READER_RULE),
                                                        ("gemma2", 1, 2, None)])
def test_full_sliding_window_step(name, rolled, batch, disable):
    """A decode step of a tiny model whose sliding windows (32 slots) are full: each of the `rolled` layers (of 2)
    takes its two rolls and its decode attention in one op (or, with that rule off, the rolls one op each; with
    the roll rule off, neither), and the logits and every cache row match eager's step."""
    from transformers import StaticCache

    from test_architectures import _model
    from fusion_backend.tools.decode_bench import cache_restorer

    cfg, model = _model(name)
    cache = StaticCache(config=cfg, max_cache_len=64)
    tok = torch.randint(3, 512, (batch, 1))
    pos = torch.tensor([40])
    with torch.no_grad():
        model(tok, past_key_values=cache, cache_position=torch.tensor([0]), use_cache=True)
        for layer in cache.layers:
            for t in (layer.keys, layer.values):
                t.normal_(0, 0.5)
            if isinstance(getattr(layer, "cumulative_length_int", None), int):
                layer.cumulative_length_int = 40  # full: the step rolls the window
        restore = cache_restorer(cache)
        want = model(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        want_rows = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        restore()
        options = {"cpu_reference": True, **({"disable": [disable]} if disable else {})}
        rep = fusion_backend.explain(model, tok, past_key_values=cache, cache_position=pos, use_cache=True,
                                     options=options)
    assert not rep.errors, str(rep)
    assert rep.sites[READER_RULE] == (0 if disable else rolled), str(rep)
    assert rep.sites[RULE] == (2 * rolled if disable == READER_RULE else 0), str(rep)
    torch.testing.assert_close(rep.output.logits, want, atol=1e-4, rtol=1e-4)
    for layer, (k, v) in zip(cache.layers, want_rows):
        torch.testing.assert_close(layer.keys, k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.values, v, atol=1e-5, rtol=1e-5)
        if hasattr(layer, "cumulative_length_int"):  # the rolled rows: moved, not computed
            assert torch.equal(layer.keys[:, :, :-1], k[:, :, :-1]) and torch.equal(layer.values[:, :, :-1], v[:, :, :-1])


def test_reference_is_the_ops_cpu_kernel():
    cache, new = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 1, 4)
    a, b = cache.clone(), cache.clone()
    window_roll_ref(a, new)
    op(b, new)
    assert torch.equal(a, b) and torch.equal(a, _rolled(cache, new))


def test_roll_attention_reference_is_the_rolls_then_the_attention():
    """fusekit::decode_attention_roll on CPU (its reference): both caches rolled in place, then decode attention over
    them (GQA 8/2, a bool mask; soft-capped too); opcheck on its schema (two caches mutated, a result)."""
    from fusion_backend.patterns.decode import decode_attention_ref, decode_attention_softcap_ref

    fused = torch.ops.fusekit.decode_attention_roll
    q, k, v = torch.randn(2, 8, 1, 16), torch.randn(2, 2, 24, 16), torch.randn(2, 2, 24, 16)
    nk, nv = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    keep = torch.rand(2, 1, 1, 24) > 0.3
    bias = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))  # (soft-capped attention adds its mask)
    want_k, want_v = _rolled(k, nk), _rolled(v, nv)
    for softcap, mask in ((0.0, keep), (20.0, bias)):
        kk, vv = k.clone(), v.clone()
        out = fused(q, kk, vv, nk, nv, mask, 0.25, softcap)
        assert torch.equal(kk, want_k) and torch.equal(vv, want_v)
        want = decode_attention_softcap_ref(q, want_k, want_v, mask, 0.25, softcap) if softcap else \
            decode_attention_ref(q, want_k, want_v, mask, 0.25)
        torch.testing.assert_close(out, want)
    torch.library.opcheck(fused, (q, k.clone(), v.clone(), nk, nv, keep, 0.25, 0.0))


def test_roll_attention_not_fused_where_the_cache_is_read_elsewhere():
    """A layer whose rolled K cache is also read outside its attention keeps both rolls as window_roll (a near miss
    of the fused rule), and the result and caches match eager."""
    from fusion_backend.patterns.decode import decode_attention_ref

    def step(kc, vc, q, nk, nv):
        for c, n in ((kc, nk), (vc, nv)):
            r = c.roll(-1, dims=-2)
            r[:, :, torch.tensor([-1])] = n
            c.copy_(r)
        return decode_attention_ref(q, kc, vc, None, 0.25), kc.sum()

    q, k, v = torch.randn(2, 8, 1, 64), torch.randn(2, 2, 32, 64), torch.randn(2, 2, 32, 64)
    nk, nv = torch.randn(2, 2, 1, 64), torch.randn(2, 2, 1, 64)
    wk, wv = k.clone(), v.clone()
    want = step(wk, wv, q, nk, nv)
    gk, gv = k.clone(), v.clone()
    out, rep = _compiled(step, gk, gv, q, nk, nv)
    assert rep.sites[READER_RULE] == 0 and rep.sites[RULE] == 2, str(rep)
    assert any(m.pattern == READER_RULE for m in rep.near_misses), str(rep)
    torch.testing.assert_close(out, want)
    assert torch.equal(gk, wk) and torch.equal(gv, wv)


# ---- cache.length_counters: every layer's `cumulative_length.add_(n)` in one foreach add -----------------------------
def _count_step(counters, x, steps=(1, 1, 1)):
    """Each layer writes at its counter's slot, then advances it in place (transformers' StaticLayer)."""
    out = x
    for c, n in zip(counters, steps):
        out = out * 2 + c.float()
        c.add_(n)
    return out


@pytest.mark.parametrize("steps,sites,options", [((1, 1, 1), 1, {}), ((1, 2, 1), 1, {}), ((1, 2, 3), 0, {}),
                                                  ((1, 1, 1), 0, {"disable": [COUNTERS_RULE]}),
                                                  ((1, 1, 1), 0, {"disable": ["cache"]})])
def test_counters_advance_in_one_op(steps, sites, options):
    """Two or more counters advanced by the same step fold into one ``_foreach_add_`` (with unequal steps, those
    that agree); the counters and the result are eager's. A lone counter, or the rule disabled: nothing."""
    counters = [torch.tensor([5]), torch.tensor(7), torch.tensor([9])]
    x = torch.randn(4)
    want_counters = [c.clone() for c in counters]
    want = _count_step(want_counters, x, steps)
    out, rep = _compiled(lambda a, b, c, x: _count_step([a, b, c], x, steps), *counters, x, **options)
    assert rep.sites[COUNTERS_RULE] == sites and not rep.errors, str(rep)
    assert ("_foreach_add_" in rep.graphs[0].graph_code) == bool(sites)
    assert torch.equal(out, want)
    assert all(torch.equal(c, w) for c, w in zip(counters, want_counters))


def test_counters_left_alone_where_not_small_integers():
    """Float tensors and large ones advanced in place are not counters: Inductor keeps them."""
    for make in (lambda: torch.randn(3), lambda: torch.zeros(64, dtype=torch.long)):
        a, b = make(), make()
        wa, wb = a.clone(), b.clone()
        wa.add_(1)
        wb.add_(1)
        out, rep = _compiled(lambda a, b: (a.add_(1), b.add_(1)) and a * 2, a, b)
        assert rep.sites[COUNTERS_RULE] == 0, str(rep)
        assert torch.equal(a, wa) and torch.equal(b, wb)


def test_decode_step_counters_in_one_op():
    """A decode step of a tiny Llama (2 layers, transformers' StaticCache: a counter per layer): one site, and the
    counters, cache rows and logits as eager leaves them."""
    from fusion_backend.tools.decode_bench import Step, cache_restorer

    st = Step("llama", "cpu", 2, 64)
    st.at(8)
    restore = cache_restorer(st.cache)
    with torch.no_grad():
        want = st(st.model)
        want_lens = [n.clone() for n in st.lens]
        want_rows = [(layer.keys.clone(), layer.values.clone()) for layer in st.cache.layers]
        restore()
        rep = fusion_backend.explain(st.model, st.token, past_key_values=st.cache, cache_position=st.pos,
                                     use_cache=True, options={"cpu_reference": True})
    assert len(st.lens) >= 2 and rep.sites[COUNTERS_RULE] == 1 and not rep.errors, str(rep)
    assert [int(n) for n in st.lens] == [int(n) for n in want_lens] == [9] * len(st.lens)
    torch.testing.assert_close(rep.output.logits, want, atol=1e-4, rtol=1e-4)
    for layer, (k, v) in zip(st.cache.layers, want_rows):  # (the new row: computed in another order)
        torch.testing.assert_close(layer.keys, k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.values, v, atol=1e-5, rtol=1e-5)

"""Inductor's pad_mm rewrite (zero-pad a misaligned bmm's operands on CUDA, slice the result back) is decided
by an on-device benchmark, so the rules traced through Inductor carry a padded search form too, whose pad
amounts are left open; `padding_exact` then accepts a match only where the slices give back the unpadded
product. Both halves are checked here on CPU with hand-written pad_mm graphs."""
import types

import torch
from torch._inductor import pattern_matcher as pm
from torch.fx.experimental.proxy_tensor import make_fx

from fusion_backend import guards, tracing

aten = torch.ops.aten


def padded_bmm(a, b, pm_=3, pk=0, pn=5, m=None, n=None):
    """pad_mm's rewrite of bmm(a, b): the operands zero-padded on the right, the product sliced back."""
    ap = aten.constant_pad_nd.default(a, [0, pk, 0, pm_])
    bp = aten.constant_pad_nd.default(b, [0, pn, 0, pk])
    out = aten.bmm.default(ap, bp)
    out = aten.slice.Tensor(out, 1, 0, a.shape[1] if m is None else m)
    return aten.slice.Tensor(out, 2, 0, b.shape[2] if n is None else n)


def _graph(fn, *shapes):
    return make_fx(fn, tracing_mode="fake")(*(torch.randn(s) for s in shapes))


def _site(gm):
    return types.SimpleNamespace(match=types.SimpleNamespace(nodes=list(gm.graph.nodes)))


def test_padding_exact_accepts_pad_mm_and_rejects_a_crop():
    ok = _graph(lambda a, b: padded_bmm(a, b), (2, 5, 8), (2, 8, 11))
    assert guards._padding_problem(_site(ok)) is None
    assert torch.equal(padded_bmm(torch.ones(2, 5, 8), torch.ones(2, 8, 11)), torch.ones(2, 5, 8) @ torch.ones(2, 8, 11))
    cropped = _graph(lambda a, b: padded_bmm(a, b, n=7), (2, 5, 8), (2, 8, 11))
    assert "sliced to" in guards._padding_problem(_site(cropped))
    nonzero = _graph(lambda a, b: aten.bmm.default(aten.constant_pad_nd.default(a, [0, 0, 0, 3], 1.0), b)[:, :5],
                     (2, 5, 8), (2, 8, 11))
    assert "zero padding" in guards._padding_problem(_site(nonzero))
    left = _graph(lambda a, b: aten.bmm.default(aten.constant_pad_nd.default(a, [0, 0, 3, 0]), b)[:, 3:],
                  (2, 5, 8), (2, 8, 11))
    assert guards._padding_problem(_site(left)) is not None


def test_padded_form_matches_other_pad_amounts():
    traced = _graph(lambda a, b: torch.softmax(padded_bmm(a, b), -1), (2, 5, 8), (2, 8, 11))
    expr = tracing._shape_wildcards(pm.fx_to_pattern(traced, argnames=["a", "b"]))
    other = _graph(lambda a, b: torch.softmax(padded_bmm(a, b, pm_=1, pn=2), -1), (2, 7, 8), (2, 8, 14))
    root = next(n for n in other.graph.nodes if n.op == "output").args[0]
    root = root[0] if isinstance(root, (list, tuple)) else root
    assert pm.is_match(expr.match(root)), "the padded form binds pad amounts and slice ends of any size"
    plain = _graph(lambda a, b: torch.softmax(aten.slice.Tensor(aten.bmm.default(a, b), 2, 0, 4), -1),
                   (2, 5, 8), (2, 8, 11))
    plain_expr = tracing._shape_wildcards(pm.fx_to_pattern(plain, argnames=["a", "b"]))
    crop = _graph(lambda a, b: torch.softmax(aten.slice.Tensor(aten.bmm.default(a, b), 2, 0, 6), -1),
                  (2, 5, 8), (2, 8, 11))
    root = next(n for n in crop.graph.nodes if n.op == "output").args[0]
    root = root[0] if isinstance(root, (list, tuple)) else root
    assert not pm.is_match(plain_expr.match(root)), "a slice of an unpadded product keeps its literal end"


def test_a_padded_trace_that_fails_leaves_the_rule_its_own_forms(monkeypatch):
    """On CUDA the padded chain is an extra form: if tracing it fails, the rule keeps the unpadded ones."""
    from fusion_backend import forms, table

    p = table.by_id("attention.sdpa_math_no_mask")
    real = forms.trace_search_pattern_and_forms
    calls = []

    def trace(p_, dtype, device, fn=None, pad=None):
        calls.append(pad)
        if pad:
            raise RuntimeError("no padded chain here")
        return real(p_, dtype, "cpu", fn)  # (no GPU here: the CPU chain stands in for CUDA's)

    monkeypatch.setattr(forms, "trace_search_pattern_and_forms", trace)
    got = forms._trace_forms(p, torch.float32, "cuda")
    assert calls[0] is False and True in calls
    want = forms._trace_forms(p, torch.float32, "cpu")
    assert [pm.PatternPrettyPrinter.run(f.expr) for f in got] == [pm.PatternPrettyPrinter.run(f.expr) for f in want]

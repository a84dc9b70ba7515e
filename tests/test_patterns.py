"""Generated from the pattern tables: every pattern fires, matches eager, and does not fire where it
must not (reused intermediate, unsupported dtype, failing guard, CPU without cpu_reference)."""
import inspect

import pytest
import torch
from torch._inductor import pattern_matcher as pm
from torch._inductor.pattern_matcher import fwd_only

from conftest import assert_same, explain, pattern_params
from fusion_backend import forms, registry, stats, table, tracing
from fusion_backend.patterns import batched_matmul as BM
from fusion_backend.report import _fresh_compile


def _no_unfused_ops(code: str, p=None) -> bool:
    """No ATen/prims op is left, but for the zeros a rule makes for its op (op_static: a zero point)."""
    made = "torch.ops.aten.full.default" if p is not None and p.op_static else None
    return not any(("torch.ops.aten" in line or "torch.ops.prims" in line) and not (made and made in line)
                   for line in code.splitlines())


def _fires(p, fn, args, sites=1):
    rep = explain(fn, *args)
    assert rep.sites[p.id] == sites, str(rep)
    assert not rep.errors, str(rep)
    code = "\n".join(g.graph_code for g in rep.graphs)
    assert f"fusekit.{p.op}.default" in code, code
    return rep, code


@pytest.mark.parametrize("p,dtype", pattern_params())
def test_fires_and_matches_eager(p, dtype):
    for case in p.fixtures.cases:
        args = p.make_args(case, dtype, "cpu")
        rep, code = _fires(p, p.search_fn(), args)
        assert _no_unfused_ops(code, p), code  # the whole chain became the one op
        assert_same(rep.output, p.eager(*args))


@pytest.mark.parametrize("p,dtype", pattern_params())
def test_other_spellings_fire(p, dtype):
    """Commuted operands, method vs function spellings, .char() vs .to(int8) ..."""
    if not p.variants:
        pytest.skip("no alternative spellings declared")
    args = p.make_args(p.fixtures.cases[0], dtype, "cpu")
    for v in p.variants:
        rep, _ = _fires(p, v, args)
        assert_same(rep.output, p.eager(*args))  # the op computes the reference ...
        atol, rtol = p.tol[dtype]                 # ... which equals this spelling within tolerance
        torch.testing.assert_close(rep.output, v(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_scalars_as_tensors_and_after_recompile(p, dtype):
    floats = p.tensor_scalars
    if not floats:
        pytest.skip("no float parameters")
    args = list(p.make_args(p.fixtures.cases[0], dtype, "cpu"))
    idx = [p.arg_names.index(n) for n in floats]
    # 0-dim tensors given by the user
    targs = [torch.tensor(a) if i in idx else a for i, a in enumerate(args)]
    rep, _ = _fires(p, p.search_fn(), targs)
    assert_same(rep.output, p.eager(*targs))
    # a second call with other floats recompiles, and Dynamo turns the floats into tensor inputs
    fn = p.search_fn()
    with _fresh_compile(), stats.collect() as records:
        c = torch.compile(fn, backend="fusekit", options={"cpu_reference": True})
        c(*args)
        args2 = [a * 1.5 if i in idx else a for i, a in enumerate(args)]
        out2 = c(*args2)
    assert [r.sites[p.id] for r in records] == [1, 1], [str(r.near_misses) for r in records]
    assert_same(out2, p.eager(*args2))


_VIEWS = {torch.ops.aten.expand.default, torch.ops.aten.view.default, torch.ops.aten.reshape.default,
          torch.ops.aten._unsafe_view.default, torch.ops.aten.permute.default, torch.ops.aten.t.default,
          torch.ops.aten.transpose.int}


def _with_reused_intermediate(fn, args):
    """make_fx the chain and also return its first intermediate, so that value has a second user."""
    gm = fwd_only(fn, args)  # decomposed as Inductor sees it, so single-op references have intermediates
    out = next(n for n in gm.graph.nodes if n.op == "output")
    # (not a view such as matmul's expand of an operand: a reused view costs nothing and the rule may fire)
    first = next((n for n in gm.graph.nodes if n.op == "call_function" and out not in n.users
                  and n.target not in _VIEWS), None)
    if first is None:
        pytest.skip("one op and its views: no intermediate to reuse")
    out.args = ((*out.args[0], first) if isinstance(out.args[0], (tuple, list)) else (out.args[0], first),)
    gm.recompile()
    return gm


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_no_fire_when_intermediate_reused(p, dtype):
    args = p.make_args(p.fixtures.cases[0], dtype, "cpu")
    gm = _with_reused_intermediate(p.search_fn(), args)
    rep = explain(gm, *args, patterns=[p.id])  # named: its near misses are reported even where it is opt-in
    assert rep.sites[p.id] == 0, str(rep)
    first = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target not in _VIEWS)
    pattern = pm.PatternPrettyPrinter.run(tracing.trace_search_pattern(p, dtype, "cpu"))
    if not (first.target is torch.ops.aten.mm.default and "aten.addmm" in pattern):
        # (a reused mm never becomes the addmm that Inductor makes of mm + bias, so nothing to explain)
        assert any(m.pattern == p.id and "reused" in m.reason for m in rep.near_misses), str(rep)
    # Inductor's result, not fusekit's: its own fp16 roundings may differ by an ulp
    _inductor_close(p, dtype, rep.output, gm(*args))


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_no_fire_on_unsupported_dtype(p, dtype):
    def other(a):  # float64 for the floating tensors; an int8 input becomes int16; fp8 weights stay
        if not isinstance(a, torch.Tensor) or a.dtype == torch.float8_e4m3fn:
            return a
        return a.double() if a.is_floating_point() else a.to(torch.int16) if a.dtype == torch.int8 else a
    args = [other(a) for a in p.make_args(p.fixtures.cases[0], dtype, "cpu")]
    try:
        p.eager(*args)
    except RuntimeError as e:  # aten._int_mm takes int8 only: no other dtype computes it
        pytest.skip(f"the reference is int8-only: {e}")
    rep = explain(p.search_fn(), *args)
    code = "\n".join(g.graph_code for g in rep.graphs)
    if rep.sites[p.id]:
        # only a rule whose reference upcasts first (x.float()) may fire, on Inductor's upcast of x
        assert "prims.convert_element_type" in code and "x.float()" in inspect.getsource(p.reference), code
        assert_same(rep.output, p.eager(*args))
    else:
        # another rule may take a float32 part (the fp8 rule's dequantized product is a float32 linear)
        assert rep.sites[p.id] == 0, str(rep)
        torch.testing.assert_close(rep.output, p.eager(*args), equal_nan=True)


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_no_fire_on_failing_guard(p, dtype):
    args = _fill(p, p.fixtures.bad_layout(dtype, "cpu"))
    rep = explain(p.search_fn(), *args, patterns=[p.id])  # named: reported even where it is opt-in
    assert rep.sites[p.id] == 0, str(rep)
    assert any(m.pattern == p.id and p.fixtures.bad_reason in m.reason for m in rep.near_misses), str(rep)
    # Inductor's result (its own fp16 roundings may differ by an ulp)
    _inductor_close(p, dtype, rep.output, p.eager(*args))


def _inductor_tol(p, dtype):
    """Tolerance for comparing Inductor's own code with eager: the rule's (or its fixtures' inductor_tol), for a 16-bit
    float rule."""
    tol = p.fixtures.inductor_tol or p.tol
    if dtype in (torch.float16, torch.bfloat16) and dtype in tol:
        atol, rtol = tol[dtype]
        return {"atol": atol, "rtol": rtol}
    return {}


def _inductor_close(p, dtype, out, ref):
    """Inductor's result against `ref` within _inductor_tol; float8 outputs compared by value (torch compares
    them bit for bit only)."""
    def wide(t):
        if isinstance(t, (tuple, list)):
            return type(t)(wide(x) for x in t)
        return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn else t
    tol = _inductor_tol(p, dtype)
    if tol:
        out, ref = wide(out), wide(ref)
    torch.testing.assert_close(out, ref, equal_nan=True, **tol)


def _fill(p, tensors):
    it, defaults = iter(tensors), p.scalar_defaults
    return [next(it) if k == "tensor" else defaults[n] for n, k in p.params if k != "static"]


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_cpu_needs_cpu_reference(p, dtype):
    import fusion_backend

    args = p.make_args(p.fixtures.cases[0], dtype, "cpu")
    rep = fusion_backend.explain(p.search_fn(), *args, options={"patterns": [p.id]})  # no cpu_reference
    assert rep.sites[p.id] == 0
    assert any(m.pattern == p.id and "cpu_reference" in m.reason for m in rep.near_misses), str(rep)


@pytest.mark.slow
def test_every_scalar_binds():
    """Each float/int parameter survives tracing as its own argument (a KeywordArg of the search pattern, not a
    literal baked in) in every dtype."""
    scalars = 0
    for p in table.all_patterns():
        names = [n for n, k in p.params if k in ("float", "int")]
        for dt in p.dtypes:
            text = pm.PatternPrettyPrinter.run(tracing.trace_search_pattern(p, dt, "cpu"))
            missing = [n for n in names if f"KeywordArg('{n}')" not in text]
            assert not missing, (p.id, dt, missing, text[-500:])
            scalars += len(names)
    assert scalars > 0


def test_matmul_heavy_epilogue_k_window():
    """GELU/SiLU matmul epilogues stay with Inductor where they measured slower (128 < K < 1024 or
    K >= 4096, N > 64) and fire outside that window."""
    p = table.by_id("batched_matmul.linear_bias_gelu_2d")
    for k, n, fires in ((768, 128, False), (64, 128, True), (768, 64, True), (1024, 128, True),
                        (4096, 128, False), (4096, 64, True)):
        args = p.inputs((80, k, n), torch.float16, "cpu")  # more rows than a decode step (decode_gemm's)
        rep = explain(p.search_fn(), *args)
        assert rep.sites[p.id] == int(fires), (k, n, str(rep))
        if not fires:
            assert any(m.pattern == p.id and "measured slower" in m.reason for m in rep.near_misses), str(rep)
        atol, rtol = p.tol[torch.float16]
        torch.testing.assert_close(rep.output, p.eager(*args), atol=atol, rtol=rtol)


def test_matmul_4d_fires_only_where_leading_dims_merge():
    """4-D matmul rules: a contiguous q fires; a head-transposed q ([B, S, H, D].transpose(1, 2)), whose
    B and H do not merge into one batch stride, stays with Inductor (which copies it) with a near miss."""
    p = table.by_id("batched_matmul.bmm_scale_bias_gelu_4d")
    q, k, bias = (registry.rand(s, torch.float16, "cpu") for s in ((2, 5, 3, 16), (2, 3, 24, 16), (24,)))
    fn = lambda q, k, bias: p.eager(q, k.transpose(-1, -2), bias, 0.25)  # noqa: E731
    for qq, fires in ((q.transpose(1, 2).contiguous(), 1), (q.transpose(1, 2), 0)):
        rep = explain(fn, qq, k, bias)
        assert rep.sites[p.id] == fires, str(rep)
        assert fires or any(m.pattern == p.id and "one batch dim" in m.reason for m in rep.near_misses), str(rep)
        torch.testing.assert_close(rep.output, fn(qq, k, bias), atol=2e-3, rtol=2e-3)


def _cuda_site(x, arch="9.0a"):
    """A stand-in for a site on a CUDA device (no GPU here) whose kernels were built for `arch`."""
    from types import SimpleNamespace as NS

    return NS(first_tensor=x, tensor=lambda name: x, kernel_arch=lambda: arch,
              run=NS(options=NS(forced=(), cpu_reference=False)))


def test_size_threshold_guard():
    """The selection guard's measured size threshold, on stand-ins for CUDA tensors: below it a default-on rule
    does not fire and says why; at the threshold, or with a symbolic size, it does. It is a policy guard (a
    named rule skips it) and does nothing on CPU."""
    from types import SimpleNamespace as NS

    from fusion_backend import guards

    p = table.by_id("quantize.dyn_quant_i8")
    sel = guards._selection_guard(p)
    assert sel.policy and "selection" in [g.name for g in guards.all_guards(p)] and not guards._device_guard(p).policy
    floor = p.min_numel(torch.float16)
    assert floor > p.min_numel(torch.float32) > 0
    for numel, ok in ((floor - 1, False), (floor, True), (NS(), True)):  # the last: a symbolic size
        x = NS(device=torch.device("cuda", 0), dtype=torch.float16, numel=lambda n=numel: n)
        reason = sel.check(_cuda_site(x))
        assert (reason is None) == ok, (numel, reason)
        assert ok or "size threshold" in reason
    x = NS(device=torch.device("cpu"), dtype=torch.float16, numel=lambda: 1)
    assert sel.check(_cuda_site(x)) is None


@pytest.mark.parametrize("arch", ["9.0a", "8.0", None])
def test_arch_aware_default(arch):
    """A rule whose CUDA default is a predicate of the kernels' arch (the plain decode linear: on where its sm_90a
    TMA kernel runs) is asked with the arch of the kernels that run its op; off there, the selection guard says
    so; the gated rule's plain default does not depend on it."""
    from types import SimpleNamespace as NS

    from fusion_backend import guards

    x = NS(device=torch.device("cuda", 1), dtype=torch.bfloat16, numel=lambda: 2048)
    for pid, on in (("decode_gemm.linear", arch == "9.0a"), ("decode_gemm.linear_2d", arch == "9.0a"),
                    ("decode_gemm.gate_up_silu", True)):
        p = table.by_id(pid)
        assert p.on_by_default(torch.bfloat16, arch) == on
        reason = guards._selection_guard(p).check(_cuda_site(x, arch))
        assert (reason is None) == on, (pid, reason)
        assert reason is None or "off by default" in reason
    assert table.by_id("decode_gemm.linear").on_by_default(torch.bfloat16)  # stated for an H100/H200 build


def test_guards_run_can_fire_first_then_policy():
    """Every rule's guards: the can-fire ones (scalars, dtype, device, shapes) before the policy ones (its CUDA
    selection, measured limits), so a site is explained by what it cannot do before what was chosen."""
    from fusion_backend import guards

    for p in table.all_patterns():
        kinds = [g.policy for g in guards.all_guards(p)]
        assert kinds == sorted(kinds), (p.id, [g.name for g in guards.all_guards(p)])
        assert [g.name for g in guards.all_guards(p)][:3] == ["arguments", "dtype", "device"]
        assert "selection" in [g.name for g in guards.all_guards(p) if g.policy]


def test_a_named_rule_skips_its_policy_guards():
    """decode_gemm.gate_up_silu stops at its measured row limit (a policy guard: the near miss says it chose not
    to fire and how to name it); named, it fires there and still matches eager."""
    p = table.by_id("decode_gemm.gate_up_silu_2d")
    args = p.make_args((100, 16, 24), torch.float32, "cpu")
    rep = explain(p.search_fn(), *args)
    assert rep.sites[p.id] == 0, str(rep)
    miss = [m for m in rep.near_misses if m.pattern == p.id]
    assert miss and all(m.policy for m in miss) and f"options={{'enable': ['{p.id}']}}" in miss[0].reason, str(rep)
    assert "chose not to fire" in str(rep)
    for named in ({"patterns": [p.id]}, {"enable": [p.id]}):  # alone, or on top of every other rule
        rep = explain(p.search_fn(), *args, **named)
        assert rep.sites[p.id] == 1, str(rep)
        assert_same(rep.output, p.eager(*args))


def test_wide_one_weight_linear_without_epilogue_stays_with_cublas():
    """decode_gemm's plain and bias linears stop above N = MAX_PLAIN_N (a policy: wider weights measured slower than
    cuBLAS, the near miss says so); with a bias and GELU to fuse the rule fires at any N."""
    from fusion_backend.patterns.decode_gemm import MAX_PLAIN_N

    for pid, n, fires in (("linear_2d", MAX_PLAIN_N, 1), ("linear_2d", MAX_PLAIN_N + 8, 0),
                          ("linear_bias_2d", MAX_PLAIN_N + 8, 0), ("linear_bias_2d", 24, 1),
                          ("linear_bias_gelu_2d", MAX_PLAIN_N + 8, 1)):
        p = table.by_id(f"decode_gemm.{pid}")
        args = p.make_args((2, 16, n), torch.float32, "cpu")
        rep = explain(p.search_fn(), *args)
        assert rep.sites[p.id] == fires, (pid, n, str(rep))
        assert fires or any(m.pattern == p.id and m.policy and "wide linear" in m.reason
                            for m in rep.near_misses), str(rep)
        assert_same(rep.output, p.eager(*args))


def test_int8_weight_only_linear_in_the_forms_inductor_leaves():
    """torchao's Int8WeightOnlyConfig linear (F.linear(x, w.to(x.dtype)) * scales, the scale a float32 [N, 1] cast to
    x's dtype) fires decode_gemm.linear_w8 in each form Inductor leaves it in: as written (fp16, fp32), as its
    woq_int8 lowering (bf16; lowered.py writes it back as aten._weight_int8pack_mm), and at one row as the mm
    decomposition of coordinate_descent_tuning, spelled as an H200's post-grad graph holds it (mul + sum in float32)."""
    def torchao_linear(x, w, s32):
        return torch.nn.functional.linear(x, w.to(x.dtype)) * s32.to(x.dtype).view(-1)

    def one_row_as_sum(x, w, s32):  # torch 2.11 on an H200, torchao 0.18, batch 1
        y = (x.view(-1, x.shape[-1]).float().unsqueeze(2) * w.permute(1, 0).float().unsqueeze(0)).sum([1])
        return (y.to(x.dtype) * s32.to(x.dtype).view(-1)).view(*x.shape[:-1], -1)

    w, s32 = torch.randint(-128, 128, (48, 64), dtype=torch.int8), torch.rand(48, 1) * 0.01 + 1e-3
    for fn, dt, rows in ((torchao_linear, torch.float16, 3), (torchao_linear, torch.bfloat16, 3),
                         (torchao_linear, torch.float32, 3), (one_row_as_sum, torch.bfloat16, 1)):
        x = torch.randn(rows, 1, 64, dtype=dt)
        rep = explain(fn, x, w, s32)
        fired = rep.sites["decode_gemm.linear_w8"] + rep.sites["decode_gemm.linear_w8_2d"]
        assert fired == 1, (fn.__name__, dt, str(rep))
        torch.testing.assert_close(rep.output, fn(x, w, s32), **_inductor_tol(table.by_id("decode_gemm.linear_w8"), dt))


def test_int8_weight_only_linear_fires_before_the_plain_linear_where_inductor_keeps_the_mm():
    """Where Inductor's woq_int8 lowering does not take the bf16 int8 weight-only linear (switched off here; an H200's
    torch 2.11 graph kept mm(x, permute(convert(w))) * scales), linear_w8 takes it with the plain decode_gemm.linear
    on too: the plain linear would take the mm of the widened weight and leave the scales (and 2 bytes a weight) to
    Inductor."""
    p = table.by_id("decode_gemm.linear_w8")
    args = p.make_args(p.fixtures.cases[-1], torch.bfloat16, "cpu")
    with tracing.woq_lowering_off():
        rep = explain(p.search_fn(), *args, patterns=["decode_gemm.linear", p.id])
    assert rep.sites[p.id] == 1 and rep.sites["decode_gemm.linear"] == 0, str(rep)
    torch.testing.assert_close(rep.output, p.eager(*args), **_inductor_tol(p, torch.bfloat16))


def test_torchao_float8_rowwise_linear_fires(monkeypatch):
    """torchao's own Float8DynamicActivationFloat8WeightConfig(PerRow) linear (bf16, 2-D and 3-D x) fires
    decode_gemm.linear_fp8 once, x's quantization included, with the output of torchao's eager linear (CPU
    aten._scaled_mm) within tolerance. torchao refuses fp8 without an sm_89 GPU: its hardware check is lifted here, as
    the CPU only traces and runs references. Skipped without torchao (fusekit[quant])."""
    pytest.importorskip("torchao")
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quant_api, quantize_

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda *a, **k: None)
    for shape in ((3, 64), (2, 1, 64)):
        m = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False)).to(torch.bfloat16)
        quantize_(m, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
        x = torch.randn(*shape, dtype=torch.bfloat16)
        rep = explain(m, x)
        assert rep.sites["decode_gemm.linear_fp8"] + rep.sites["decode_gemm.linear_fp8_2d"] == 1, str(rep)
        torch.testing.assert_close(rep.output, m(x), **_inductor_tol(table.by_id("decode_gemm.linear_fp8"),
                                                                      torch.bfloat16))
    # the bench's tiny Llama-style decoder, quantized whole, one decode step: every linear fires (per layer q/k/v in
    # one op, gate/up with SiLU * up in one, o and down; the LM head), the logits near eager's
    from fusion_backend.tools.decode_bench import Step

    for batch in (1, 4):  # the scales' reshape with and without its unsqueeze (one row folds it away)
        st = Step("llama", "cpu", batch, 64, dtype=torch.bfloat16, quant="fp8-rowwise")
        st.at(8)
        with torch.no_grad():
            rep = explain(lambda tok: st(st.model), st.token)
            st.restore()
            want = st(st.model).float()
            st.restore()
            torch._dynamo.reset()
            inductor = st(torch.compile(st.model, backend="inductor")).float()
        layers = st.model.config.num_hidden_layers
        assert rep.sites["decode_gemm.qkv_fp8"] == rep.sites["decode_gemm.gate_up_silu_fp8"] == layers, str(rep)
        assert rep.sites["decode_gemm.linear_fp8"] == 2 * layers + 1, str(rep)  # o, down; the LM head
        # fp8 steps amplify an ulp of difference upstream (x one e4m3 step apart): within 2x Inductor's error
        err, err_inductor = ((o - want).abs().max().item() for o in (rep.output.float(), inductor))
        assert err <= 2 * err_inductor + 1e-2 * want.abs().max().item(), (batch, err, err_inductor)


def test_torchao_float8_rowwise_llama_prefill_fuses_swiglu_into_the_down_quantization(monkeypatch):
    """The tiny Llama-style decoder under torchao's float8 per-row config at a prompt's rows (2 x 160): the decode
    GEMM rules stop at their rows (few_rows) and quantize.silu_mul_fp8_rows takes SwiGLU's product with the down
    projection's x quantization at every layer; the logits within 2x Inductor's error against eager."""
    pytest.importorskip("torchao")
    from torchao.quantization import quant_api

    from fusion_backend.tools import models

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda *a, **k: None)
    model, inputs, _ = models.make("llama", "cpu", torch.bfloat16, 2, 160)
    models.quantize(model, "fp8-rowwise")
    with torch.no_grad():
        want = model(**inputs).logits.float()
        rep = explain(lambda ids: model(input_ids=ids).logits, inputs["input_ids"])
        torch._dynamo.reset()
        inductor = torch.compile(model)(**inputs).logits.float()
    fired = {k: v for k, v in rep.sites.items() if v}
    assert fired == {"quantize.silu_mul_fp8_rows": model.config.num_hidden_layers}, str(rep)
    err, err_inductor = ((o - want).abs().max().item() for o in (rep.output.float(), inductor))
    assert err <= 2 * err_inductor + 1e-2 * want.abs().max().item(), (err, err_inductor)


def test_opt_in_rules_report_no_shape_misses():
    """A rule that is off by default (here elementwise.mul_add, q * k + v: at parity with Inductor) reports no
    can-fire near misses at the sites it does not fit (a LayerNorm's x * w + b with a broadcast weight): they are
    noise to a user; named, it does."""
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    fn = lambda x, w, b: x * w + b  # noqa: E731
    rep = explain(fn, x, w, b)
    assert not [m for m in rep.near_misses if m.pattern == "elementwise.mul_add"], str(rep)
    rep = explain(fn, x, w, b, patterns=["elementwise.mul_add"])
    assert any(m.pattern == "elementwise.mul_add" and "same_shape" in m.reason and not m.policy
               for m in rep.near_misses), str(rep)


def test_matmul_output_cast_stored_by_the_kernel():
    """gelu(bmm * s + b).float() returned from the graph: the cast becomes the op's out_dtype (one fp32
    store). A cast that feeds more work (Inductor fuses it into that kernel) and a no-op cast stay."""
    from patterns.batched_matmul import matmul_epilogue_ref

    p = table.by_id("batched_matmul.bmm_scale_bias_gelu")
    for dtype in (torch.float16, torch.bfloat16):
        args = p.make_args(p.fixtures.cases[-1], dtype, "cpu")
        rep = explain(lambda *t: p.eager(*t).float(), *args)
        # The kernel stores the fp32 result either way: the cast absorbed after the match (output_casts;
        # torch 2.13, 2.14), or, where Inductor's pointless_convert has already dropped the 16-bit round trip
        # (torch 2.11, as on CUDA), the rule's fp32 form matched the upcast GELU with out_dtype float32.
        assert rep.sites[p.id] == 1 and sum(rep.output_casts.values()) <= 1, str(rep)
        absorbed = rep.output_casts["matmul_epilogue"] == 1
        code = "\n".join(g.graph_code for g in rep.graphs)
        assert "torch.float32" in code and "prims" not in code, code
        assert rep.output.dtype == torch.float32
        # the op stores fp32 from the fp32 accumulator: no rounding to 16 bits on the way
        a, b, bias, s = args
        ref32 = matmul_epilogue_ref(a, b, bias, scale=s, act="gelu", out_dtype=torch.float32)
        assert_same(rep.output, ref32)
        atol, rtol = p.tol[dtype]
        torch.testing.assert_close(rep.output, p.eager(*args).float(), atol=atol, rtol=rtol)
        assert ("output cast" in str(rep)) == absorbed
        # the fp32 GELU of the upcast product, returned (what Inductor's pointless_convert pass leaves of
        # gelu(...).float() on CUDA): the rule's fp32 form, out_dtype float32; not when the result feeds more work
        up = lambda a, b, bias: torch.nn.functional.gelu((torch.matmul(a, b) * s + bias).float())  # noqa: E731
        rep = explain(up, a, b, bias, disable=["elementwise"])  # (on CUDA fp32 GELU is off by default)
        assert rep.sites[p.id] == 1 and rep.output.dtype == torch.float32, str(rep)
        assert_same(rep.output, ref32)
        rep = explain(lambda *t: up(*t) * 2, a, b, bias, disable=["elementwise"])
        assert rep.sites[p.id] == 0, str(rep)
        # a cast that feeds more work is never absorbed (on torch 2.11 the fp32 GELU then matches on its own)
        rep = explain(lambda *t: p.eager(*t).float().softmax(-1), *args)
        assert not rep.output_casts and (rep.sites[p.id] == 1 or not absorbed), str(rep)
        # (where the 16-bit round trip of the GELU is gone, that rounding differs: the dtype's tolerance)
        tol = {} if absorbed else {"atol": atol, "rtol": rtol}
        torch.testing.assert_close(rep.output, p.eager(*args).float().softmax(-1), **tol)
    args = p.make_args(p.fixtures.cases[-1], torch.float32, "cpu")
    with BM.fp32_matmul_precision("tf32"):  # (fp32 rules fire only where TF32 is allowed)
        rep = explain(lambda *t: p.eager(*t).float(), *args)
    assert rep.sites[p.id] == 1 and not rep.output_casts, str(rep)


def test_tf32_guard():
    """fp32 matmul rules fire only where TF32 is allowed, and on CUDA only with a K-major b; fp16 is not
    affected (stand-ins for CUDA tensors: no GPU here)."""
    from types import SimpleNamespace as NS

    kmajor, nmajor = torch.empty(4, 24, 16).transpose(1, 2), torch.empty(4, 16, 24)  # b [L, K=16, N=24]
    for prec, dtype, dev, b, ok in (("ieee", torch.float32, "cuda", kmajor, False),
                                    ("tf32", torch.float32, "cuda", kmajor, True),
                                    ("tf32", torch.float32, "cuda", nmajor, False),
                                    ("ieee", torch.float16, "cuda", nmajor, True),
                                    ("ieee", torch.float32, "cpu", nmajor, False),
                                    ("tf32", torch.float32, "cpu", nmajor, True)):
        x = NS(dtype=dtype, device=torch.device(dev))
        with BM.fp32_matmul_precision(prec):
            reason = BM.tf32_allowed("a", "b").check(NS(tensor=lambda name: x if name == "a" else b))
        assert (reason is None) == ok, (prec, dtype, dev, b.stride(), reason)
        assert ok or ("TF32" in reason and (prec == "ieee" or "K-major" in reason))
    w = torch.empty(24, 16)  # a linear weight [N, K] is K-major when contiguous
    site = NS(tensor=lambda name: NS(dtype=torch.float32, device=torch.device("cuda")) if name == "a" else w)
    with BM.fp32_matmul_precision("tf32"):
        assert BM.tf32_allowed("a", "b", linear=True).check(site) is None
        w = torch.empty(16, 24).t()
        assert "K-major" in BM.tf32_allowed("a", "b", linear=True).check(site)


@pytest.mark.parametrize("p", [p for p in table.all_patterns() if p.op == "matmul_epilogue"
                               and p.id.split(".")[1].startswith("bmm_") and not p.id.endswith("_4d")],
                         ids=lambda p: p.id)
def test_matmul_rules_take_torch_bmm(p):
    """The 3-D batched rules, traced from torch.matmul (whose decomposition expands the operands), also
    take a direct torch.bmm (no expand)."""
    from patterns.batched_matmul import ACTS

    def spelled_with_bmm(*t):
        kw = dict(zip(p.arg_names, t))
        y = torch.bmm(kw["a"], kw["b"])
        y = y * kw["scale"] if "scale" in kw else y
        return ACTS[p.static["act"]](y + kw["bias"] if "bias" in kw else y)

    args = p.make_args(p.fixtures.cases[-1], torch.float16, "cpu")
    rep = explain(spelled_with_bmm, *args)
    assert rep.sites[p.id] == 1, str(rep)
    assert_same(rep.output, p.eager(*args))


def _form_params():
    return [pytest.param(p, f, id=f"{p.id}-{f.__name__}") for p, _ in
            (x.values for x in pattern_params(dtypes=False)) for f in p.graph_forms]


@pytest.mark.parametrize("p,form", _form_params())
def test_graph_forms_match(p, form):
    """Spellings that only exist in another device's graphs (SDPA's fused CUDA ops): their traced post-grad
    graph is matched by one of the rule's search forms at its output."""
    args = p.make_args(p.trace_case, p.dtypes[0], "cpu")
    names = [n for n, k in p.params if k == "tensor"]  # scalars bound as the search function binds them
    bound = dict(zip(p.arg_names, args))
    gm = tracing.post_grad_graph(registry._with_signature(
        lambda *t: form(*[(bound | dict(zip(names, t)))[n] for n in p.arg_names]), names),
        [bound[n] for n in names])
    root = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    root = root[0] if isinstance(root, (tuple, list)) else root  # several outputs: matched from the first
    found = forms.search_forms(p, p.dtypes[0], "cpu")
    assert any(isinstance(f.expr.match(root), pm.Match) for f in found), gm.graph

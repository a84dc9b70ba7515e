"""Quantization as users write it by hand, inside small models: the spellings without an epsilon or a zero point fire
the quantize rules (a site per layer) with eager's output to the bit, those whose math differs do not fire, and
torchao's Int8DynamicActivationInt8WeightConfig activation quantization (another scale formula) is left to Inductor
while its int8 GEMMs fire decode_gemm.linear_w8a8."""
import pytest
import torch

from conftest import assert_same, explain


def _absmax_i8(x):  # per-token int8 without an epsilon, as a W8A8 model writes it
    s = x.abs().amax(-1, keepdim=True) / 127
    return torch.clamp(torch.round(x / s), -128, 127).to(torch.int8), s


def _absmax_i8_functions(x):
    s = torch.amax(torch.abs(x), dim=-1, keepdim=True) / 127.0
    return (x / s).round().clamp(-128, 127).to(torch.int8), s


def _absmax_i8_max_values(x):
    s = x.abs().max(dim=-1, keepdim=True).values / 127
    return torch.clamp(torch.round(x / s), -128, 127).char(), s


class W8A8(torch.nn.Module):
    """Linear layers over int8 weights (per-row scales, no zero point) and int8 activations quantized per token."""

    def __init__(self, quantize, dims=(64, 48, 32), upcast=True):
        super().__init__()
        self.quantize, self.upcast = quantize, upcast
        self.w = torch.nn.ParameterList()
        self.ws = torch.nn.ParameterList()
        for k, n in zip(dims, dims[1:]):
            self.w.append(torch.nn.Parameter(torch.randint(-128, 128, (n, k), dtype=torch.int8), requires_grad=False))
            self.ws.append(torch.nn.Parameter(torch.rand(n) * 0.01 + 1e-3, requires_grad=False))

    def forward(self, x):
        for w, ws in zip(self.w, self.ws):
            q, s = self.quantize(x.float() if self.upcast else x)
            x = ((q.float() @ w.float().t()) * s * ws).to(x.dtype)
        return x


@pytest.mark.parametrize("quantize", [_absmax_i8, _absmax_i8_functions, _absmax_i8_max_values])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_per_token_int8_fires_per_layer(quantize, dtype):
    """x.float() first (or x float32 as it is): the op with eps = 0, at every layer, eager's output to the bit."""
    m = W8A8(quantize, upcast=dtype != torch.float32)
    x = torch.randn(5, 64, dtype=dtype) * 3  # random rows: never all zero (an all-zero row's scale is 0)
    with torch.no_grad():
        rep = explain(m, x)
        want = m(x)
    assert rep.sites["quantize.dyn_quant_i8_no_eps"] == len(m.w), str(rep)
    assert rep.sites["quantize.dyn_quant_i8"] == 0, str(rep)
    # the fused op's q and s equal eager's, so the layers' int matmuls do too (Inductor computes those)
    q_op, s_op = torch.ops.fusekit.dyn_quant_i8(x.float(), 0.0)
    q, s = quantize(x.float())
    assert_same((q_op, s_op), (q, s))
    torch.testing.assert_close(rep.output, want, atol=0, rtol=0 if dtype == torch.float32 else 1.6e-2)


def test_sixteen_bit_scale_does_not_fire():
    """x kept in bfloat16: the absmax / 127 and the quotient are bfloat16 (another scale than the op's float32 one),
    so no rule may take it. (Inductor's own code keeps the quotient in float32: ~10% of its int8s differ from
    eager's by one; fusekit's output is Inductor's.)"""
    x = torch.randn(4, 64, dtype=torch.bfloat16) * 3
    rep = explain(_absmax_i8, x)
    assert sum(n for pid, n in rep.sites.items() if pid.startswith("quantize.")) == 0, str(rep)
    torch._dynamo.reset()
    assert_same(rep.output, torch.compile(_absmax_i8, backend="inductor")(x))


def test_hand_written_fp8_and_symmetric_weights_fire():
    """Per-row fp8 without an epsilon, and int8 per-channel / per-tensor quantization without a zero point."""
    fp8 = torch.float8_e4m3fn

    def fn(x, w, col_scale, row_scale):
        xf = x.float()
        s = xf.abs().amax(-1, keepdim=True) / 448.0
        x8 = (xf / s).clamp(-448.0, 448.0).to(fp8)
        wq_col = torch.clamp(torch.round(w / col_scale), -128, 127).to(torch.int8)
        wq_row = torch.clamp(torch.round(w / row_scale), -127, 127).to(torch.int8)
        xq = torch.clamp(torch.round(x / 0.05), -128, 127).to(torch.int8)
        return x8, s, wq_col, wq_row, xq

    x = torch.randn(6, 64, dtype=torch.float16) * 3
    w = torch.randn(32, 64, dtype=torch.float16) * 4
    col, row = torch.rand(64) * 0.2 + 0.01, torch.rand(32, 1) * 0.2 + 0.01
    rep = explain(fn, x, w, col, row, patterns=["quantize.quant_i8_no_zp", "quantize.quant_i8_per_col_no_zp",
                                                "quantize.quant_i8_per_row_no_zp", "quantize.dyn_quant_fp8_no_eps"])
    for pid in ("quantize.dyn_quant_fp8_no_eps", "quantize.quant_i8_per_col_no_zp",
                "quantize.quant_i8_per_row_no_zp", "quantize.quant_i8_no_zp"):
        assert rep.sites[pid] == 1, (pid, str(rep))
    want = fn(x, w, col, row)
    assert_same(rep.output[0].view(torch.uint8), want[0].view(torch.uint8))  # fp8: compared as bits
    assert_same(rep.output[1:], want[1:])


@pytest.fixture
def torchao_int_mm(monkeypatch):
    """torchao's int8 matmul as every CUDA graph and most CPUs spell it (`aten._int_mm` on int8 x). On a CPU with
    AVX512-VNNI and no AMX, torchao 0.18 writes x + 128 as uint8 and subtracts the weight's column sums times 128
    (`torchao.kernel.intmm._int_scaled_matmul_cpu`): a CPU-only form no rule takes, which made these tests depend on
    the machine's CPU."""
    pytest.importorskip("torchao")
    import torchao.kernel.intmm as intmm

    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: False)


def test_torchao_int8_dynamic_linears_fire_with_x_quantization(torchao_int_mm):
    """torchao 0.18's Int8DynamicActivationInt8WeightConfig quantizes activations per token with another formula
    (scale = max(-min(x), max(x)) / 127.5, clamped to float32's eps, x * (1 / scale)): no quantize rule takes it.
    Each 16-bit linear, that quantization included, fires decode_gemm.linear_int8dyn (float32: nothing fires, the
    graph is Inductor's to the bit); the op equals torchao's eager linear to the bit, and so does decode_linear_w8a8 on
    eager's own quantized x; the compiled model's error against eager within 2x of Inductor's. Skipped without
    torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    from torchao.quantization.quantize_.common import _choose_quant_func_and_quantize_tensor

    torch.manual_seed(0)
    for dt, shape in ((torch.float32, (3, 64)), (torch.bfloat16, (3, 64)), (torch.bfloat16, (2, 1, 64)),
                      (torch.float16, (3, 64))):
        m = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False), torch.nn.Linear(48, 32, bias=False)).to(dt)
        quantize_(m, Int8DynamicActivationInt8WeightConfig())
        x = torch.randn(*shape, dtype=dt)
        rep = explain(m, x)
        assert sum(n for pid, n in rep.sites.items() if pid.startswith("quantize.")) == 0, str(rep)
        fired = sum(n for pid, n in rep.sites.items() if pid.startswith("decode_gemm.linear_int8dyn"))
        torch._dynamo.reset()
        ind = torch.compile(m, backend="inductor")(x)
        if dt == torch.float32:
            assert fired == 0 and not any(rep.sites.values()), str(rep)
            torch.testing.assert_close(rep.output, ind, atol=0, rtol=0)
            continue
        assert fired == 2, str(rep)
        want = m(x)
        err, err_ind = ((o.float() - want.float()).abs().max().item() for o in (rep.output, ind))
        assert err <= 2 * err_ind + 2 ** -8 * want.float().abs().max().item(), (err, err_ind)
        w = m[0].weight
        assert torch.equal(torch.ops.fusekit.decode_linear_int8dyn(x, w.qdata, w.scale), m[0](x))
        xq = _choose_quant_func_and_quantize_tensor(x, w.act_quant_kwargs)
        got = torch.ops.fusekit.decode_linear_w8a8(xq.qdata, xq.scale.float(), w.qdata, w.scale, dt)
        assert torch.equal(got, m[0](x))


LAYERS = 2  # of the tiny torchao Llama


def _tiny_torchao_llama(config, ids_shape=(2, 3), **opts):
    """A tiny bf16 Llama quantized by torchao's `config`, explained (fusekit `opts`) and compiled by Inductor on token
    ids of `ids_shape`: (report, logits of fusekit, eager, Inductor)."""
    from torchao.quantization import quantize_
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    quantize_(m, config)
    ids = torch.randint(0, 256, ids_shape)

    def logits(i):
        return m(i, use_cache=False).logits

    with torch.no_grad():
        rep = explain(logits, ids, **opts)
        want = logits(ids)
        torch._dynamo.reset()
        ind = torch.compile(logits, backend="inductor")(ids)
    return rep, want, ind


def _within_twice_inductors_error(rep, want, ind):
    err, err_ind = ((o.float() - want.float()).abs().max().item() for o in (rep.output, ind))
    assert err <= 2 * err_ind + 1e-6, (err, err_ind)


def test_torchao_int8_dynamic_llama_fires_every_linear_per_layer(torchao_int_mm):
    """A tiny Llama under torchao's Int8DynamicActivationInt8WeightConfig: per layer q/k/v fire decode_qkv_int8dyn
    once and gate/up with SwiGLU decode_gate_up_int8dyn once, o and down (and the LM head) the one-weight rule; no
    int8 GEMM is left to Inductor; logits within 2x of Inductor's error against eager. Skipped without torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    rep, want, ind = _tiny_torchao_llama(Int8DynamicActivationInt8WeightConfig())
    fired = {k: v for k, v in rep.sites.items() if v and k.startswith("decode_gemm.")}
    assert fired == {"decode_gemm.qkv_int8dyn": LAYERS, "decode_gemm.gate_up_silu_int8dyn": LAYERS,
                     "decode_gemm.linear_int8dyn": 2 * LAYERS + 1}, str(rep)
    assert not any("aten._int_mm" in g.graph_code for g in rep.graphs), str(rep)  # every int8 GEMM fired
    _within_twice_inductors_error(rep, want, ind)


def test_torchao_int8_dynamic_llama_prefill_fires_the_tiled_gemm_per_linear(torchao_int_mm):
    """The same tiny Llama at prefill (2 x 48 tokens: 96 rows, past the decode rules' 32), the tiled rules named (its
    widths are under their policy's 256 rows and 1M outputs): x's quantization stays Inductor's (fused into what
    makes x) and every int8 GEMM, the LM head included, fires decode_gemm.linear_w8a8_tiled (the scales in the tiled
    GEMM's epilogue) and no other decode GEMM rule; no aten._int_mm is left; logits within 2x of Inductor's error
    against eager. Unnamed, none fires and each says why. Skipped without torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    tiled = [f"decode_gemm.linear_w8a8_tiled_{d}{r}" for d in ("bfloat16", "float16") for r in ("", "_2d")]
    rep, want, ind = _tiny_torchao_llama(Int8DynamicActivationInt8WeightConfig(), ids_shape=(2, 48), enable=tiled)
    fired = {k: v for k, v in rep.sites.items() if v and k.startswith("decode_gemm.")}
    assert sum(v for k, v in fired.items() if k.startswith("decode_gemm.linear_w8a8_tiled")) == 7 * LAYERS + 1, str(rep)
    assert all(k.startswith("decode_gemm.linear_w8a8_tiled") for k in fired), str(rep)
    assert not any("aten._int_mm" in g.graph_code for g in rep.graphs), str(rep)
    _within_twice_inductors_error(rep, want, ind)

    off, _, _ = _tiny_torchao_llama(Int8DynamicActivationInt8WeightConfig(), ids_shape=(2, 48))
    assert not any(v for k, v in off.sites.items() if k.startswith("decode_gemm.linear_w8a8_tiled")), str(off)
    assert any(m.pattern.startswith("decode_gemm.linear_w8a8_tiled") and m.policy and "96 rows" in m.reason
               for m in off.near_misses), str(off)


def test_int8_dynamic_gate_whose_downcast_was_folded_fires_the_fp32_form():
    """torch 2.11's pointless_convert (CUDA graphs of torchao int8 models) folds the gate linear's last downcast into
    SiLU's upcast: the gate's product times ws stays float32 into the SiLU. The rule's fp32 form takes it (out_dtype
    float32, eager's value to the bit) although it feeds more work; the up projection takes the 16-bit form."""
    from fusion_backend import table
    from fusion_backend.patterns.decode_gemm import decode_linear_w8a8_ref as ref

    bf16 = torch.bfloat16
    p = table.by_id("decode_gemm.linear_w8a8_bfloat16")
    xq, xs, w, ws = p.make_args((2, 1, 64, 96), torch.int8, "cpu")
    w2, ws2 = p.make_args((2, 1, 64, 96), torch.int8, "cpu")[2:]

    def swiglu(xq, xs, w, ws, w2, ws2):
        g = ref(xq, xs, w, ws, bf16, out_dtype=torch.float32)  # the downcast folded away
        return torch.nn.functional.silu(g).to(bf16) * ref(xq, xs, w2, ws2, bf16)

    args = (xq, xs, w, ws, w2, ws2)
    rep = explain(swiglu, *args, disable=["elementwise"])
    assert rep.sites["decode_gemm.linear_w8a8_bfloat16"] == 2, str(rep)
    # the op's fp32 values are eager's; Inductor's own SiLU kernel (and its skipped bf16 rounding) an ulp apart
    torch.testing.assert_close(rep.output, swiglu(*args), atol=0, rtol=2 ** -7)


def test_torchao_float8_weight_only_llama_fires_every_linear():
    """A tiny Llama under torchao's Float8WeightOnlyConfig (e4m3 weights, per-row float32 scales, dequantized to bf16
    before each matmul): every linear, the LM head included, fires decode_gemm.linear_fp8_weight, no 16-bit copy of a
    weight is left in the graph; logits within 2x of Inductor's error against eager. Skipped without torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig

    rep, want, ind = _tiny_torchao_llama(Float8WeightOnlyConfig())
    fired = {k: v for k, v in rep.sites.items() if v and k.startswith("decode_gemm.")}
    assert fired == {"decode_gemm.linear_fp8_weight": 7 * LAYERS + 1}, str(rep)
    assert not any("aten.mm" in g.graph_code for g in rep.graphs), str(rep)
    _within_twice_inductors_error(rep, want, ind)


def _mm_one_row_decomposed_on_cpu(monkeypatch):
    """Inductor's mm decomposition at one row under coordinate_descent_tuning, (x[:, :, None] * w[None]).sum(1) in
    float32 (torch/_inductor/decomposition.py `mm`), which torch applies to CUDA tensors only: here to CPU tensors too,
    so that a CPU compile sees the graph a CUDA batch-1 step has. fusekit's rules are still traced with torch's own
    decompositions: their forms are cached (in the process and on disk) for every later compile."""
    import torch._inductor.decomposition as dec
    from fusion_backend import forms

    @dec.pw_cast_for_opmath
    def mm(self, input2, out_dtype=None):
        if out_dtype is None and self.shape[0] == 1:
            return (self.unsqueeze(2) * input2.unsqueeze(0)).sum(dim=1)
        return NotImplemented

    op = torch.ops.aten.mm.default
    tables = (dec.decompositions, dec.fast_random_decomps())  # (the second: a cached copy of the first)
    torch_own = [t[op] for t in tables]
    for table in tables:
        monkeypatch.setitem(table, op, mm)
    trace = forms._trace_forms

    def trace_with_torch_own(*args, **kwargs):
        with pytest.MonkeyPatch.context() as m:
            for table, own in zip(tables, torch_own):
                m.setitem(table, op, own)
            return trace(*args, **kwargs)

    monkeypatch.setattr(forms, "_trace_forms", trace_with_torch_own)


def test_torchao_float8_weight_only_llama_one_row_fires_every_linear(monkeypatch):
    """At batch 1 on CUDA every linear of a Float8WeightOnlyConfig model reaches the post-grad graph as Inductor's
    one-row mm decomposition (mul + sum in float32; torchao's quantize_ turns coordinate_descent_tuning on), not an
    mm: an H200's batch-1 step had no linear_fp8_weight site before the rule's graph forms for it (2026-12-03,
    RESULTS.md). With that decomposition applied on the CPU, every linear of a tiny Llama at one row fires
    decode_gemm.linear_fp8_weight_2d and no weight's product is left to Inductor; logits within 2x of Inductor's error
    against eager (Inductor under the same decomposition). Skipped without torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig

    _mm_one_row_decomposed_on_cpu(monkeypatch)
    # config.patch, not monkeypatch: monkeypatch's undo left the config module without the option for later tests
    with torch._inductor.config.patch(coordinate_descent_tuning=True):
        rep, want, ind = _tiny_torchao_llama(Float8WeightOnlyConfig(), ids_shape=(1, 1))
    fired = {k: v for k, v in rep.sites.items() if v and k.startswith("decode_gemm.")}
    assert fired == {"decode_gemm.linear_fp8_weight_2d": 7 * LAYERS + 1}, str(rep)
    assert not any("aten.mm" in g.graph_code or "aten.sum" in g.graph_code for g in rep.graphs), str(rep)
    _within_twice_inductors_error(rep, want, ind)


def test_torchao_int8_weight_only_prefill_undoes_inductors_fallback_kernel():
    """Past the decode rules' rows (a 2 x 48-token prefill: 96 rows) torchao's Int8WeightOnlyConfig linears reach the
    post-grad graph as Inductor's woq_int8 lowering, aten._weight_int8pack_mm, whose CUDA kernel is untiled:
    lowered.woq_int8_mm writes every one (the LM head included) back as torchao's mm of the widened weight times its
    scales; none is left. Logits within 2x of Inductor's error against eager; disabled, every fallback stays.
    Skipped without torchao."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    from fusion_backend.lowered import WOQ_RULE

    rep, want, ind = _tiny_torchao_llama(Int8WeightOnlyConfig(), ids_shape=(2, 48))
    assert rep.sites[WOQ_RULE] == 7 * LAYERS + 1, str(rep)
    assert not any(k.startswith("decode_gemm.") and v for k, v in rep.sites.items()), str(rep)
    assert not any("_weight_int8pack_mm" in g.graph_code for g in rep.graphs), str(rep)
    _within_twice_inductors_error(rep, want, ind)

    off, _, _ = _tiny_torchao_llama(Int8WeightOnlyConfig(), ids_shape=(2, 48), disable=["lowered"])
    assert off.sites[WOQ_RULE] == 0, str(off)
    left = sum(g.graph_code.count("_weight_int8pack_mm.default]") for g in off.graphs)
    assert left == 7 * LAYERS + 1, (left, [g.graph_code for g in off.graphs])

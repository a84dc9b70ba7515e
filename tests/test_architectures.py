"""One decode step of a tiny random configuration of each decoder family transformers serves, on CPU with
cpu_reference: the rules expected of the family fire at every layer, and the logits match eager. Losing an
architecture's rules (a transformers change, a guard too strict) fails here. The layer widths are tiny; the head dims,
head groupings, MLP forms and projections are the families' own."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import fusion_backend  # noqa: E402
from torch.torch_version import TorchVersion  # noqa: E402
from fusion_backend.tools.decode_bench import cache_restorer  # noqa: E402

LAYERS = 2
_BASE = dict(num_hidden_layers=LAYERS, vocab_size=512, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
_LLAMA = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)

# family: (config class, model class, config kwargs, {rule: sites expected: one per layer})
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA,
              {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
               "decode_gemm.linear_residual": 2}),
    "llama_eager": ("LlamaConfig", "LlamaForCausalLM", dict(_LLAMA, attn_implementation="eager"),  # no SDPA
                    {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
                     "decode_gemm.linear_residual": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA,
              {"decode.gqa": 1, "decode_gemm.rms_qkv_bias": 1, "decode_gemm.rms_gate_up_silu": 1,
               "decode_gemm.linear_residual": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _LLAMA,  # QK-norm per head
              {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
               "decode_gemm.linear_residual": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_LLAMA, sliding_window=32),
                {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
                 "decode_gemm.linear_residual": 2}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(_LLAMA, head_dim=None),
                {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1}),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(_LLAMA, head_dim=None),  # parallel attention + MLP
               {"decode.gqa": 1, "decode_gemm.qkv": 1, "decode_gemm.gate_up_silu": 1,
                "decode_gemm.linear_residual": 2}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_LLAMA, num_local_experts=4, num_experts_per_tok=2),
                {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.linear_residual": 1}),
    # (Gemma's norm, x * (1 + w) in float32, is the RMSNorm rules' computation in float32 only: they fire here, not
    # in 16 bits)
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_LLAMA, num_key_value_heads=1),  # MQA, GeGLU
              {"decode.mqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.gate_up_gelu_tanh": 1,
               "decode_gemm.linear_residual": 2}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA, sliding_window=32, attn_implementation="eager"),
               # soft-capped scores: eager attention (transformers 5.17 builds Gemma-2 with SDPA, which does not cap)
               {"decode.gqa_softcap": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.gate_up_gelu_tanh": 1}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(_LLAMA, num_key_value_heads=1, sliding_window=32),
               {"decode.mqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.gate_up_gelu_tanh": 1}),
    # fused qkv_proj and gate_up_proj, head dim 96 (a padded tile of the decode kernel)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_LLAMA, hidden_size=384, num_key_value_heads=4, head_dim=None),
             {"decode.mha": 1, "decode_gemm.gate_up_silu_halves": 1, "decode_gemm.linear_residual": 2}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(_LLAMA, num_key_value_heads=4, head_dim=None),  # MHA
              {"decode.mha": 1, "decode_gemm.qkv": 1, "decode_gemm.gate_up_silu": 1}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(_LLAMA, num_key_value_heads=4, head_dim=None),
                 {"decode.mha": 1, "decode_gemm.qkv": 1, "decode_gemm.gate_up_silu": 1,
                  "decode_gemm.linear_residual": 2}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=256, intermediate_size=512,
                                                              num_attention_heads=4), {"decode.mha": 1}),
    # Falcon-7B style: one KV head that SDPA broadcasts to the query heads itself (its math decomposition copies it per
    # head), parallel attention and MLP, no biases. (ALiBi Falcon fails in transformers' own eager forward with a
    # StaticCache.)
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=256, num_attention_heads=4, multi_query=True,
                                                         new_decoder_architecture=False, parallel_attn=True,
                                                         alibi=False, bias=False), {"decode.mqa_sdpa_bool_mask": 1,
                                                                                    "decode_gemm.linear_residual": 1}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=256, n_head=4, n_layer=LAYERS, n_positions=256),
             {"decode.mha": 1, "elementwise.gelu_tanh": 1}),
    # StarCoder-1 / SantaCoder: one KV head in a fused c_attn, expanded by the model (so the MQA rule)
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(n_embd=256, n_head=4, n_layer=LAYERS,
                                                                      n_positions=256, multi_query=True),
                    {"decode.mqa": 1, "decode_gemm.linear_bias_gelu_tanh": 1}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(_LLAMA, head_dim=None),  # biases, GELU MLP
                   {"decode.gqa": 1, "decode_gemm.qkv_bias": 1, "decode_gemm.linear_bias_gelu_tanh": 1}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(_LLAMA, head_dim=None),  # some layers without rotary
                {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
                 "decode_gemm.linear_residual": 2}),
    "glm": ("GlmConfig", "GlmForCausalLM", _LLAMA,  # q/k/v bias, fused gate_up_proj
            {"decode.gqa": 1, "decode_gemm.rms_qkv_bias": 1, "decode_gemm.gate_up_silu_halves": 1,
             "decode_gemm.linear_residual": 2}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", _LLAMA,
                {"decode.gqa": 1, "decode_gemm.qkv": 1, "decode_gemm.gate_up_silu": 1}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", _LLAMA,
               {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.rms_gate_up_silu": 1,
                "decode_gemm.linear_residual": 2}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", _LLAMA,  # squared-ReLU MLP, LayerNorm1p
                 {"decode.gqa": 1, "decode_gemm.qkv": 1, "decode_gemm.linear_residual": 2}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(_LLAMA, head_dim=None, num_experts=4,
                                                                num_experts_per_tok=2, moe_intermediate_size=128,
                                                                shared_expert_intermediate_size=256),
                  {"decode.gqa": 1, "decode_gemm.rms_qkv_bias": 1, "decode_gemm.gate_up_silu_2d": 1,
                   "decode_gemm.linear_residual": 1}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(_LLAMA, head_dim=None, num_experts=4, num_experts_per_tok=2),
              {"decode.gqa": 1, "decode_gemm.rms_qkv": 1, "decode_gemm.linear_residual": 1}),
    # MHA families (their decode rules are opt-in on CUDA)
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(_LLAMA, num_key_value_heads=4, head_dim=None),
             {"decode.mha": 1, "decode_gemm.qkv": 1, "decode_gemm.gate_up_silu": 1, "decode_gemm.linear_residual": 2}),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4),
            {"decode.mha": 1, "decode_gemm.qkv_bias": 1, "decode_gemm.linear_bias_gelu_tanh": 1}),  # Phi-2: parallel
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=256, n_head=4, n_layer=LAYERS, n_positions=256,
                                                   rotary_dim=32), {"decode.mha": 1, "decode_gemm.qkv": 1,
                                                                    "decode_gemm.linear_residual": 1}),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=256, ffn_dim=512, num_attention_heads=4,
                                                word_embed_proj_dim=256), {"decode.mha": 1, "decode_gemm.qkv_bias": 1}),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", dict(hidden_size=256, intermediate_size=512,
                                                                  num_attention_heads=4), {"decode.mha": 1}),
    # DeepSeek-V3's multi-head latent attention, decompressed per head in transformers' forward
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                         q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64,
                         first_k_dense_replace=1), {"decode.mha": 1}),
}


def _model(name):
    import transformers

    cfg_cls, model_cls, kw, _ = ARCHS[name]
    kw = {k: v for k, v in {**(_BASE if name != "gpt2" else dict(vocab_size=512)), **kw}.items() if v is not None}
    cfg = getattr(transformers, cfg_cls)(**kw)
    torch.manual_seed(0)
    return cfg, getattr(transformers, model_cls)(cfg).eval()


def _step(name, device, dtype=torch.float32, batch=2, options=None, inductor=True):
    """(fusekit's report, eager's logits, Inductor's logits or None) of one decode step at position 40 of a 64-slot
    cache of random rows."""
    from transformers import StaticCache

    cfg, model = _model(name)
    model = model.to(device, dtype)
    cache = StaticCache(config=cfg, max_cache_len=64)
    tok = torch.randint(3, 512, (batch, 1), device=device)
    pos = torch.tensor([40], device=device)
    with torch.no_grad():
        model(tok, past_key_values=cache, cache_position=torch.tensor([0], device=device), use_cache=True)  # allocates it
        for layer in getattr(cache, "layers", ()):  # every slot a plausible row; the mask decides what is read
            for t in (layer.keys, layer.values):
                t.normal_(0, 0.5)
        restore = cache_restorer(cache)  # each step writes the cache (a full sliding window rolls) and advances counters
        want = model(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        restore()
        rep = fusion_backend.explain(model, tok, past_key_values=cache, cache_position=pos, use_cache=True,
                                     options=options)
        if not inductor:
            return rep, want, None
        restore()
        torch._dynamo.reset()
        return rep, want, torch.compile(model)(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(ARCHS))
def test_decode_step_attention_rule_fires_on_cuda(name):
    """The same step in bf16 on the GPU: the family's decode attention rule fires at every layer where it is on by
    default on CUDA (MHA rules only when named), and the logits are within 2x Inductor's distance from eager."""
    from fusion_backend import table

    rep, want, inductor = _step(name, "cuda", torch.bfloat16, batch=4)
    assert not rep.errors, str(rep)
    rules = {p.id: p for p in table.all_patterns()}
    for rule, per_layer in ARCHS[name][3].items():
        if rule.startswith("decode."):
            on = rules[rule].on_by_default(torch.bfloat16)
            assert rep.sites[rule] == (per_layer * LAYERS if on else 0), f"{name}: {rule}\n{rep}"
    err = (rep.output.logits.float() - want.float()).abs().max().item()
    err_inductor = (inductor.float() - want.float()).abs().max().item()
    assert err <= 2 * err_inductor + 2e-2, (err, err_inductor)


# From torch 2.14 the CPU flash SDPA op takes one KV head for many query heads as it is (Falcon passes it so, without
# a scale argument: sdpa_scale.py writes the default in), where torch 2.11-2.13 run SDPA's math decomposition with the
# bool mask: there the float-mask rule's fused form (its mask of either dtype) takes Falcon's attention.
CPU_SDPA_TAKES_ONE_KV_HEAD = torch.__version__ >= (2, 14)  # (a TorchVersion: compared as a version)
# From transformers 5.25 Falcon's attention goes through the shared sdpa_attention_forward, which repeats the one KV
# head for the query heads itself (repeat_kv): the MQA rule takes it, on every torch.
FALCON_REPEATS_KV = TorchVersion(transformers.__version__) >= (5, 25)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHS))
def test_decode_step_rules_fire_at_every_layer(name):
    rep, want, _ = _step(name, "cpu", options={"cpu_reference": True}, inductor=False)
    assert not rep.errors, str(rep)
    for rule, per_layer in ARCHS[name][3].items():
        if rule == "decode.mqa_sdpa_bool_mask" and FALCON_REPEATS_KV:
            rule = "decode.mqa"
        elif rule == "decode.mqa_sdpa_bool_mask" and CPU_SDPA_TAKES_ONE_KV_HEAD:
            rule = "decode.mqa_sdpa"
        assert rep.sites[rule] == per_layer * LAYERS, f"{name}: {rule}\n{rep}"
    torch.testing.assert_close(rep.output.logits, want, atol=1e-4, rtol=1e-4)

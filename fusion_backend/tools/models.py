"""The end-to-end benchmark's models: Hugging Face transformers built from configs with random weights (no
hub download), at their real sizes for the GPU and as tiny configurations for a CPU-only machine."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    what: str
    config: str                       # transformers config class
    model: str                        # transformers model class
    full: dict[str, Any]              # config kwargs of the real model (GPU)
    tiny: dict[str, Any]              # config kwargs of the CPU configuration
    dtype: torch.dtype                # GPU dtype
    batch: int                        # GPU defaults (the reference points)
    seq: int
    encoder: bool                     # no decode step (takes a padding attention_mask unless vision)
    vision: bool = False              # takes pixel_values [B, 3, H, W]; seq = patches + 1
    default: bool = True              # run when `fusekit bench` is given no --models

    def build(self, tiny: bool) -> Any:
        import transformers

        cfg = getattr(transformers, self.config)(**(self.tiny if tiny else self.full))
        return getattr(transformers, self.model)(cfg)


# head dim 64: the smallest the decode kernel takes, so the tiny decoders exercise the decode rules on CPU
_TINY_DECODER = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, vocab_size=256, max_position_embeddings=128)
_TINY_ENCODER = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
                     vocab_size=256)

def _named_decoder(name: str, what: str, config: str, model: str, full: dict[str, Any], tiny: dict[str, Any],
                   dtype: torch.dtype = torch.bfloat16) -> ModelSpec:
    """A decoder LM beyond the Llama shape, at its real layer widths: the other decoders' GPU defaults (batch 4 x
    512 tokens), run only when named in --models."""
    return ModelSpec(name, what, config, model, full, tiny, dtype, 4, 512, False, default=False)


MODELS = {m.name: m for m in [
    ModelSpec("gpt2", "GPT-2 124M", "GPT2Config", "GPT2LMHeadModel", {},
              dict(n_layer=2, n_head=2, n_embd=128, vocab_size=256, n_positions=128, bos_token_id=0,
                   eos_token_id=0), torch.float16, 8, 512, False),
    ModelSpec("llama", "Llama-style, hidden 2048, 8 layers, GQA 16/4", "LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
              _TINY_DECODER, torch.bfloat16, 4, 512, False),
    ModelSpec("bert", "BERT-base", "BertConfig", "BertModel", {},
              dict(_TINY_ENCODER, max_position_embeddings=128), torch.float16, 16, 256, True),
    ModelSpec("roberta", "RoBERTa-base", "RobertaConfig", "RobertaModel", {},
              dict(_TINY_ENCODER, max_position_embeddings=130), torch.float16, 16, 256, True),
    ModelSpec("qwen2", "Qwen2-style, hidden 1536, 8 layers, GQA 12/2, bias on q/k/v", "Qwen2Config",
              "Qwen2ForCausalLM",
              dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=8, num_attention_heads=12,
                   num_key_value_heads=2, vocab_size=32000, max_position_embeddings=4096),
              _TINY_DECODER, torch.bfloat16, 4, 512, False),
    ModelSpec("vit", "ViT-base/16, 224x224 images", "ViTConfig", "ViTModel", {},
              dict(_TINY_ENCODER, image_size=32, patch_size=8), torch.float16, 32, 197, True, vision=True),
    ModelSpec("mistral", "Mistral-style, hidden 2048, 8 layers, GQA 16/4, sliding window 1024", "MistralConfig",
              "MistralForCausalLM",
              dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                   sliding_window=1024),
              dict(_TINY_DECODER, sliding_window=16), torch.bfloat16, 4, 512, False),
    # Architectures beyond the Llama shape, at their real layer widths (layers cut to 8); run when named in --models
    _named_decoder("gemma", "Gemma-style (2B widths), 8 layers, MQA 8/1, head dim 256, GeGLU", "GemmaConfig",
                   "GemmaForCausalLM",
                   dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=8, num_attention_heads=8,
                        num_key_value_heads=1, head_dim=256, vocab_size=256000, max_position_embeddings=8192),
                   dict(_TINY_DECODER, num_key_value_heads=1)),
    _named_decoder("phi3", "Phi-3-mini-style, 8 layers, MHA 32/32, head dim 96, fused qkv and gate_up", "Phi3Config",
                   "Phi3ForCausalLM",
                   dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, pad_token_id=0),
                   dict(_TINY_DECODER, num_key_value_heads=4, head_dim=16, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)),
    _named_decoder("qwen3", "Qwen3-1.7B widths, 8 layers, GQA 16/8, head dim 128, QK-norm per head", "Qwen3Config",
                   "Qwen3ForCausalLM",
                   dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=4096),
                   _TINY_DECODER),
    _named_decoder("gemma2", "Gemma-2-2B widths, 8 layers, GQA 8/4, head dim 256, soft-capped scores (eager attention)",
                   "Gemma2Config", "Gemma2ForCausalLM",
                   dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=8, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
                        sliding_window=4096, query_pre_attn_scalar=256, attn_implementation="eager"),
                   # eager named: transformers 5.17 ran it through SDPA by default, without the cap (decode.gqa fired)
                   dict(_TINY_DECODER, sliding_window=16, attn_implementation="eager")),
    _named_decoder("gemma3", "Gemma-3-1B widths, 8 layers, MQA 4/1, head dim 256, sliding window 512 on 5 of 6 layers",
                   "Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=8192,
                        sliding_window=512, query_pre_attn_scalar=256),
                   dict(_TINY_DECODER, num_key_value_heads=1, sliding_window=16)),
    _named_decoder("olmo2", "OLMo-2-1B widths, 8 layers, MHA 16/16, head dim 128, QK-norm over the projection",
                   "Olmo2Config", "Olmo2ForCausalLM",
                   dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=16, vocab_size=100352, max_position_embeddings=4096, pad_token_id=1),
                   dict(_TINY_DECODER, hidden_size=256, num_key_value_heads=4, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)),
    _named_decoder("granite", "Granite-3.1-2B widths, 8 layers, GQA 32/8, head dim 64", "GraniteConfig",
                   "GraniteForCausalLM",
                   dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=49155, max_position_embeddings=4096),
                   dict(_TINY_DECODER, hidden_size=256)),
    _named_decoder("stablelm", "StableLM-2-1.6B widths, 8 layers, MHA 32/32, head dim 64, LayerNorm, bias on q/k/v",
                   "StableLmConfig", "StableLmForCausalLM",
                   dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096, use_qkv_bias=True,
                        partial_rotary_factor=0.25),
                   dict(_TINY_DECODER, hidden_size=256, num_key_value_heads=4, use_qkv_bias=True)),
    _named_decoder("gpt_neox", "Pythia-1.4B widths, 8 layers, MHA 16/16, head dim 128, parallel attention and MLP",
                   "GPTNeoXConfig", "GPTNeoXForCausalLM",
                   dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=16,
                        vocab_size=50304, max_position_embeddings=4096, rotary_pct=0.25),
                   dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=256, max_position_embeddings=128), dtype=torch.float16),
    _named_decoder("falcon", "Falcon-7B widths, 8 layers, MQA 71/1 broadcast by SDPA, head dim 64, parallel attention "
                   "and MLP, LayerNorm, 2048 positions", "FalconConfig", "FalconForCausalLM",
                   dict(hidden_size=4544, num_hidden_layers=8, num_attention_heads=71, multi_query=True,
                        new_decoder_architecture=False, parallel_attn=True, alibi=False, bias=False,
                        vocab_size=65024, max_position_embeddings=2048),
                   dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                        new_decoder_architecture=False, parallel_attn=True, alibi=False, bias=False,
                        vocab_size=256, max_position_embeddings=128)),
    _named_decoder("mixtral", "Mixtral-style MoE at Llama-style widths, 8 layers, 8 experts (top 2), GQA 16/4",
                   "MixtralConfig", "MixtralForCausalLM",
                   dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=4, head_dim=128, num_local_experts=8, num_experts_per_tok=2,
                        vocab_size=32000, max_position_embeddings=4096),
                   dict(_TINY_DECODER, num_local_experts=4, num_experts_per_tok=2)),
]}
DEFAULT = [n for n, m in MODELS.items() if m.default]
TINY = dict(batch=2, seq=32)

# torchao configurations `fusekit bench --quant` names (torchao is optional: fusekit[quant])
QUANT = {"int8-weight-only": "Int8WeightOnlyConfig", "int8-dynamic": "Int8DynamicActivationInt8WeightConfig",
         "fp8-rowwise": "Float8DynamicActivationFloat8WeightConfig", "fp8-weight-only": "Float8WeightOnlyConfig"}


def quantize(model: Any, quant: str) -> None:
    """torchao's quantize_ with the configuration `quant` names, in place (fp8-rowwise: per-row scales, PerRow)."""
    import torchao.quantization as tq

    config = getattr(tq, QUANT[quant])
    tq.quantize_(model, config(granularity=tq.PerRow()) if quant == "fp8-rowwise" else config())


def make(name: str, device: str, dtype: torch.dtype | None = None, batch: int | None = None,
         seq: int | None = None, seed: int = 0) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
    """(model in eval mode, inputs, description). On CPU: the tiny configuration in float32."""
    spec = MODELS[name]
    tiny = device == "cpu"
    torch.manual_seed(seed)
    dtype = dtype or (torch.float32 if tiny else spec.dtype)
    batch = batch or (TINY["batch"] if tiny else spec.batch)
    seq = seq or (TINY["seq"] if tiny else spec.seq)
    model = spec.build(tiny).to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed)
    if spec.vision:  # the sequence is the patches plus the class token
        cfg = model.config
        seq = (cfg.image_size // cfg.patch_size) ** 2 + 1
        pixels = torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
        inputs = {"pixel_values": pixels.to(device=device, dtype=dtype)}
    else:
        inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)}
    if spec.encoder and not spec.vision:  # a padded batch: the last sequence is 3/4 long, so the mask is a real one
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[-1, seq * 3 // 4:] = 0
        inputs["attention_mask"] = mask.to(device)
    desc = {"model": name, "what": spec.what + (" (tiny config)" if tiny else ""), "dtype": str(dtype)[6:],
            "batch": batch, "seq": seq, "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    return model, inputs, desc


def first_output(out: Any) -> torch.Tensor:
    """Logits or last hidden state."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits") and out.logits is not None:
        return out.logits
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def decode_step(name: str, device: str, dtype: torch.dtype | None = None, batch: int | None = None,
                cache_len: int = 4096, position: int | None = None, seed: int = 0):
    """(step, description): one decode step of a decoder model against a ``transformers.StaticCache`` of
    `cache_len` slots (at most the model's positions) whose first `position` slots hold a prompt (filled by
    an eager prefill). ``step()`` feeds one new token per sequence at `position` and returns the logits; the
    cache stays at the prompt (each call rewrites slot `position`). On CPU: the tiny configuration in float32, a 64-slot cache."""
    from transformers import StaticCache

    spec = MODELS[name]
    if spec.encoder:
        raise ValueError(f"{name} is an encoder: it has no decode step")
    tiny = device == "cpu"
    model, _, desc = make(name, device, dtype, batch or (TINY["batch"] if tiny else 1), 1, seed)
    cfg = model.config  # a cache longer than the position table would index past it (GPT-2: 1024)
    cache_len = min(64 if tiny else cache_len, getattr(cfg, "max_position_embeddings", None) or cfg.n_positions)
    position = cache_len // 4 if position is None else position
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (desc["batch"], position + 1), generator=g).to(device)
    with torch.no_grad():
        if position:
            model(prompt[:, :position], past_key_values=cache, cache_position=torch.arange(position, device=device),
                  use_cache=True)
    token, pos = prompt[:, position:], torch.tensor([position], device=device)

    def step() -> torch.Tensor:
        return model(token, past_key_values=cache, cache_position=pos, use_cache=True).logits

    return step, {**desc, "seq": 1, "cache_len": cache_len, "position": position}

"""A torchao-quantized model compiled by fusekit: quantize_, torch.compile, see which rules fired where.

Needs torchao (`pip install -e ".[quant]"`: torchao 0.18.0). On a CUDA GPU the kernels run; on CPU each op's reference
implementation does (options={"cpu_reference": True}), so the same rules fire and the logits are checked there too.

Int8WeightOnlyConfig: at decode rows (one token a sequence) `decode_gemm.linear_w8*` reads each int8 weight once; past
them `lowered.woq_int8_mm` writes back the untiled `aten._weight_int8pack_mm` Inductor would run. Int8Dynamic-
ActivationInt8WeightConfig: at decode rows each linear and x's quantization are one launch (`*_int8dyn`); at prefill
sizes (256 rows and 1M outputs by default, sm_90a) `linear_w8a8_tiled` takes the int8 GEMM with both scales.
"""
# %% setup
import sys

import torch
import transformers

import fusion_backend

try:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
except ImportError:
    sys.exit('this example needs torchao: pip install -e ".[quant]"')

cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
options = {} if cuda else {"cpu_reference": True}
if not cuda:
    # torchao on a CPU with AVX512-VNNI and no AMX spells its int8 matmul as a uint8 one no rule takes; the spelling
    # every CUDA graph and other CPUs use is the one shown here
    import torchao.kernel.intmm as intmm

    intmm._cpu_is_vnni_supported = lambda: False


def tiny_llama(config) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).to(device, torch.bfloat16).eval()
    quantize_(model, config)
    return model


# %% decode-sized (2 sequences x 1 token) and prefill-sized (2 x 64) forwards of each config
for config in (Int8WeightOnlyConfig(), Int8DynamicActivationInt8WeightConfig()):
    model = tiny_llama(config)
    for phase, shape in (("decode", (2, 1)), ("prefill", (2, 64))):
        ids = torch.randint(0, 512, shape, device=device)
        with torch.no_grad():
            want = model(ids, use_cache=False).logits
            report = fusion_backend.explain(lambda i: model(i, use_cache=False).logits, ids, options=options)
        err = ((report.output.float() - want.float()).abs().max() / want.float().abs().max()).item()
        fired = ", ".join(f"{k} x{v}" for k, v in report.sites.items() if v) or "none"
        print(f"{type(config).__name__:40s} {phase:8s} rel err vs eager {err:.1e}  fired: {fired}")
        # a rule that matched but whose measured policy kept it off says why (here: the tiny model's sizes) and how
        # to fire it anyway (options={"enable": [rule id]}); the prefill GEMM's rule here
        kept = {m.pattern: m.reason.split("; name it")[0]
                for m in report.near_misses if m.policy and "tiled" in m.pattern}
        for pattern, why in kept.items():
            print(f"{'':49s} kept off: {pattern} (first site: {why})")
        torch._dynamo.reset()

# On a GPU, `fusekit bench --quant int8-dynamic` (or int8-weight-only, fp8-rowwise, fp8-weight-only) times the same
# model against eager and Inductor, prefill and decode, with CUDA graphs: benchmarks/RESULTS.md has the H100/H200 runs.

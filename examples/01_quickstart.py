"""fusekit in one file: compile with backend="fusekit", check it against eager, see what fused.

Runs anywhere: on a CUDA GPU the prebuilt kernels fire; on CPU it runs each op's reference
implementation (options={"cpu_reference": True}), which is how the whole flow is tested without a GPU.
"""
# %% setup
import torch
import transformers

import fusion_backend

cuda = torch.cuda.is_available()
device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
options = {} if cuda else {"cpu_reference": True}
torch.manual_seed(0)

# %% the reference projects' chains: exp((x + y) * 2), q * k + v, static INT8 quantize
def chains(x, y, q, k, v):
    e = torch.exp((x + y) * 2)
    f = q * k + v
    i8 = torch.clamp(torch.round(e / 0.05 + 3.0), -128, 127).to(torch.int8)
    return e, f, i8

args = [torch.randn(4096, 1024, device=device, dtype=dtype) * 0.5 for _ in range(5)]
compiled = torch.compile(chains, backend="fusekit", options=options)
for got, want in zip(compiled(*args), chains(*args)):
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
print("chains match eager\n")
print(fusion_backend.explain(chains, *args, options=options), "\n")

# %% an unmodified Hugging Face model (tiny GPT-2, random weights from a config: no download)
cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=128,
                              bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg).to(device, dtype).eval()
ids = torch.randint(0, cfg.vocab_size, (2, 64), device=device)
with torch.no_grad():
    ref = model(ids).logits
    report = fusion_backend.explain(model, ids, options=options)
err = ((report.output.logits - ref).abs().max() / ref.abs().max()).item()
print(report)
print(f"\ntiny GPT-2 on {device}: max relative error vs eager {err:.2e}")

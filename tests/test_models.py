"""End to end: tiny random-init Hugging Face models (built from configs, no hub download) compiled with
backend="fusekit" on CPU with cpu_reference: each matches eager and fuses at least one site."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import CPU  # noqa: E402
import fusion_backend  # noqa: E402


def tiny(name):
    T = transformers
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128,
                                              n_positions=64, bos_token_id=0, eos_token_id=0))
    if name == "bert":
        return T.BertModel(T.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                                        intermediate_size=128, vocab_size=128, max_position_embeddings=64))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, hidden_size=64, intermediate_size=128,
                                                vocab_size=128, max_position_embeddings=64))
    raise KeyError(name)


EXPECT = {"gpt2": "elementwise.gelu_tanh", "bert": "elementwise.gelu_erf", "llama": "elementwise.silu_mul"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_tiny_model_matches_eager_and_fuses(name):
    torch.manual_seed(0)
    model = tiny(name).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        ref = model(ids)[0]
        rep = fusion_backend.explain(model, ids, options=CPU)
    out = rep.output[0]
    print(rep)
    assert rep.sites[EXPECT[name]] >= 2, str(rep)  # one per layer
    assert not rep.errors, str(rep)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)

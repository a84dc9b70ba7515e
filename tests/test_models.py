"""End to end: tiny random-init Hugging Face models (built from configs, no hub download) compiled with
backend="fusekit" on CPU with cpu_reference: each matches eager and fuses at least one site."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import CPU  # noqa: E402
import fusion_backend  # noqa: E402
from fusion_backend.tools import flow, models  # noqa: E402 - the tiny configurations `fusekit bench` runs on CPU


EXPECT = {"gpt2": "elementwise.gelu_tanh", "bert": "elementwise.gelu_erf", "llama": "elementwise.silu_mul"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_tiny_model_matches_eager_and_fuses(name):
    model, inputs, _ = models.make(name, "cpu")
    with torch.no_grad():
        ref = models.first_output(model(**inputs))
        rep = fusion_backend.explain(model, **inputs, options=CPU)
    out = models.first_output(rep.output)
    print(rep)
    assert rep.sites[EXPECT[name]] >= 2, str(rep)  # one per layer
    assert not rep.errors, str(rep)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # `fusekit bench` on CPU (flow.py: the rest of the graph as ATen calls, no C++ kernels) fires the same sites as
    # this compile with Inductor's own code generation, and matches eager
    check = flow.prefill_check(name, grad_mode="no_grad")["modes"]["fusekit"]
    assert check["sites"] == {k: v for k, v in rep.sites.items() if v}, (check["sites"], str(rep))
    assert check["errors"] == 0 and check["check"] == "ok" and check["max_rel_err_vs_eager"] < 1e-5, check


@pytest.mark.slow
def test_tiny_gpt2_half_fuses_conv1d_gelu_new_into_the_gemm():
    """GPT-2's MLP: Conv1D (addmm on the flattened rows, viewed back) + gelu_new, spelled out as HF does,
    becomes one matmul_epilogue per layer in fp16."""
    model, inputs, _ = models.make("gpt2", "cpu", dtype=torch.float16)
    with torch.no_grad():
        ref = models.first_output(model(**inputs))
        rep = fusion_backend.explain(model, **inputs, options=CPU)
    assert rep.sites["batched_matmul.mm_bias_gelu_tanh"] == 2, str(rep)  # one per layer
    assert not rep.errors, str(rep)
    torch.testing.assert_close(models.first_output(rep.output).float(), ref.float(), rtol=2e-3, atol=2e-3)

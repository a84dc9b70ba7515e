"""Decode steps of the tiny decoder models on CPU (fp32, cpu_reference): the decode rules fire at every
layer, the logits match Inductor's, the static caches are written exactly as eager writes them over 20
steps, and greedy decoding gives Inductor's tokens."""
import pytest
import torch

from fusion_backend import stats
from fusion_backend.tools import decode_bench
from fusion_backend.backend import backend
from fusion_backend.report import Report, no_compile_caches

DECODERS = ["llama", "qwen2", "gpt2", "mistral"]
RULE = {"gpt2": "decode.mha"}  # MHA: no repeat_kv; the others have grouped KV heads
# q, k and v as three linears of one input (Qwen2's with biases; GPT-2 has one c_attn: none)
# (on a CPU every rule fires: the opt-in RMSNorm forms take q/k/v with the norm before them)
QKV = {"llama": "decode_gemm.rms_qkv", "mistral": "decode_gemm.rms_qkv", "qwen2": "decode_gemm.rms_qkv_bias"}
QKV_RULES = ("decode_gemm.qkv", "decode_gemm.qkv_bias", "decode_gemm.rms_qkv", "decode_gemm.rms_qkv_bias")


def _fusekit(model):
    torch._dynamo.reset()
    return torch.compile(model, backend=backend(options={"cpu_reference": True}))


@pytest.mark.parametrize("name", [n if n == "llama" else pytest.param(n, marks=pytest.mark.slow) for n in DECODERS])
def test_decode_step_fires_and_matches_inductor(name):
    st = decode_bench.Step(name, "cpu", 2, 64)
    layers = st.model.config.num_hidden_layers
    saved = [(layer.keys.clone(), layer.values.clone()) for layer in st.cache.layers]

    def restore():  # a full sliding-window cache rolls in every step
        for layer, (k, v) in zip(st.cache.layers, saved):
            layer.keys.copy_(k)
            layer.values.copy_(v)
        st.at(40)

    with torch.no_grad():
        restore()
        torch._dynamo.reset()
        ref = st(torch.compile(st.model))
        with stats.collect() as records, no_compile_caches():
            restore()
            out = st(_fusekit(st.model))
    rep = Report(list(records))
    assert rep.sites[RULE.get(name, "decode.gqa")] == layers, str(rep)
    assert {r: rep.sites[r] for r in QKV_RULES} == {r: layers if QKV.get(name) == r else 0 for r in QKV_RULES}, str(rep)
    assert not rep.errors, str(rep)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_caches_over_20_steps_as_eager(name):
    """20 steps from position 10: fusekit's compiled step and eager write the same cache rows (the
    index_copy_ into the cache buffer stays Inductor's), every other slot untouched."""
    runs = {}
    for be in ("eager", "fusekit"):
        st = decode_bench.Step(name, "cpu", 2, 64)
        fn = st.model if be == "eager" else _fusekit(st.model)
        st.at(10)
        toks = []
        with torch.no_grad():
            for _ in range(20):
                logits = st(fn)
                st.token = logits[:, -1:].argmax(-1)
                toks.append(st.token)
                st.pos.add_(1)
        runs[be] = (st, torch.cat(toks, 1))
    (se, te), (sf, tf) = runs["eager"], runs["fusekit"]
    assert torch.equal(te, tf)
    for le, lf in zip(se.cache.layers, sf.cache.layers):
        torch.testing.assert_close(lf.keys, le.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lf.values, le.values, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_64_tokens_as_inductor(name):
    """A 64-token greedy loop (one compiled step per token) gives Inductor's tokens."""
    toks = {}
    for be in ("inductor", "fusekit"):
        st = decode_bench.Step(name, "cpu", 2, 128)
        torch._dynamo.reset()
        fn = torch.compile(st.model) if be == "inductor" else _fusekit(st.model)
        st.at(0)
        out = []
        with torch.no_grad():
            for _ in range(64):
                st.token = st(fn)[:, -1:].argmax(-1)
                out.append(st.token)
                st.pos.add_(1)
        toks[be] = torch.cat(out, 1)
    assert torch.equal(toks["fusekit"], toks["inductor"])


@pytest.mark.slow
def test_decode_reads_the_cache_buffers_in_place():
    """In the code Inductor generates, each decode_attention call reads the cache inputs themselves (the new
    row written into them in place): no repeat_kv copy and no copy of the cache is left."""
    import re

    from torch._inductor.utils import run_and_get_code

    st = decode_bench.Step("llama", "cpu", 2, 64)
    with torch.no_grad(), no_compile_caches():
        st.at(10)
        _, code = run_and_get_code(lambda: st(_fusekit(st.model)))
    src = "\n".join(code)
    calls = re.findall(r"fusekit\.decode_attention\.default\((\w+), (\w+), (\w+),", src)
    assert len(calls) == st.model.config.num_hidden_layers, src
    # the k/v cache inputs, as the generated module's benchmark harness makes them (the size asserts' form differs
    # between torch versions: 2.14 groups them)
    inputs = set(re.findall(r"(arg\w+) = rand_strided\(\(2, 2, 64, 64\)", src))
    assert all(k in inputs and v in inputs for _, k, v in calls), (calls, inputs)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_timed_steps_write_one_slot(name):
    """The bench times hundreds of steps at one position: each rewinds the write position (a tensor the step
    advances in place, or the sliding layer's int), so the steps near the cache's end stay inside it."""
    st = decode_bench.Step(name, "cpu", 2, 64)
    step = st.repeated(st.model)
    st.at(60)
    with torch.no_grad():
        first = step().clone()
        for _ in range(10):
            last = step()
    if name == "llama":  # (a full sliding window rolls at every step: its logits move on)
        torch.testing.assert_close(first, last)
    for layer in st.cache.layers:
        n = getattr(layer, "cumulative_length_int", getattr(layer, "cumulative_length", None))
        assert n is None or int(n) == 61


def test_mha_should_fire_policy():
    """Without grouped heads the op fires on CUDA from MHA_MIN_ROWS query rows (GPT-2 lost at batch 1 on an
    H100); GQA rules and the CPU reference have no such floor."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion_backend.patterns import decode

    class Site:
        def __init__(self, t):
            self.t = t

        def tensor(self, name):
            return self.t

    guard = decode.enough_rows("q")
    with FakeTensorMode(allow_non_fake_inputs=True):
        few, many = torch.empty(1, 12, 1, 64, device="cuda"), torch.empty(32, 12, 1, 64, device="cuda")
    assert "12 query rows" in guard.check(Site(few))
    assert guard.check(Site(many)) is None and guard.check(Site(torch.empty(1, 12, 1, 64))) is None
    rules = {p.id: {g.name for g in p.guards} for p in decode.PATTERNS}
    assert "enough_rows(q)" in rules["decode.mha"] and "enough_rows(q)" not in rules["decode.gqa"]
    # and on CUDA only when named (slower than Inductor near a full cache); the GQA rules by default
    for p in decode.PATTERNS:
        assert p.on_by_default(torch.bfloat16) == (not p.id.startswith("decode.mha")), p.id


@pytest.mark.slow
def test_generate_with_a_cache_of_its_own_size():
    """generate against a StaticCache the bench makes (a server's cache sized to the context): the cache is
    reset between the compiling run and the timed one, so both give eager's tokens, and the size is reported."""
    out = decode_bench.generate_bench("llama", "cpu", 2, 8, 6, cache_len=32, log=lambda s: None)
    assert out["cache_len"] == 32
    for be in ("eager", "inductor", "fusekit"):
        assert "error" not in out["backends"][be], out["backends"][be]
        assert out["backends"][be]["tokens_equal_eager"], out["backends"][be]
    md = decode_bench.markdown([], [out], {"device": "cpu", "torch": "x", "transformers": "y"})
    assert "| llama | 2 | 8+6 | 32 | fusekit |" in md


def test_decode_table_lists_the_step_rules_near_misses():
    """decode.md explains what kept an attention or GEMM site from firing, one line per rule and guard."""
    res = {"model": "phi3", "batch": 1, "cache_len": 4096, "fusekit_vs_inductor_max_abs": 0.1,
           "eager_vs_inductor_max_abs": 0.1, "positions": {"1024": {"inductor+graph": 1.1, "fusekit+graph": 1.0}},
           "backends": {"inductor": {"compile_s": 9.0},
                        "fusekit": {"compile_s": 9.0, "sites": {"decode_gemm.linear": 25},
                                    "near_misses": [{"pattern": "decode.mha", "guard": "policy", "count": 8,
                                                     "example": "sdpa (modeling_phi3.py:1): policy: off by default"}]}}}
    md = decode_bench.markdown([res], [], {"device": "cpu", "torch": torch.__version__, "transformers": "-"})
    assert "| phi3 | 1 | 1024/4096 |" in md and "linearx25" in md
    assert "- phi3 b1: decode.mha x8 (sdpa (modeling_phi3.py:1): policy: off by default)" in md, md


@pytest.mark.slow
def test_decode_bench_run_records_the_step_rules_near_misses():
    """A real run (CPU references, tiny GPT-NeoX): the fusekit entry has the sites and the near misses of the decode
    families only (a list, possibly empty), and the timing row."""
    res = decode_bench.run_model("gpt_neox", 2, (40,), "cpu", 64, None, log=lambda s: None)
    fk = res["backends"]["fusekit"]
    assert fk["sites"].get("decode.mha") == 2, fk
    assert isinstance(fk["near_misses"], list)
    assert all(g["pattern"].split(".")[0] in decode_bench.STEP_FAMILIES for g in fk["near_misses"]), fk["near_misses"]
    assert res["positions"]["40"]["fusekit"] > 0


@pytest.mark.slow
def test_decode_bench_ablation_turns_one_rule_off(tmp_path):
    """--ablate on one device: "fusekit without <rule>" is compiled with that rule disabled (its sites lack it, the
    others stay), timed in the same rounds, and its gain over fusekit is a row of decode.md."""
    results = decode_bench.bench(["llama"], tmp_path, None, (2,), (8,), generate=False, ablate=("decode.gqa",))
    be = results[0]["backends"]
    assert be["fusekit"]["sites"].get("decode.gqa") == 2, be["fusekit"]
    without = be[decode_bench.WITHOUT + "decode.gqa"]
    assert "decode.gqa" not in without["sites"] and without["sites"], without
    row = results[0]["positions"]["8"]
    assert row["gain decode.gqa"] == row[decode_bench.WITHOUT + "decode.gqa"] / row["fusekit"]
    md = (tmp_path / "decode.md").read_text()
    assert "| llama | 2 | 8 | " in md and "| decode.gqa | " in md, md


def test_decode_bench_goes_on_past_a_step_the_model_cannot_run(tmp_path, monkeypatch):
    """A step that fails in the model itself (torchao's int8 eager path at fewer than 17 rows on CUDA) is reported and
    skipped; the other batches are still timed and written."""
    real = decode_bench.Step.__call__

    def call(self, fn):
        if self.token.shape[0] == 1:
            raise RuntimeError("self.size(0) needs to be greater than 16, but got 1")
        return real(self, fn)

    monkeypatch.setattr(decode_bench.Step, "__call__", call)
    results = decode_bench.bench(["llama"], tmp_path, None, (1, 2), (8,), generate=False)
    assert [r["batch"] for r in results] == [2]
    md = (tmp_path / "decode.md").read_text()
    assert "Not run (the model itself failed the step): llama batch 1: RuntimeError: self.size(0)" in md, md
    assert "| llama | 2 | 8/64 |" in md


@pytest.mark.parametrize("spelled", [True, False])
def test_sdpa_without_scale_fires_with_its_default(spelled, monkeypatch):
    """An attention that leaves SDPA's scale out (as Falcon does) reaches the graph as a fused op with no scale:
    sdpa_scale.py writes its default, 1/sqrt(D), into the call, and the rule's fused form takes it (without that
    step, no site); the result is eager's."""
    import fusion_backend
    from fusion_backend import sdpa_scale
    from fusion_backend.patterns.decode import repeat_kv

    def attend(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in ((2, 8, 1, 64), (2, 4, 40, 64), (2, 4, 40, 64)))
    mask = torch.zeros(2, 1, 1, 40).masked_fill(torch.rand(2, 1, 1, 40, generator=g) > 0.7, float("-inf"))
    if not spelled:
        monkeypatch.setattr(sdpa_scale, "spell_out", lambda graph: 0)
    rep = fusion_backend.explain(attend, q, k, v, mask, options={"cpu_reference": True})
    assert rep.sites["decode.gqa"] == int(spelled) and not rep.errors, str(rep)
    torch.testing.assert_close(rep.output, attend(q, k, v, mask), atol=1e-5, rtol=1e-5)

"""Tensor parallelism as users run it: a decoder loaded with transformers' `tp_plan="auto"` over 2 processes (gloo,
CPU: DTensor weights, functional all-reduces in the graph), one StaticCache decode step compiled by fusekit with
cpu_reference. On every rank the decode rules fire on that rank's shard at every layer (fewer heads: Llama's 8/4
heads are 4/2 per rank, grouped; narrower q/k/v and gate/up), and the logits equal the unsharded model's."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' tp_plan needs it

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from fusion_backend.tools.decode_bench import cache_restorer  # noqa: E402
from fusion_backend.tools.tp_bench import free_port, init_rank  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

WORLD = 2
LAYERS = 2
PROMPT = 8
_BASE = dict(num_hidden_layers=LAYERS, vocab_size=512, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4,
             head_dim=64)
# family: (config class, {rule: sites expected per rank: one per layer, the LM head one in all})
MODELS = {
    "llama": ("LlamaConfig", {"decode.gqa": LAYERS, "decode_gemm.qkv": LAYERS, "decode_gemm.gate_up_silu": LAYERS,
                              "decode_gemm.linear": 2 * LAYERS + 1,  # o and down (row shards), the LM head
                              # the all-reduces after o and down (then the residual add and the next RMSNorm) and
                              # the embedding's (then the first RMSNorm)
                              "collective.all_reduce_add_rms_norm": 2 * LAYERS + 1}),
    "qwen2": ("Qwen2Config", {"decode.gqa": LAYERS, "decode_gemm.qkv_bias": LAYERS,
                              "decode_gemm.gate_up_silu": LAYERS, "decode_gemm.linear": 2 * LAYERS + 1,
                              "collective.all_reduce_add_rms_norm": 2 * LAYERS + 1}),
    # per-head q/k norms between the column and row shards (transformers 5.17 hooks them for training: dropped below)
    "qwen3": ("Qwen3Config", {"decode.gqa": LAYERS, "decode_gemm.qkv": LAYERS, "decode_gemm.gate_up_silu": LAYERS,
                              "decode_gemm.linear": 2 * LAYERS + 1,
                              # transformers 5.17's plan keeps the embedding whole (no all-reduce after it)
                              "collective.all_reduce_add_rms_norm": (2 * LAYERS, 2 * LAYERS + 1)}),
}


def _step(model, cache, tokens):
    """The prompt into the cache (eager), then the inputs of the decode step after it."""
    with torch.no_grad():
        model(tokens[:, :PROMPT], past_key_values=cache, cache_position=torch.arange(PROMPT), use_cache=True)
    return dict(past_key_values=cache, cache_position=torch.tensor([PROMPT]), use_cache=True)


def _rank(rank, path, port, tokens, expected, want):
    init_rank(rank, WORLD, port, "gloo")
    try:
        import transformers
        import fusion_backend
        from torch.distributed.tensor import DTensor

        model = transformers.AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.float32).eval()
        fusion_backend.collectives.drop_backward_hooks(model)  # as a user serving it would (a graph break otherwise)
        assert isinstance(model.model.layers[0].self_attn.q_proj.weight, DTensor)
        cache = transformers.StaticCache(config=model.config, max_cache_len=64)
        step = _step(model, cache, tokens)
        restore = cache_restorer(cache)  # the step writes the cache and advances its counters
        with torch.no_grad():
            eager = model(tokens[:, PROMPT:], **step).logits
            restore()
            rep = fusion_backend.explain(model, tokens[:, PROMPT:], **step, options={"cpu_reference": True})
        assert not rep.errors, str(rep)
        for rule, sites in expected.items():
            assert rep.sites[rule] in (sites if isinstance(sites, tuple) else (sites,)), f"rank {rank}: {rule}\n{rep}"
        all_reduces = rep.sites["collective.all_reduce_add_rms_norm"]
        assert rep.sites["collective.all_reduce_one_shot"] == 0, str(rep)
        got = rep.output.logits
        assert not isinstance(got, DTensor) and not isinstance(eager, DTensor)  # the LM head gathers its shards
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # the unsharded model's
        # without the norm fusion every all-reduce is a plain one-shot one, and the logits the same
        restore()
        torch._dynamo.reset()
        with torch.no_grad():
            rep = fusion_backend.explain(model, tokens[:, PROMPT:], **step, options={
                "cpu_reference": True, "disable": ["collective.all_reduce_add_rms_norm"]})
        assert (rep.sites["collective.all_reduce_one_shot"], rep.sites["collective.all_reduce_add_rms_norm"]) == (
            all_reduces, 0), str(rep)
        torch.testing.assert_close(rep.output.logits, want, rtol=1e-4, atol=1e-4)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_decode_rules_fire_on_each_rank_and_match_unsharded(name, tmp_path):
    import transformers

    cfg_name, expected = MODELS[name]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cfg_name)(**_BASE)).eval()
    model.save_pretrained(tmp_path)
    tokens = torch.randint(3, 512, (2, PROMPT + 1), generator=torch.Generator().manual_seed(1))
    cache = transformers.StaticCache(config=model.config, max_cache_len=64)
    step = _step(model, cache, tokens)
    with torch.no_grad():
        want = model(tokens[:, PROMPT:], **step).logits
    mp.spawn(_rank, args=(str(tmp_path), free_port(), tokens, expected, want), nprocs=WORLD)


@pytest.mark.slow
def test_tp_bench_cpu_checks_rules_and_logits(tmp_path):
    """`fusekit bench --phase both --tp 2` without a GPU: the tiny Llama-style model over 2 gloo ranks, the rules
    fired on rank 0's shard (1 KV head per rank: the MQA rule) and both backends' logits against the sharded eager
    step's, a decode step and a prefill (2 x 16 tokens), in tp.md and tp.json; nothing timed."""
    import json

    from fusion_backend.tools import tp_bench

    r, pre = tp_bench.bench(["llama"], tmp_path, (2,), phases=("decode", "prefill"))
    assert (pre["phase"], pre["batch"], pre["seq"], pre["backends"]["fusekit"]["errors"]) == ("prefill", 2, 16, 0)
    # the prompt's 32 rows are a small all-reduce: fused with the add and RMSNorm after it as in a decode step
    assert pre["backends"]["fusekit"]["sites"]["collective.all_reduce_add_rms_norm"] == 5, pre["backends"]
    assert all(pre["backends"][be]["max_abs_vs_eager"] < 1e-4 for be in ("fusekit", "inductor"))
    fk, ind = r["backends"]["fusekit"], r["backends"]["inductor"]
    assert (r["tp"], r["process_group"], fk["errors"]) == (2, "gloo", 0)
    assert fk["sites"] == {"decode.mqa": 2, "decode_gemm.qkv": 2, "decode_gemm.gate_up_silu": 2,
                           "decode_gemm.linear": 5, "collective.all_reduce_add_rms_norm": 5,
                           "cache.length_counters": 1}, fk["sites"]
    assert fk["max_abs_vs_eager"] < 1e-4 and ind["max_abs_vs_eager"] < 1e-4
    assert "ms" not in fk and "speedup" not in r  # untimed on CPU
    assert json.loads((tmp_path / "tp.json").read_text())["steps"][0]["tp"] == 2
    md = (tmp_path / "tp.md").read_text()
    assert "| llama | 2 | gloo | 2 | decode at 40 |" in md and "| llama | 2 | gloo | 2 | prefill 16 |" in md


def test_collective_rewrite_options():
    """The all-reduce rewrites are on by default, off when disabled by id or family, and off where the user names the
    rules that fire without them; the fused add + RMSNorm needs the one-shot rewrite."""
    from fusion_backend.options import parse

    assert parse(None, None)[0].collectives
    assert not parse(None, {"disable": ["collective"]})[0].collectives
    assert not parse(None, {"disable": "collective.all_reduce_one_shot"})[0].collectives
    assert not parse(None, {"patterns": ["decode"]})[0].collectives
    on = parse(None, {"patterns": ["decode", "collective"]})[0]
    assert on.collectives and on.patterns and all(p.startswith("decode.") for p in on.patterns)
    shot, norm = "collective.all_reduce_one_shot", "collective.all_reduce_add_rms_norm"
    assert parse(None, None)[0].collectives == (shot, norm)
    assert parse(None, {"disable": norm})[0].collectives == (shot,)
    assert parse(None, {"patterns": [shot]})[0].collectives == (shot,)
    assert parse(None, {"patterns": [norm]})[0].collectives == (shot, norm)  # the fused rule takes one-shot sites


def test_drop_backward_hooks_removes_the_graph_breaks():
    """A module-level backward hook (transformers 5.17 puts one on Qwen3's per-head norms under tp_plan) breaks the graph
    at that module for any backend, even under no_grad; dropped, the model is one graph again."""
    from torch._dynamo.testing import CompileCounter

    from fusion_backend.collectives import drop_backward_hooks

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)).eval()
    model[1].register_full_backward_hook(lambda m, gi, go: None)
    x = torch.randn(2, 8)

    def graphs():
        torch._dynamo.reset()
        counter = CompileCounter()
        with torch.no_grad():
            out = torch.compile(lambda t: model(t), backend=counter)(x)
        return (counter.frame_count, counter.op_count), out

    with torch.no_grad():
        want = model(x)
    (_, ops_broken), _ = graphs()  # the hooked module's call runs eagerly, whatever the split around it
    assert drop_backward_hooks(model) == 1 and drop_backward_hooks(model) == 0
    (frames, ops), got = graphs()
    assert frames == 1 and ops > ops_broken, (frames, ops, ops_broken)
    torch.testing.assert_close(got, want)

"""What fusekit's pass costs a compile: match attempts per graph node (a count: times are noisy), no tracing
when the traced patterns are on disk, and the near-miss explanation only for a report."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import CPU  # noqa: E402
import fusion_backend  # noqa: E402
from fusion_backend.tools import models  # noqa: E402

# Measured on the tiny bench models (CPU, torch 2.13, fp32/fp16): at most 4.5 match attempts per graph node
# (GPT-NeoX prefill in fp16: 788 over 177 nodes; 7.2 before a family's forms were offered only where their whole
# chain of calls occurs, GPT-2 fp16's 886 over 123), where one PatternMatcherPass per rule, every entry offered at
# every node of its anchor op, made about 220. The bound leaves room for new rules, not for that again.
MAX_ATTEMPTS_PER_NODE = 6.0
# Eager attention (transformers' attn_implementation="eager": Gemma-2's soft-capped scores): the attention and
# batched-matmul rules anchor at reshape and mul, which such a graph has about three times as many of; measured 3.0 per
# node (Gemma-2 fp16: 1,058 over 356 nodes; 22.4 with every form whose ops and edges occur offered: 7,967).
# Falcon-7B's multi-query attention is SDPA's math decomposition too (no fused SDPA takes one KV head for many query
# heads): measured 2.4 (fp32: 531 over 220 nodes) and 4.4 per node (fp16: 1,050 over 241 nodes; 52.5 before, 12,647).
MAX_ATTEMPTS_PER_NODE_EAGER_ATTENTION = {"gemma2": 4.0, "falcon": 5.5}

# Prefill graphs where no default rule fires on CPU, so the count is checked without the "still fuses" half:
# Phi-3's fused gate_up_proj is a decode-step rule (64 rows here) and its MHA head dim 96 has no kernel.
NOTHING_FIRES_IN_PREFILL = {"phi3"}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(models.MODELS))
def test_match_attempts_per_node_are_bounded(name, dtype):
    model, inputs, _ = models.make(name, "cpu", dtype=dtype)
    with torch.no_grad():
        rep = fusion_backend.explain(model, **inputs, options=CPU)
    nodes = sum(g.nodes_before for g in rep.graphs)
    print(name, dtype, rep.match_attempts, "attempts over", nodes, "nodes")
    if name in NOTHING_FIRES_IN_PREFILL:
        assert rep.total_sites == 0, str(rep)  # a rule that starts firing here moves the model out of the set
    else:
        assert rep.total_sites >= 2, str(rep)  # it still fuses (one site per layer)
    bound = MAX_ATTEMPTS_PER_NODE_EAGER_ATTENTION.get(name, MAX_ATTEMPTS_PER_NODE)
    assert 0 < rep.match_attempts <= bound * nodes, (rep.match_attempts, nodes)


def test_near_misses_of_reused_intermediates_only_for_a_report():
    def f(q, k, v):
        t = q * k
        return t + v, t  # the product has a second user: mul_add cannot fire
    args = [torch.randn(4, 8) for _ in range(3)]
    named = {**CPU, "patterns": ["elementwise.mul_add"]}  # an opt-in rule: its near misses show where named
    quiet = fusion_backend.explain(f, *args, options={**named, "report": False})
    full = fusion_backend.explain(f, *args, options=named)
    assert quiet.sites["elementwise.mul_add"] == full.sites["elementwise.mul_add"] == 0
    assert quiet.match_attempts == full.match_attempts > 0  # the cheap counts are always kept
    assert not quiet.near_misses and not quiet.graphs[0].graph_code
    assert any("reused" in m.reason for m in full.near_misses), str(full)
    assert "fusekit.mul_add" not in full.graphs[0].graph_code and "aten.mul" in full.graphs[0].graph_code


@pytest.mark.slow
def test_new_process_loads_traced_patterns_instead_of_tracing(tmp_path):
    """The first process traces and writes the disk cache; a second one, where tracing would raise, loads
    it and fuses the same."""
    code = textwrap.dedent("""
        import sys, torch, fusion_backend
        from fusion_backend import forms
        if sys.argv[1] == "forbid":
            def no_trace(*a, **k):
                raise AssertionError("traced at compile time")
            forms._trace_forms = no_trace
        x = [torch.randn(4, 8) for _ in range(3)]
        rep = fusion_backend.explain(lambda q, k, v: q * k + v, *x, options={"cpu_reference": True})
        assert rep.sites["elementwise.mul_add"] == 1 and not rep.errors, str(rep)
        print(len(list(forms.cache_dir().glob("*.pkl"))))
    """)
    env = {**os.environ, "FUSEKIT_CACHE": str(tmp_path)}
    outs = []
    for how in ("trace", "forbid"):
        r = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(int(r.stdout.split()[-1]))
    assert outs[0] > 0 and outs[1] == outs[0]  # written once, then only read



def test_cuda_pairs_that_cannot_fire_are_not_offered_unless_reporting():
    """On CUDA a rule whose kernel does not take a dtype only explains near misses in it: a compile that reports
    nothing is not offered those entries (Falcon's float32 rotary and softmax held 39% of its attempts), a report is,
    and CPU graphs (the references take every dtype of the rule) keep them."""
    from fusion_backend import matcher, ops, table

    graph_dtypes = [(torch.bfloat16, "cuda"), (torch.float32, "cuda"), (torch.float32, "cpu")]
    narrow = [p for p in table.all_patterns() if not ops.cuda_kernel_takes(p.op, torch.float32)
              and torch.float32 in p.dtypes]
    assert any(p.id.startswith("decode.") for p in narrow)
    for p in narrow:
        every = matcher.rule_pairs(p, graph_dtypes)
        firing = matcher.rule_pairs(p, graph_dtypes, firing_only=True)
        assert (torch.float32, "cuda") in every and (torch.float32, "cuda") not in firing, p.id
        assert [x for x in every if x != (torch.float32, "cuda")] == firing, p.id


def test_a_dtype_a_rule_lacks_gets_stand_in_forms_only_when_reporting():
    """A graph dtype that a rule does not take is offered the rule's first dtype's forms, which can only explain a
    dtype near miss: a compile that reports nothing is not offered them (nor made to trace them: a bf16 CUDA graph
    holding float32 traced every bf16/fp16 rule's float16 forms). int8 rules, found by the floating dtypes of the
    graph around them, keep theirs."""
    from fusion_backend import matcher, table

    graph_dtypes = [(torch.bfloat16, "cpu"), (torch.float32, "cpu")]
    half_only = [p for p in table.all_patterns() if set(p.dtypes) == {torch.float16, torch.bfloat16}]
    assert half_only
    for p in half_only:
        assert (p.dtypes[0], "cpu") in matcher.rule_pairs(p, graph_dtypes), p.id  # stands in for float32
        assert matcher.rule_pairs(p, graph_dtypes, firing_only=True) == [(torch.bfloat16, "cpu")], p.id
    int8 = [p for p in table.all_patterns() if p.dtypes == (torch.int8,)]
    assert int8
    for p in int8:
        assert matcher.rule_pairs(p, graph_dtypes, firing_only=True) == [(torch.int8, "cpu")], p.id


def test_prechecked_pattern_fails_early_and_matches_the_same():
    """The check before Inductor's matcher (the ops the anchor's inputs come from) rejects only what the pattern
    itself rejects."""
    from torch._inductor import pattern_matcher as pm

    from fusion_backend.matcher import Prechecked

    aten = torch.ops.aten
    pattern = pm.CallFunction(aten.mul.Tensor, pm.CallFunction(aten.add.Tensor, pm.KeywordArg("a"), pm.KeywordArg("b")),
                              pm.KeywordArg("c"))
    checked = Prechecked.of(pattern)
    assert isinstance(checked, Prechecked) and Prechecked.of(pm.KeywordArg("a")) is not None
    g = torch.fx.Graph()
    x, y, z = (g.placeholder(n) for n in "xyz")
    def add():  # one user each: the pattern's inner node may not be shared
        return g.call_function(aten.add.Tensor, (x, y))
    nodes = [g.call_function(aten.mul.Tensor, (add(), z)),
             g.call_function(aten.mul.Tensor, (g.call_function(aten.sub.Tensor, (x, y)), z)),
             g.call_function(aten.mul.Tensor, (z, add())), g.call_function(aten.mul.Tensor, (add(), z, z))]
    got = [pm.is_match(checked.match(n)) for n in nodes]
    assert got == [pm.is_match(pattern.match(n)) for n in nodes] == [True, False, False, False]
    assert checked.fns == pattern.fns  # the rest of the interface is the pattern's


def test_a_form_is_offered_only_where_its_whole_chain_of_calls_occurs():
    """A form's ops and parent -> child edges can each occur in a graph while its chain does not: its call tree
    (forms.Call) is then nowhere in the graph, and the form is not offered."""
    from torch._inductor import pattern_matcher as pm

    from fusion_backend import forms
    from fusion_backend.matcher import GraphIndex

    aten = torch.ops.aten
    form = pm.CallFunction(aten.neg.default, pm.CallFunction(
        aten.mul.Tensor, pm.CallFunction(aten.add.Tensor, pm.KeywordArg("a"), pm.KeywordArg("b")), pm.KeywordArg("c")))
    g = torch.fx.Graph()
    x, y, z = (g.placeholder(n) for n in "xyz")
    g.call_function(aten.mul.Tensor, (g.call_function(aten.add.Tensor, (x, y)), z))  # mul(add), no neg after it
    g.call_function(aten.neg.default, (g.call_function(aten.mul.Tensor, (x, y)),))   # neg(mul), no add before it
    index, head = GraphIndex(g), (forms.requirements(form), forms.calls(form, {}))
    assert index.fits(*head[0]) and not index.occurs(head[1])
    def chain(*add_args):
        return g.call_function(aten.neg.default, (g.call_function(aten.mul.Tensor, (
            g.call_function(aten.add.Tensor, add_args), z)),))
    chain(x, y, z)
    assert not GraphIndex(g).occurs(head[1])  # an add of three arguments is not the form's add
    chain(x, z)
    assert GraphIndex(g).occurs(head[1])

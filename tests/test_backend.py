"""The backend: entry point, mode/options, composition with user passes, cache keys, failure isolation,
and options={"verify": True}."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import fusion_backend
from conftest import CPU, explain
from fusion_backend import matcher, passes, table
from fusion_backend.backend import split_options


def f_exp(x, y):
    return torch.exp((x + y) * 2)


@pytest.mark.slow
def test_entry_point_in_fresh_process():
    code = textwrap.dedent("""
        import sys, torch
        assert "fusion_backend" not in sys.modules
        f = torch.compile(lambda x, y: torch.exp((x + y) * 2), backend="fusekit")
        x, y = torch.randn(8), torch.randn(8)
        torch.testing.assert_close(f(x, y), torch.exp((x + y) * 2))
        assert "fusion_backend" in sys.modules and "fusekit" in torch._dynamo.list_backends()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       cwd="/", env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_options_split():
    fk, patches = split_options(None, {"cpu_reference": True, "verify": True, "patterns": "elementwise",
                                       "disable": ["elementwise.mul_add"], "max_autotune": True})
    assert fk.cpu_reference and fk.verify
    assert fk.patterns and all(p.startswith("elementwise.") for p in fk.patterns)
    assert "elementwise.mul_add" not in fk.patterns
    assert patches == {"max_autotune": True}  # Inductor's keys pass through unchanged
    assert split_options("reduce-overhead", None)[1] == {"triton.cudagraphs": True}
    assert split_options(None, {"mode": "reduce-overhead"})[1] == {"triton.cudagraphs": True}
    with pytest.raises(ValueError, match="unknown pattern"):
        split_options(None, {"patterns": ["nope"]})
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        split_options("fastest-please", None)


def test_enable_keeps_every_rule_and_forces_the_named():
    every = split_options(None, None)[0]
    fk = split_options(None, {"enable": "decode.mha", "disable": "quantize"})[0]
    assert fk.forced == ("decode.mha",) and "decode.mha" in fk.patterns
    assert set(fk.patterns) == {p for p in every.patterns if not p.startswith("quantize.")}
    assert not every.forced
    with pytest.raises(ValueError, match="together"):
        split_options(None, {"enable": "decode.mha", "patterns": "decode"})
    with pytest.raises(ValueError, match="unknown pattern"):
        split_options(None, {"enable": ["nope"]})


def test_patterns_and_disable_select_what_fires():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert explain(f_exp, x, y).sites["elementwise.add_mul_exp"] == 1
    assert sum(explain(f_exp, x, y, disable=["elementwise"]).sites.values()) == 0
    assert sum(explain(f_exp, x, y, patterns=["quantize"]).sites.values()) == 0
    assert explain(f_exp, x, y, patterns=["elementwise.add_mul_exp"]).sites["elementwise.add_mul_exp"] == 1


def test_mode_and_inductor_options_reach_inductor():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    seen = {}

    class Spy(CustomGraphPass):
        def __call__(self, g):
            from torch._inductor import config
            seen["cudagraphs"] = config.triton.cudagraphs
        def uuid(self):
            return "spy"

    rep = explain(f_exp, x, y, mode="reduce-overhead", post_grad_custom_pre_pass=Spy())
    assert seen["cudagraphs"] is True and rep.sites["elementwise.add_mul_exp"] == 1


def test_user_passes_are_kept():
    calls = []

    class Mine(CustomGraphPass):
        def __init__(self, tag):
            self.tag = tag
        def __call__(self, g):
            calls.append((self.tag, "fusekit.add_mul_exp" in str(g)))
        def uuid(self):
            return self.tag

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    explain(f_exp, x, y, post_grad_custom_pre_pass=Mine("pre"), post_grad_custom_post_pass=Mine("post"))
    # the user's pre pass runs before fusekit, the user's post pass after it (and sees the fused op)
    assert calls == [("pre", False), ("post", True)]
    from torch._inductor import config
    with config.patch(post_grad_custom_post_pass=Mine("global")):
        calls.clear()
        explain(f_exp, x, y)
        assert calls == [("global", True)]


def test_uuid_covers_patterns_options_and_user_pass(tmp_path, monkeypatch):
    opts = split_options(None, CPU)[0]
    base = passes.FusekitPass(opts).uuid()
    assert base == passes.FusekitPass(opts).uuid()
    assert base != passes.FusekitPass(split_options(None, {})[0]).uuid()
    assert base != passes.FusekitPass(split_options(None, {**CPU, "disable": "quantize"})[0]).uuid()
    # a changed pattern file changes the key, so a stale compiled graph is never replayed
    copies = []
    for i, f in enumerate(passes.source_files()):
        (tmp_path / str(i)).mkdir()
        c = tmp_path / str(i) / os.path.basename(f)
        c.write_text(open(f).read())
        copies.append(str(c))
    monkeypatch.setattr(passes, "source_files", lambda: tuple(copies))
    assert passes.FusekitPass(opts).uuid() == base
    with open(copies[-1], "a") as fh:
        fh.write("\n# edited\n")
    assert passes.FusekitPass(opts).uuid() != base
    # only what decides a compiled graph is hashed: editing the CLI or the benchmark tools keeps the key
    names = {os.path.basename(f) for f in passes.source_files()}
    assert {"passes.py", "matcher.py", "tracing.py", "elementwise.py"} <= names
    assert not names & {"cli.py", "e2e.py", "profile.py", "models.py", "report.py"}
    # a user pass without uuid() keeps Inductor's cache bypass
    assert passes.FusekitPass(opts, user_pass=lambda g: None).uuid() is None


def test_exception_in_guard_skips_the_site(monkeypatch):
    import fusion_backend.guards as G
    p = table.by_id("elementwise.add_mul_exp")

    def boom(site):
        raise RuntimeError("guard exploded")

    monkeypatch.setattr(G, "all_guards", lambda pat: (G.Guard("boom", boom),) if pat is p else
                        G.all_guards.__wrapped__(pat))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    rep = explain(f_exp, x, y)
    assert rep.sites[p.id] == 0 and any("guard exploded" in e.reason for e in rep.errors), str(rep)
    assert "guard exploded" in str(rep)
    torch.testing.assert_close(rep.output, f_exp(x, y))


def test_exception_in_rewrite_restores_graph(monkeypatch):
    p = table.by_id("elementwise.add_mul_exp")
    entries = {id(e.entry): e.entry for e in matcher.entries(p.id, torch.float32, "cpu")}.values()

    def broken_apply(match, graph, node):
        graph.erase_node(next(n for n in graph.nodes if n.op == "output"))  # damage, then fail
        raise RuntimeError("rewrite exploded")

    for e in entries:  # the pass binds these entries to its run, which turns the error into a restore
        monkeypatch.setattr(e, "apply", broken_apply)

    def g(x, y, q, k, v):
        return torch.exp((x + y) * 2), q * k + v
    args = [torch.randn(4, 8) for _ in range(5)]
    rep = explain(g, *args)
    assert any("rewrite exploded" in e.reason for e in rep.errors), str(rep)
    assert rep.sites[p.id] == 0 and rep.sites["elementwise.mul_add"] == 1  # the rest still fuses
    for o, r in zip(rep.output, g(*args)):
        torch.testing.assert_close(o, r)


def test_verify_passes_on_correct_kernels_and_names_the_bad_site(monkeypatch):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    rep = explain(f_exp, x, y, verify=True)
    assert rep.sites["elementwise.add_mul_exp"] == 1 and "fusekit.verify" in rep.graphs[0].graph_code
    torch.testing.assert_close(rep.output, f_exp(x, y))

    # a wrong kernel: the reference used by verify disagrees with what the op computed
    import dataclasses
    import fusion_backend.verify as V
    p = table.by_id("elementwise.add_mul_exp")
    def wrong_ref(x: torch.Tensor, y: torch.Tensor, c: float = 2.0) -> torch.Tensor:
        return torch.exp((x + y) * c) + 1.0

    wrong = dataclasses.replace(p, reference=wrong_ref)
    by_id = table.by_id
    monkeypatch.setattr(V.table, "by_id", lambda pid: wrong if pid == p.id else by_id(pid))
    with pytest.raises(Exception, match=r"pattern 'elementwise.add_mul_exp' at site 'graph \d+: exp \(test_backend.py:\d+ in f_exp\)'.*exceeds atol"):
        explain(f_exp, x * 3, y, verify=True)


def test_backend_factory_with_mode_and_options():
    b = fusion_backend.backend(mode="reduce-overhead", options=CPU)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f_exp, backend=b)(x, y), f_exp(x, y))
    torch._dynamo.reset()


def test_report_prints_table_and_logs(caplog):
    import logging
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="fusion_backend"):
        rep = explain(f_exp, x, y)
    text = str(rep)
    assert "elementwise.add_mul_exp" in text and "sites" in text and "left to Inductor" in text
    assert any("elementwise.add_mul_exp" in r.getMessage() for r in caplog.records)
    d = rep.to_dict()
    assert d["sites"] == 1 and d["patterns"][0]["pattern"]
    assert fusion_backend.report(last=1).graphs


def test_dynamic_shapes_guards_do_not_crash():
    """Symbolic sizes reach the shape guards (SymInts cannot be hashed): the rule still fires, no error."""
    import fusion_backend

    from fusion_backend.report import _fresh_compile

    f = torch.compile(lambda q, k, v: q * k + v, backend="fusekit", dynamic=True,
                      options={"cpu_reference": True})
    with _fresh_compile(), fusion_backend.stats.collect() as recs:  # a cache hit would skip the pass
        for n in (8, 9):
            x = torch.randn(n, 16)
            torch.testing.assert_close(f(x, x, x), x * x + x)
    assert recs and not any(r.errors for r in recs), [str(r.errors) for r in recs]
    assert recs[-1].sites["elementwise.mul_add"] == 1


def test_kernels_load_before_inductor_for_cuda_graphs(monkeypatch):
    """A graph Inductor finds in its FX cache calls fusekit's ops without the pass running, so the backend
    must load the CUDA kernels itself before compile_fx (regression: a warm cache in a new process raised
    "Could not run 'fusekit::matmul_epilogue' with arguments from the 'CUDA' backend" on an H200). Checked
    here with fake CUDA inputs and compile_fx stubbed out: the load happens first, and only for CUDA inputs."""
    from torch._inductor import compile_fx as cfx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion_backend import _ext
    from fusion_backend.backend import fusekit

    events = []
    monkeypatch.setattr(_ext, "load_for_device", lambda: events.append("load"))
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, inputs, config_patches=None: events.append("compile") or gm)
    gm = torch.fx.symbolic_trace(f_exp)
    with FakeTensorMode():
        cuda_inputs = [torch.empty(4, device="cuda"), torch.empty(4, device="cuda")]
    fusekit(gm, cuda_inputs)
    assert events == ["load", "compile"], events
    events.clear()
    fusekit(gm, [torch.randn(4), torch.randn(4)])
    assert events == ["compile"], events


@pytest.mark.parametrize("capability, options, want", [
    ((9, 0), None, ("triton.enable_pdl", "combo_kernels", "combo_kernels_pointwise_only")), ((8, 0), None, ()),
    ((9, 0), {"triton.enable_pdl": False}, ("combo_kernels", "combo_kernels_pointwise_only")),
    ((9, 0), {"combo_kernels": False}, ("triton.enable_pdl", "combo_kernels_pointwise_only"))])
def test_decode_inductor_settings_offered_on_hopper_unless_set(monkeypatch, capability, options, want):
    """On sm_90+ the backend lets its pass set the Inductor settings the decode family declares (patterns.decode.
    INDUCTOR, where a decode attention rule fires; see the next test), holding each config key at its current value
    so that it goes back after the compile; not before sm_90, and never a key the user set. Checked with fake CUDA
    inputs, the device's capability stubbed and compile_fx stubbed."""
    from torch._inductor import compile_fx as cfx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion_backend import _ext
    from fusion_backend.backend import fusekit
    from fusion_backend.passes import inductor_config_value

    DECODE_INDUCTOR = table.inductor_settings()["decode"].config
    want = tuple(k for k in want if inductor_config_value(k) is not None)  # (keys this torch has)
    seen = {}
    monkeypatch.setattr(_ext, "load_for_device", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, inputs, config_patches=None: seen.update(config_patches) or gm)
    gm = torch.fx.symbolic_trace(f_exp)
    with FakeTensorMode():
        cuda_inputs = [torch.empty(4, device="cuda"), torch.empty(4, device="cuda")]
    fusekit(gm, cuda_inputs, options=options)
    assert dict(seen["post_grad_custom_post_pass"].options.inductor).get("decode", ()) == want, seen
    for key in DECODE_INDUCTOR:  # held at its value, the user's, or not patched at all
        assert seen.get(key, "unset") == (inductor_config_value(key) if key in want else
                                          (options or {}).get(key, "unset")), (key, seen)
    seen.clear()
    fusekit(gm, [torch.randn(4), torch.randn(4)])  # CPU inputs: Inductor's defaults
    assert not seen["post_grad_custom_post_pass"].options.inductor, seen
    assert not set(DECODE_INDUCTOR) & set(seen), seen


@pytest.mark.slow
@pytest.mark.parametrize("decode", [True, False])
def test_pass_sets_decode_inductor_settings_where_decode_attention_fired(monkeypatch, decode):
    """The pass sets Inductor's decode settings (triton.enable_pdl, combo_kernels, ...) for the rest of a compile
    where a decode attention rule fired (the tiny Llama's decode step on CPU, with the backend told it runs on
    sm_90+), not where none did (the same model's 32-token prompt), and the values are back to what they were
    after the compile. Seen by a user post pass, which runs after fusekit's."""
    import importlib

    from fusion_backend.passes import inductor_config_value
    from fusion_backend.tools import decode_bench

    backend_mod = importlib.import_module("fusion_backend.backend")  # (the package's `backend` is the function)

    DECODE_INDUCTOR = table.inductor_settings()["decode"].config
    keys = [k for k in DECODE_INDUCTOR if inductor_config_value(k) is not None]
    if not keys:
        pytest.skip("this torch's Inductor has none of the decode settings")
    monkeypatch.setattr(backend_mod, "_cuda_capability", lambda inputs: (9, 0))
    seen = []

    def probe(graph):
        seen.append({k: inductor_config_value(k) for k in keys})

    before = {k: inductor_config_value(k) for k in keys}
    torch._dynamo.reset()
    compiled = torch.compile(backend=backend_mod.backend(options={"cpu_reference": True,
                                                                 "post_grad_custom_post_pass": probe}))
    with torch.no_grad():
        if decode:
            st = decode_bench.Step("llama", "cpu", 2, 64)
            st.at(40)
            st(compiled(st.model))
        else:
            st = decode_bench.Prompt("llama", "cpu", 2, 32, 64)  # (decode rules take 1-16 query rows)
            st(compiled(st.model))
    torch._dynamo.reset()
    assert seen and seen[-1] == ({k: DECODE_INDUCTOR[k] for k in keys} if decode else before), seen
    assert {k: inductor_config_value(k) for k in keys} == before


@pytest.mark.slow
def test_compiles_again_without_the_decode_settings_if_inductor_fails_with_them(monkeypatch, caplog):
    """Where Inductor fails after the pass set the decode family's settings (simulated: a user post pass, which runs after
    fusekit's, raises while combo_kernels is on), the backend compiles the graph again without them: the step runs
    and gives the uncompiled model's logits, and the log says why. A failure without those settings propagates."""
    import importlib

    from fusion_backend.passes import inductor_config_value
    from fusion_backend.tools import decode_bench

    backend_mod = importlib.import_module("fusion_backend.backend")
    if inductor_config_value("combo_kernels") is None:
        pytest.skip("this torch's Inductor has no combo_kernels")
    monkeypatch.setattr(backend_mod, "_cuda_capability", lambda inputs: (9, 0))
    calls = []

    def fails_with_combo(graph):
        calls.append(inductor_config_value("combo_kernels"))
        if inductor_config_value("combo_kernels"):
            raise RuntimeError("simulated Inductor failure")

    st = decode_bench.Step("llama", "cpu", 2, 64)
    st.at(40)
    with torch.no_grad():
        want = st(st.model).float()
        torch._dynamo.reset()
        compiled = torch.compile(st.model, backend=backend_mod.backend(options={
            "cpu_reference": True, "post_grad_custom_post_pass": fails_with_combo}))
        st.restore()
        st.at(40)
        with caplog.at_level("WARNING", logger="fusion_backend"):
            got = st(compiled).float()
    torch._dynamo.reset()
    assert calls[:2] == [True, False], calls
    assert "compiling without them" in caplog.text
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)

    def always_fails(graph):
        calls.append("always")
        raise RuntimeError("a failure of its own")

    calls.clear()
    compiled = torch.compile(st.model, backend=backend_mod.backend(options={
        "cpu_reference": True, "post_grad_custom_post_pass": always_fails}))
    with torch.no_grad(), pytest.raises(Exception, match="a failure of its own"):
        st(compiled)
    torch._dynamo.reset()
    assert calls == ["always", "always"], calls  # tried without the settings once, then raised

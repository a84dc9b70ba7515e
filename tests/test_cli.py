"""The `fusekit` command on CPU (tiny configurations): every subcommand runs and writes what it says."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from fusion_backend import table  # noqa: E402
from fusion_backend.tools import cli, models  # noqa: E402


def test_console_script_is_installed():
    exe = shutil.which("fusekit")
    assert exe, "pip install -e . installs the `fusekit` command"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    assert all(c in out for c in ("bench", "profile", "explain", "doctor"))


def test_closed_output_pipe_is_not_an_error():
    """`fusekit doctor | head -5`: the reader may leave before the writer is done (a broken pipe)."""
    r, w = os.pipe()
    os.close(r)  # every write to w now fails with EPIPE
    try:
        p = subprocess.run([shutil.which("fusekit"), "doctor"], stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_doctor_lists_every_pattern_per_dtype(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    for p in table.all_patterns():
        assert p.id in out
    assert "limits" in out and "head dims 64, 80, 96, 112, 128, 160, 192, 256" in out  # every head dim is named
    for rule in ("cache.window_roll", "cache.window_roll_reader", "cache.length_counters", "collective.all_reduce_one_shot",
                 "collective.all_reduce_add_rms_norm"):
        line = next(x for x in out.splitlines() if x.split()[:1] == [rule])  # the rewrites outside the tables
        assert line.split()[1] in ("on", "no-kernel"), line


def _doctor_rows(out):
    """{pattern id: [float32, float16, bfloat16, int8 cells]} from doctor's table."""
    ids = {p.id for p in table.all_patterns()}
    rows = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] in ids:
            cells = parts[1].replace("on (sm_90a)", "on(sm_90a)").split()
            rows[parts[0]] = [c.replace("on(sm_90a)", "on (sm_90a)") for c in cells]
    return rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU view")
def test_doctor_without_gpu_shows_the_sm90_policy(capsys):
    """No GPU: one line says so, and the table shows what fires by default on an sm_90 GPU per dtype (the rules'
    measured policy), not `cpu-ref` on every row; one line says every rule runs on CPU as a reference."""
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "GPU: none" in out and "sm_90" in out
    assert "cpu-ref" not in out
    assert "options={'cpu_reference': True}" in out
    rows = _doctor_rows(out)
    assert set(rows) == {p.id for p in table.all_patterns()}
    assert all(len(cells) == 4 for cells in rows.values()), rows
    assert rows["decode.gqa"] == ["no-kernel", "on", "on", "-"]          # no float32 kernel; GQA on by default
    assert rows["decode.mha"] == ["no-kernel", "opt-in", "opt-in", "-"]  # measured slower near a full cache
    assert rows["decode_gemm.linear"][1:3] == ["on (sm_90a)", "on (sm_90a)"]  # tma_default: the TMA kernel's
    assert rows["elementwise.gelu_tanh"][:3] == ["opt-in", "on*", "on*"]  # 16-bit only, from a size up
    from fusion_backend import _ext
    cutlass = not any(f.endswith("/matmul_epilogue.cu") for f in _ext.skipped("9.0a"))  # headers found here
    assert rows["batched_matmul.linear_bias_residual"][:3] == ["opt-in" if cutlass else "no-kernel"] * 3
    assert rows["batched_matmul.mm_bias_gelu"][:3] == ["on" if cutlass else "no-kernel"] * 3
    assert rows["quantize.dequant_i8_float16"] == ["-", "-", "-", "opt-in"]
    assert "fusekit::decode_attention has no CUDA kernel for float32" in out  # the reason for no-kernel


def test_doctor_on_a_gpu_shows_what_fires_there(monkeypatch, capsys):
    """On a GPU (faked here: an sm_90 device whose build lacks the CUTLASS matmul kernel): per rule and dtype on /
    opt-in / no-kernel (with the reason) / -, from the pass's own checks."""
    from fusion_backend import _ext

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H100")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: type("P", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(_ext, "device_arch", lambda *a: "9.0a")
    monkeypatch.setattr(_ext, "load_for_device", lambda: _ext.Status(True, "loaded", "/fake/fusekit_cuda.so", "9.0a"))
    cutlass = "fusekit::matmul_epilogue has no CUDA kernel here: batched_matmul/matmul_epilogue.cu needs the CUTLASS headers"
    monkeypatch.setattr(_ext, "missing_cuda_kernel", lambda op, dev: cutlass if op == "matmul_epilogue" else None)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "what fires on this GPU (Fake H100, sm_90a)" in out and "cpu-ref" not in out
    rows = _doctor_rows(out)
    assert set(rows) == {p.id for p in table.all_patterns()}
    assert rows["decode.gqa"] == ["no-kernel", "on", "on", "-"]
    assert rows["decode.mha"] == ["no-kernel", "opt-in", "opt-in", "-"]
    assert rows["decode_gemm.linear"][1:3] == ["on", "on"]  # the TMA kernel is there (sm_90a, loaded)
    assert rows["batched_matmul.mm_bias_gelu"][:3] == ["no-kernel"] * 3
    assert "batched_matmul.* (" in out and cutlass in out  # the reason, once for the family


def test_explain_named_model(capsys):
    assert cli.main(["explain", "--model", "llama", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "elementwise.silu_mul      2" in out or "elementwise.silu_mul" in out
    # silu_mul x2 and, at 64 rows (batch 2 x 32 tokens: within decode_gemm.qkv's 64), the RMSNorm and q/k/v x2 (on a
    # CPU every rule fires, the opt-in ones included)
    assert "4 site(s) fused" in out and re.search(r"decode_gemm\.rms_qkv +2 ", out)


# what a timing table or caption says: none of it may appear in the CPU flow check's output
TIMING_WORDS = (" ms", "ms |", "tok/s", "tokens/s", "vs Inductor", "x Inductor", "speedup", "floor", "GB/s",
                "bandwidth", "host", "CUDA graph", "GPU idle", "fusekit-ro")


def _assert_no_timing(text):
    bad = [w for w in TIMING_WORDS if w in text]
    assert not bad, (bad, text)


@pytest.mark.slow
def test_bench_tiny_cpu_is_a_flow_check_and_writes_table_json_plot(tmp_path, capsys):
    assert cli.main(["bench", "--phase", "prefill", "--models", "gpt2,bert", "--cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "a flow check, not a benchmark" in out and "reference implementation" in out
    assert "prefill: gpt2, bert: eager and fusekit" in out  # the start line names only what has rows
    _assert_no_timing(out)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["env"]["check"] == "flow"
    assert [r["model"] for r in data["results"]] == ["gpt2", "bert"]
    for r in data["results"]:
        assert set(r["modes"]) == {"eager", "fusekit"}  # Inductor is not run, nor CUDA graphs
        fk = r["modes"]["fusekit"]
        assert fk["sites"] and fk["errors"] == 0 and fk["check"] == "ok"
        assert fk["max_rel_err_vs_eager"] < 1e-5 and fk["compile_s"] > 0
        # the keys a GPU run writes, unmeasured here: null, never a CPU timing
        assert all(fk[k] is None for k in ("ms", "tokens_per_s", "vs_inductor", "host_ms", "peak_mib"))
    md = (tmp_path / "bench.md").read_text()
    assert "a flow check, not a benchmark" in md and "reference implementation" in md
    assert "| gpt2 | float32 | 2x32 | inference | elementwise.gelu_tanh x2 | 0 |" in md
    _assert_no_timing(md)
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert not (tmp_path / "decode.json").exists()


@pytest.mark.slow
def test_bench_decode_tiny_cpu_checks_logits_against_eager(tmp_path, capsys):
    assert cli.main(["bench", "--phase", "decode", "--models", "llama,bert", "--cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "a flow check, not a benchmark" in out
    _assert_no_timing(out)
    data = json.loads((tmp_path / "decode.json").read_text())
    assert [r["model"] for r in data["steps"]] == ["llama"]  # an encoder has no decode step
    step = data["steps"][0]
    fk = step["backends"]["fusekit"]
    assert set(step["backends"]) == {"eager", "fusekit"}
    assert fk["sites"]["decode.gqa"] == 2 and fk["errors"] == 0 and fk["check"] == "ok"  # one per layer
    assert set(step["positions"]) == {"8", "40"}
    for row in step["positions"].values():
        assert row["fusekit_vs_eager_rel"] < 1e-5 and row["argmax_equal_eager"]
        assert row["fusekit"] is None and row["speedup"] is None and row["floor_ms"] is None
    md = (tmp_path / "decode.md").read_text()
    assert "a flow check, not a benchmark" in md and "| llama | 2 | 8, 40 / 64 |" in md
    _assert_no_timing(md)
    assert (tmp_path / "decode.png").stat().st_size > 1000
    assert not (tmp_path / "bench.json").exists()


def test_bench_without_gpu_runs_the_flow_check(monkeypatch, tmp_path):
    """The command's routing: no GPU (or --cpu) -> flow.bench, both phases by default; with a GPU -> the timed
    benchmarks, unchanged (faked here)."""
    from fusion_backend.tools import decode_bench, e2e, flow

    calls = []
    monkeypatch.setattr(flow, "bench", lambda *a, **k: calls.append(("flow", a[2])))
    monkeypatch.setattr(e2e, "bench", lambda *a, **k: calls.append(("e2e", a[1])))
    monkeypatch.setattr(decode_bench, "bench", lambda *a, **k: calls.append(("decode", None)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "--out", str(tmp_path)]) == 0
    assert calls == [("flow", ("prefill", "decode"))]
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["bench", "--cpu", "--phase", "decode", "--out", str(tmp_path)]) == 0
    assert calls == [("flow", ("decode",))]
    calls.clear()
    assert cli.main(["bench", "--out", str(tmp_path)]) == 0
    assert calls == [("e2e", e2e.MODES), ("decode", None)]


def test_flow_tables_have_no_timing_columns(tmp_path):
    """The CPU reports from records as flow.py writes them: sites, errors, near misses, error against eager and a
    check per model; no timing column or caption; a plot of sites and errors."""
    from fusion_backend.tools import flow

    env = {"device": "CPU", "torch": "t", "transformers": "x", "rest_of_graph": "ATen calls"}
    groups = [{"pattern": "elementwise.mul_add", "guard": "same_shape(q, k, v)", "count": 5,
               "example": "add_3 (m.py:1 in f): same_shape(q, k, v): shapes differ"}]
    fk = {"sites": {"elementwise.silu_mul": 2}, "errors": 0, "near_misses": 5, "near_miss_groups": groups,
          "max_rel_err_vs_eager": 2e-7, "check": "ok", "compile_s": 3.0, "graphs": 1}
    pre = [{"model": "llama", "dtype": "float32", "batch": 2, "seq": 32, "grad_mode": "inference",
            "modes": {"fusekit": fk}}]
    md = flow.prefill_markdown(pre, env)
    assert "| llama | float32 | 2x32 | inference | elementwise.silu_mul x2 | 0 | 5 | 2.0e-07 | ok | 3.0 |" in md
    assert "`elementwise.mul_add` x5: same_shape(q, k, v): shapes differ" in md
    _assert_no_timing(md)
    dec = [{"model": "llama", "batch": 2, "cache_len": 64, "backends": {"fusekit": fk},
            "positions": {"8": {"fusekit_vs_eager_rel": 1e-7, "argmax_equal_eager": True}}}]
    md = flow.decode_markdown(dec, [], env)
    assert "| llama | 2 | 8 / 64 | elementwise.silu_mul x2 | 0 | 5 | @8 1.0e-07 | yes | ok |" in md
    _assert_no_timing(md)
    assert flow.verdict(0, 1e-3, "float32", {"a": 1}) == "MISMATCH" and flow.verdict(1, 0.0, "float32", {}) == "ERRORS"
    flow.plot([("llama", fk)], tmp_path / "p.png", "prefill", "error")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_bench_rejects_unknown_model(capsys):
    assert cli.main(["bench", "--models", "nope", "--cpu"]) == 2


@pytest.mark.slow
def test_profile_tiny_cpu_writes_trace_and_hints(tmp_path):
    assert cli.main(["profile", "--model", "gpt2", "--out", str(tmp_path), "--iters", "2"]) == 0
    data = json.loads((tmp_path / "profile_gpt2.json").read_text())
    assert set(data["modes"]) == {"eager", "inductor", "fusekit"}
    eager = data["modes"]["eager"]
    assert eager["categories"] and eager["top_kernels"] and eager["hints"]
    assert abs(sum(c["share"] for c in eager["categories"].values()) - 1) < 1e-6
    assert json.loads((tmp_path / "trace_gpt2_eager.json").read_text())["traceEvents"]


def test_every_model_builds_tiny():
    for name in models.MODELS:
        m, inputs, desc = models.make(name, "cpu")
        with torch.no_grad():
            assert models.first_output(m(**inputs)).shape[:2] == (2, desc["seq"]), name


@pytest.mark.slow
def test_examples_benchmark_script_is_the_command():
    out = subprocess.run([sys.executable, "examples/benchmark_transformer.py", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--models" in out


def test_roofline_classifies_ops_with_flops():
    """GEMMs are judged from FLOPs and bytes against the ridge point of the given ceilings."""
    from torch.profiler import ProfilerActivity, profile

    from fusion_backend.tools.profile import _roofline_ops

    a, x = torch.randn(256, 256), torch.randn(4096, 4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        a @ a        # 2*256^3 FLOPs on 512 KiB: 64 FLOP/B
        x @ x[:4]    # 2*4096*4*4 FLOPs on 64 KiB: 2 FLOP/B
    rows = {r["shapes"]: r for r in _roofline_ops(prof, 1, {"matmul_tflops": 10.0, "copy_gbps": 1000.0},
                                                  elem_size=4, device_time=False)}
    big = next(r for s, r in rows.items() if "256, 256" in s)
    small = next(r for s, r in rows.items() if "4096, 4" in s)
    assert big["bound"] == "compute" and small["bound"] == "memory", rows
    assert big["intensity_flop_per_byte"] > 10 > small["intensity_flop_per_byte"]  # ridge: 10 FLOP/B


def test_decode_profile_timeline_and_report(tmp_path):
    """fusekit profile --phase decode's summary of profiled kernels (no GPU needed for the arithmetic): kernels per
    step and per layer, busy time as the union of overlapping kernels (programmatic dependent launch), idle time,
    per-kernel sums, the markdown and the plot; without a GPU the command says it needs one."""
    from fusion_backend.tools import step_profile

    # two replays of a 3-kernel step; c overlaps b by 1 us, 10 us idle between the replays
    ks = [(0, 5, "void fk::attn<float, 64>(P)"), (6, 10, "triton_poi_fused_add_0"), (9, 12, "gemm_kernel"),
          (22, 27, "void fk::attn<float, 64>(P)"), (28, 32, "triton_poi_fused_add_0"), (31, 34, "gemm_kernel")]
    tl = step_profile.timeline(ks, replays=2, layers=3)
    assert tl["kernels_per_step"] == 3 and tl["kernels_per_layer"] == 1
    assert tl["busy_us_per_step"] == 11 and tl["span_us_per_step"] == 17 and tl["idle_us_per_step"] == 6
    by = {k["short"]: k for k in tl["by_kernel"]}
    assert by["attn"]["us_per_step"] == 5 and by["attn"]["per_step"] == 1 and by["gemm_kernel"]["us_median"] == 3
    assert [k["short"] for k in tl["one_step"]] == ["attn", "triton_poi_fused_add_0", "gemm_kernel"]
    assert [k["gap_before_us"] for k in tl["one_step"]] == [0, 1, -1]
    res = [{"model": "llama", "batch": 1, "position": 1024, "floor_ms": 0.005,
            "backends": {"inductor": {"step_ms": 0.02, **tl}, "fusekit": {"error": "no CUDA graph"}}}]
    md = step_profile.markdown(res, {"device": "X", "torch": "t", "transformers": "t", "copy_gbps": 1000.0})
    assert "| llama | 1 | 1024 | inductor | 0.020 | 25% | 3 | 1.0 | 11 | 6 |" in md and "no CUDA graph" in md
    step_profile.plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="not a decoder"):
        cli.main(["profile", "--phase", "decode", "--model", "bert,llama"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a GPU"):
            cli.main(["profile", "--phase", "decode"])


@pytest.mark.slow
def test_prefill_bench_runs_the_model_quantized_by_torchao(monkeypatch):
    """`fusekit bench --phase prefill --quant Q`: every mode runs the model after torchao's quantize_ (its linears'
    weights torchao tensors, not parameters), and the table names the configuration (CPU: tiny Llama, eager and
    fusekit's references)."""
    pytest.importorskip("torchao")
    from fusion_backend.tools import e2e

    seen = []
    real = models.quantize

    def quantize(model, quant):
        real(model, quant)
        seen.append((quant, type(model.model.layers[0].mlp.down_proj.weight).__name__))

    monkeypatch.setattr(models, "quantize", quantize)
    res = e2e.run_model("llama", ("eager", "fusekit"), "cpu", log=lambda s: None, quant="int8-weight-only")
    assert seen and seen[0][0] == "int8-weight-only" and seen[0][1] != "Parameter", seen
    assert res["quant"] == "int8-weight-only"
    assert res["modes"]["fusekit"]["max_rel_err_vs_eager"] < 1e-3, res["modes"]["fusekit"]
    md = e2e.markdown([res], {**e2e.environment(), "quant": "int8-weight-only", "torchao": "0.18.0"})
    assert "| llama (int8-weight-only) |" in md and "Int8WeightOnlyConfig" in md, md


def test_prefill_bench_passes_enabled_rules_to_fusekit(monkeypatch):
    """fusekit bench --enable reaches the prefill phase's fusekit modes as options={'enable': [...]} (an opt-in rule
    timed end to end), and the table says so; the other modes are compiled without fusekit."""
    from fusion_backend.tools import e2e

    seen = []
    monkeypatch.setattr(e2e, "fusekit_backend", lambda mode=None, options=None: seen.append((mode, options)) or "eager")
    model = torch.nn.Linear(4, 4)
    for mode in ("fusekit", "fusekit-ro", "inductor"):
        e2e._compiled(mode, model, False, ("quantize.silu_mul_fp8_rows",))
    assert seen == [(None, {"enable": ["quantize.silu_mul_fp8_rows"]}),
                    ("reduce-overhead", {"enable": ["quantize.silu_mul_fp8_rows"]})], seen
    md = e2e.markdown([], {**e2e.environment(), "enable": ["quantize.silu_mul_fp8_rows"]})
    assert "options={'enable': ['quantize.silu_mul_fp8_rows']}" in md, md


def test_prefill_speedups_compare_graphs_with_graphs():
    """fusekit bench's prefill table: fusekit-ro (CUDA graphs) is timed against inductor-ro (Inductor's CUDA graphs)
    where that mode ran, against plain Inductor otherwise; the other modes, inductor-ro too, against plain Inductor."""
    from fusion_backend.tools import e2e

    modes = {"eager": {"ms": 8.0}, "inductor": {"ms": 4.0}, "inductor-ro": {"ms": 2.0}, "fusekit": {"ms": 2.0},
             "fusekit-ro": {"ms": 1.0}}
    e2e.speedups(modes)
    # fusekit-ro: inductor-ro's 2.0 / its 1.0
    assert {m: r["vs_inductor"] for m, r in modes.items()} == {
        "eager": 0.5, "inductor": 1.0, "inductor-ro": 2.0, "fusekit": 2.0, "fusekit-ro": 2.0}
    assert modes["fusekit-ro"]["vs_eager"] == 8.0
    del modes["inductor-ro"]
    e2e.speedups(modes)
    assert modes["fusekit-ro"]["vs_inductor"] == 4.0
    assert [m for m in e2e.MODES if e2e.graphed(m)] == ["inductor-ro", "fusekit-ro"]

"""The `fusekit` command on CPU (tiny configurations): every subcommand runs and writes what it says."""
import json
import os
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


def test_explain_named_model(capsys):
    assert cli.main(["explain", "--model", "llama", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "elementwise.silu_mul      2" in out or "elementwise.silu_mul" in out
    # silu_mul x2 and, at 64 rows (batch 2 x 32 tokens: within decode_gemm.qkv's 64), qkv x2
    assert "4 site(s) fused" in out and "decode_gemm.qkv               2" in out


@pytest.mark.slow
def test_bench_tiny_cpu_writes_table_json_plot(tmp_path, capsys):
    assert cli.main(["bench", "--phase", "prefill", "--models", "gpt2,bert", "--cpu", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["model"] for r in data["results"]] == ["gpt2", "bert"]
    for r in data["results"]:
        assert set(r["modes"]) == {"eager", "inductor", "fusekit"}  # CUDA graphs mode needs a GPU
        fk = r["modes"]["fusekit"]
        assert fk["sites"] and fk["errors"] == 0
        assert fk["max_rel_err_vs_eager"] < 1e-5 and fk["ms"] > 0 and fk["tokens_per_s"] > 0
    assert "| gpt2 | float32 | 2x32 | inference | fusekit |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert not (tmp_path / "decode.json").exists()


@pytest.mark.slow
def test_bench_decode_tiny_cpu_writes_table_json_plot(tmp_path):
    assert cli.main(["bench", "--phase", "decode", "--models", "llama,bert", "--cpu", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "decode.json").read_text())
    assert [r["model"] for r in data["steps"]] == ["llama"]  # an encoder has no decode step
    step = data["steps"][0]
    assert step["backends"]["fusekit"]["sites"]["decode.gqa"] == 2  # one per layer
    assert step["compiled_while_timed"] == 0  # the backends' steps live side by side: no recompile is timed
    assert all(len(row["fusekit_range"]) == 2 for row in step["positions"].values())
    assert step["fusekit_vs_inductor_max_abs"] < 1e-4
    for row in step["positions"].values():
        assert row["eager"] > 0 and row["inductor"] > 0 and row["fusekit"] > 0 and row["speedup"] > 0
    assert "| llama | 2 |" in (tmp_path / "decode.md").read_text()
    assert (tmp_path / "decode.png").stat().st_size > 1000


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

"""patterns/ ships inside the package as fusion_backend.patterns (and csrc/ as fusion_backend.csrc), in
the editable install under test and in a built wheel."""
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_installed_package_resolves_top_level_patterns():
    import fusion_backend.patterns as pats
    from fusion_backend import _ext

    # editable install: fusion_backend.patterns is the checkout's top-level patterns/ folder
    assert pathlib.Path(pats.__file__).resolve().parent in (ROOT / "patterns", ) or \
        "site-packages" in pats.__file__
    assert {"elementwise", "quantize", "batched_matmul"} <= {
        p.stem for p in pathlib.Path(pats.__file__).parent.glob("*.py")}
    assert _ext.csrc_dir() is not None and any(_ext.csrc_dir().glob("*/*.cu"))


@pytest.mark.slow
def test_build_module_runs_from_a_checkout_not_yet_installed():
    """setup.py runs `python -m fusion_backend.build --patterns-only` from the checkout before pip has installed
    it (no mapping of fusion_backend.patterns yet): the package must import, and the build find the tables."""
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', '')]; "
            "import fusion_backend.build as b; b._tables_from_checkout(); from fusion_backend import table; "
            "print(len(table.all_patterns()))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) > 40


@pytest.mark.slow
@pytest.mark.packaging
def test_wheel_contains_patterns_and_csrc(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    names = zipfile.ZipFile(next(tmp_path.glob("fusekit-*.whl"))).namelist()
    for f in ("fusion_backend/patterns/__init__.py", "fusion_backend/patterns/elementwise.py",
              "fusion_backend/patterns/quantize.py", "fusion_backend/patterns/batched_matmul.py",
              "fusion_backend/backend.py", "fusion_backend/tools/cli.py", "fusion_backend/tools/decode_bench.py"):
        assert f in names, names
    kernels = {f"fusion_backend/csrc/{p.relative_to(ROOT / 'csrc').as_posix()}" for p in (ROOT / "csrc").rglob("*")
               if p.suffix in (".cu", ".cuh", ".h")}
    assert any(k.endswith("/decode/decode_attention.cu") for k in kernels)
    assert kernels <= set(names), sorted(kernels - set(names))  # every kernel and header, in its family folder
    assert not any(n.startswith("patterns/") for n in names), "patterns must not be a top-level package"
    ep = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(next(tmp_path.glob("fusekit-*.whl"))).read(ep).decode()
    assert "[torch_dynamo_backends]" in text and "fusekit = fusion_backend.backend:fusekit" in text
    assert "fusekit = fusion_backend.tools.cli:main" in text


def test_a_cpu_install_pulls_no_cuda_only_packages():
    """A plain install needs torch alone; what only a kernel build uses (ninja, the CUTLASS headers, whose wheel
    pulls cuda-python, scipy, pydot, treelib) comes with the `cuda` extra."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]] == ["torch"]
    cuda = " ".join(project["optional-dependencies"]["cuda"])
    assert "nvidia-cutlass" in cuda and "ninja" in cuda
    assert not any("cutlass" in d or "cuda" in d for k, ds in project["optional-dependencies"].items()
                   if k != "cuda" for d in ds)


def _fake_cutlass(root: pathlib.Path, version: str) -> pathlib.Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "cutlass.h").write_text("// fake\n")
    (root / "include" / "cutlass" / "version.h").write_text(f"#define CUTLASS_VERSION {version}\n")
    return root


def test_kernel_build_folder_names_the_cutlass_version_not_its_path(tmp_path, monkeypatch):
    """A kernel build made in one environment (a CPU machine's venv with the GPU machine's torch) is found in
    another: the build's folder depends on the CUTLASS headers' version, not on where they are installed."""
    from fusion_backend import _ext

    root = _ext.csrc_dir()
    monkeypatch.setenv("FUSEKIT_CACHE", str(tmp_path / "cache"))
    names = {}
    for where, version in (("a", "420"), ("b", "420"), ("c", "430")):
        monkeypatch.setenv("CUTLASS_PATH", str(_fake_cutlass(tmp_path / where, version)))
        assert _ext.cutlass_include()[0] == str(tmp_path / where / "include")
        names[where] = _ext.build_dir(root, "9.0a").name
    assert names["a"] == names["b"]
    assert names["a"] != names["c"]

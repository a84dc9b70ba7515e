"""Everything is declared in pyproject.toml; this file adds one step: where the install can build CUDA
kernels (`pip install --no-build-isolation`, a CUDA build of torch, nvcc, a GPU or FUSEKIT_CUDA_ARCH), it
builds csrc/ into fusekit's kernel cache (fusion_backend/_ext.py, the same build a first compile would
otherwise start) and, with a GPU, traces every rule's search patterns into the pattern cache
(`python -m fusion_backend.build`), so that no compile waits for either. Anywhere else (a CPU-only torch, no toolkit, build isolation, or
FUSEKIT_BUILD_EXT=0) the install is pure Python and the kernels build on first use.
"""
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent
BUILDS = {"bdist_wheel", "editable_wheel", "install", "develop"}  # not metadata-only runs (egg_info, dist_info)


def _build_kernels() -> None:
    if os.environ.get("FUSEKIT_BUILD_EXT", "auto") == "0" or not BUILDS & set(sys.argv[1:]):
        return
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return  # build isolation: torch is not importable here
    if not torch.version.cuda or CUDA_HOME is None:
        print("fusekit: no CUDA build of torch or no CUDA toolkit: kernels build on first use", flush=True)
        return
    arch = os.environ.get("FUSEKIT_CUDA_ARCH")
    if arch is None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "")
    if arch is None:
        print("fusekit: no GPU and no FUSEKIT_CUDA_ARCH: kernels build on first use", flush=True)
        return
    spec = importlib.util.spec_from_file_location("_fusekit_ext", ROOT / "fusion_backend" / "_ext.py")
    ext = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
    spec.loader.exec_module(ext)  # (the package itself cannot be imported before it is installed)
    if (sys.platform == "linux" and os.uname().machine == "x86_64" and arch == "9.0a"
            and not ext.cutlass_include()):
        # pip builds this package before it installs its extras: nvidia-cutlass (the `cuda` extra) is not there
        # yet, and a build without it would be replaced at first use by one with it
        print("fusekit: the CUTLASS headers are not installed yet (the `cuda` extra installs them after this "
              "build): kernels build on first use or with `python -m fusion_backend.build`", flush=True)
        return
    try:
        print(f"fusekit: {ext.build(arch, root=ROOT / 'csrc')} (kernels for sm_{arch})", flush=True)
    except Exception as exc:  # noqa: BLE001 - a failed build must not fail the install
        print(f"fusekit: kernel build failed ({type(exc).__name__}: {exc}); they build on first use", flush=True)
    if torch.cuda.is_available():
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "fusion_backend.build", "--patterns-only"], cwd=ROOT,
                           capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [r.stderr.strip()[-300:]])[-1]
        print(f"fusekit: patterns {'traced' if r.returncode == 0 else 'not traced'} ({time.time() - t0:.0f} s): "
              f"{last}", flush=True)


_build_kernels()
setup()

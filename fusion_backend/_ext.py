"""Build, cache and load the CUDA kernels in csrc/ (``fusekit_cuda``): one ``csrc/<family>/<op>.cu`` per op,
in a folder named after its pattern family, and the headers they share at the top (``checks.h``, ``launch.cuh``, ...).

Built at install time where the install can (setup.py: ``pip install --no-build-isolation`` with a CUDA
build of torch and nvcc), ahead of time with ``python -m fusion_backend.build``, else on first use, with
ninja through ``torch.utils.cpp_extension.load``, into
``$FUSEKIT_CACHE`` (default ``~/.cache/fusekit``) ``/torch<ver>-cu<ver>-sm<arch>-<hash>``, where the hash
covers every source, the flags, torch's and CUDA's versions and the arch. A cached build is loaded with
``torch.ops.load_library`` and never compiled again. Where there is no GPU, no toolkit, or the build
fails, nothing is raised: CUDA patterns simply do not fire, and ``status()`` says why.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import pathlib
import sys
import threading
import time

import torch

NAME = "fusekit_cuda"
# The build the rules' CUDA selection is stated for where no GPU is present (doctor, CPU reports): an H100/H200's,
# whose sm_90a kernels are the ones the measured selection was made with.
REFERENCE_ARCH = "9.0a"
CXX_FLAGS = ["-O3"]  # the C++ standard is torch's choice (2.14 needs C++20)
# No --use_fast_math: quantize kernels must round exactly as eager PyTorch does.
CUDA_FLAGS = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
_LOCK = threading.Lock()


@dataclasses.dataclass
class Status:
    loaded: bool
    reason: str
    path: str | None = None
    arch: str | None = None


_status: Status | None = None


def csrc_dir() -> pathlib.Path | None:
    """csrc/ ships as fusion_backend.csrc in wheels and maps to the checkout's csrc/ when editable."""
    spec = importlib.util.find_spec("fusion_backend.csrc")
    roots = list(spec.submodule_search_locations or []) if spec else []
    roots.append(str(pathlib.Path(__file__).resolve().parent.parent / "csrc"))
    for r in roots:
        if any(pathlib.Path(r).glob("*/*.cu")):
            return pathlib.Path(r)
    return None


def arch_flags(arch: str) -> list[str]:
    """'9.0a' -> -gencode=arch=compute_90a,code=sm_90a (wgmma needs the 'a' target), and FUSEKIT_SM90A defined
    for the host code that picks kernels built only for it."""
    num = arch.replace(".", "")
    return [f"-gencode=arch=compute_{num},code=sm_{num}", *(["-DFUSEKIT_SM90A"] if arch == "9.0a" else [])]


def device_arch(device: int | None = None) -> str:
    env = os.environ.get("FUSEKIT_CUDA_ARCH")
    if env:
        return env
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "")


# A kernel file that needs more than the CUDA toolkit says so in a "// fusekit-build:" line: "cutlass" (the
# CUTLASS/CuTe headers) and "sm_90a" (wgmma/TMA: compiled only for that arch). Elsewhere it is left out
# of the build; its op then has no CUDA kernel and its patterns stay with Inductor.
def requirements(src: pathlib.Path) -> set[str]:
    for line in src.read_text().splitlines()[:40]:
        if line.startswith("// fusekit-build:"):
            return set(line.split(":", 1)[1].split())
    return set()


def cutlass_include() -> list[str]:
    """CUTLASS's include dirs: $CUTLASS_PATH (a CUTLASS checkout) or the nvidia-cutlass wheel's copy
    (the `cuda` extra); [] when neither exists."""
    roots = []
    if os.environ.get("CUTLASS_PATH"):
        roots.append(pathlib.Path(os.environ["CUTLASS_PATH"]))
    spec = importlib.util.find_spec("cutlass_library")
    if spec and spec.submodule_search_locations:
        roots.append(pathlib.Path(list(spec.submodule_search_locations)[0]) / "source")
    for r in roots:
        if (r / "include" / "cutlass" / "cutlass.h").exists():
            return [str(r / "include"), str(r / "tools" / "util" / "include")]
    return []


def skip_reason(src: pathlib.Path, arch: str) -> str | None:
    """Why `src` cannot be built for `arch` here, or None ("any": every file counts, for the build id)."""
    if arch == "any":
        return None
    need = requirements(src)
    if "cutlass" in need and not cutlass_include():
        return "needs the CUTLASS headers (pip install \"fusekit[cuda]\", or nvidia-cutlass)"
    if "sm_90a" in need and arch != "9.0a":
        return f"sm_90a only (device is sm_{arch})"
    return None


def kernel_files(root: pathlib.Path) -> list[pathlib.Path]:
    """csrc/<family>/*.cu, sorted."""
    return sorted(root.glob("*/*.cu"))


def sources(root: pathlib.Path, arch: str = "any") -> list[pathlib.Path]:
    """The kernel files that can be built for `arch` here."""
    return [f for f in kernel_files(root) if skip_reason(f, arch) is None]


def skipped(arch: str, root: pathlib.Path | None = None) -> dict[str, str]:
    """{kernel file, as family/op.cu: why it is not built for `arch`}."""
    root = root or csrc_dir()
    if root is None:
        return {}
    return {f.relative_to(root).as_posix(): why for f in kernel_files(root) if (why := skip_reason(f, arch))}


def build_dir(root: pathlib.Path, arch: str) -> pathlib.Path:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".cu", ".h", ".cuh")):
        h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    h.update(repr((CXX_FLAGS, CUDA_FLAGS, torch.__version__, torch.version.cuda, arch,
                   [f.relative_to(root).as_posix() for f in sources(root, arch)])).encode())
    # the CUTLASS headers by their version, not their path: a build made in one environment (a CPU machine's venv
    # with the GPU machine's torch) is found in another
    inc = cutlass_include()
    h.update((pathlib.Path(inc[0]) / "cutlass" / "version.h").read_bytes() if inc else b"no-cutlass")
    cache = pathlib.Path(os.environ.get("FUSEKIT_CACHE", "~/.cache/fusekit")).expanduser()
    return cache / f"torch{torch.__version__}-cu{torch.version.cuda}-sm{arch}-{h.hexdigest()[:16]}"


def build(arch: str, verbose: bool = False, root: pathlib.Path | None = None) -> pathlib.Path:
    """Compile csrc/ (or `root`) for `arch` (no GPU needed) and return the shared library's path."""
    from torch.utils.cpp_extension import load

    root = root or csrc_dir()
    if root is None:
        raise FileNotFoundError("fusekit: csrc/ with *.cu sources not found")
    bd = build_dir(root, arch)
    so = bd / f"{NAME}.so"
    if so.exists():
        return so
    bd.mkdir(parents=True, exist_ok=True)
    lock = bd / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > 600:
        # torch < 2.14 waits forever on the lock file a killed build leaves behind
        print(f"fusekit: removing stale build lock {lock}", file=sys.stderr)
        lock.unlink(missing_ok=True)
    os.environ.setdefault("MAX_JOBS", str(min(8, os.cpu_count() or 1)))
    t0 = time.time()
    print(f"fusekit: building CUDA kernels for sm_{arch.replace('.', '')} into {bd} "
          f"(once per torch/CUDA/arch/source version; 3 minutes on 16 cores with CUTLASS, "
          f"`pip install --no-build-isolation` or `python -m fusion_backend.build` does it ahead of time)",
          file=sys.stderr, flush=True)
    for name, why in skipped(arch, root).items():
        print(f"fusekit: not building {name}: {why}", file=sys.stderr)
    load(name=NAME, sources=[str(s) for s in sources(root, arch)], build_directory=str(bd),
         extra_cflags=CXX_FLAGS, extra_cuda_cflags=[*CUDA_FLAGS, *arch_flags(arch)],
         extra_include_paths=[str(root), *cutlass_include()], is_python_module=False, verbose=verbose)
    print(f"fusekit: built in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return so


def load_for_device() -> Status:
    """Load (building if needed) the kernels for the current GPU; cached per process."""
    global _status
    with _LOCK:
        if _status is None:
            _status = _load()
        return _status


def _load() -> Status:
    if os.environ.get("FUSEKIT_DISABLE_EXT"):
        return Status(False, "disabled by FUSEKIT_DISABLE_EXT")
    if not (torch.version.cuda and torch.cuda.is_available()):
        return Status(False, "no CUDA device (or a CPU build of torch)")
    if csrc_dir() is None:
        return Status(False, "csrc/ sources not found")
    arch = device_arch()
    try:
        so = build(arch, verbose=bool(os.environ.get("FUSEKIT_VERBOSE_BUILD")))
        torch.ops.load_library(str(so))
    except Exception as exc:  # noqa: BLE001 - a failed build disables CUDA patterns, nothing more
        print(f"fusekit: CUDA kernels unavailable ({type(exc).__name__}: {str(exc)[:300]}); "
              f"CUDA patterns will not fire", file=sys.stderr)
        return Status(False, f"build/load failed: {type(exc).__name__}: {exc}", arch=arch)
    return Status(True, "loaded", str(so), arch)


def has_cuda_kernel(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"fusekit::{op}", "CUDA")


def missing_cuda_kernel(op: str, device: torch.device) -> str | None:
    """None when fusekit::op can run on `device`, else the reason it cannot."""
    st = load_for_device()
    if not st.loaded:
        return f"CUDA kernels not available: {st.reason}"
    if device_arch(device.index) != st.arch:
        return f"kernels built for sm_{st.arch}, device is sm_{device_arch(device.index)}"
    if not has_cuda_kernel(op):
        why = next(((f, w) for f, w in skipped(st.arch or "any").items() if f.endswith(f"/{op}.cu")), None)
        return f"fusekit::{op} has no CUDA kernel" + (f" here: {why[0]} {why[1]}" if why else " yet")
    return None


def kernel_arch(op: str, device: torch.device) -> str | None:
    """The arch ("9.0a", "8.0", ...) of the loaded build that runs fusekit::op on `device`, or None where the op has
    no CUDA kernel there. Rules whose measured limits depend on which kernels a build holds (an sm_90a-only kernel)
    read it."""
    if device.type != "cuda" or missing_cuda_kernel(op, device) is not None:
        return None
    return load_for_device().arch


def loaded_state() -> str:
    """What this process can run on CUDA (part of the pass's cache key): a graph compiled where the kernels
    loaded, with or without the CUTLASS ones, is not reused where they did not."""
    st = _status
    # the library's path names its build, whose hash covers the files built and the CUTLASS headers used
    return st.path if st is not None and st.loaded else "no-cuda-kernels"


def build_id() -> str:
    """Identifies the kernels a compiled graph may call (part of the pass's cache key)."""
    root = csrc_dir()
    if root is None:
        return "no-csrc"
    return build_dir(root, "any").name.rsplit("-", 1)[-1]

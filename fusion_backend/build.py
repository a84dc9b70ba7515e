"""``python -m fusion_backend.build [--arch 9.0a] [--patterns-only]``: everything a first compile would
otherwise do once, ahead of time: build (or find cached) the CUDA kernels, and trace every rule's search
patterns for this machine's devices into the disk cache. Kernels need no GPU when --arch is given."""
import argparse
import importlib
import pathlib
import sys
import time
from collections.abc import Iterable

import torch

from . import _ext


def _tables_from_checkout() -> None:
    """Run from a source checkout before it is installed (setup.py), fusion_backend.patterns is the checkout's
    top-level patterns/ folder (the install maps it so)."""
    try:
        importlib.import_module("fusion_backend.patterns")
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
        sys.modules["fusion_backend.patterns"] = importlib.import_module("patterns")


def trace_patterns(devices: list[str], dtypes: Iterable[torch.dtype] | None = None) -> int:
    """Trace (or load) every rule in every dtype (or those of `dtypes`) on `devices`; returns the number of search
    forms."""
    from . import forms, table

    return sum(len(forms.search_forms(p, dt, dev))
               for dev in devices for p in table.all_patterns() for dt in p.dtypes if dtypes is None or dt in dtypes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", help="e.g. 9.0a (H100/H200), 8.0 (A100); default: this machine's GPU")
    ap.add_argument("--patterns-only", action="store_true", help="trace the patterns, build no kernels")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if not a.patterns_only:
        if a.arch is None and not torch.cuda.is_available():
            sys.exit("fusekit: no GPU here; pass --arch (e.g. --arch 9.0a) to build for one, or --patterns-only")
        so = _ext.build(a.arch or _ext.device_arch(), verbose=a.verbose)
        print(f"fusekit: kernels at {so}")
    if a.arch is None:  # patterns are traced for the devices of this machine
        _tables_from_checkout()
        from .forms import cache_dir

        t0 = time.perf_counter()
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        n = trace_patterns(devices)
        print(f"fusekit: {n} search patterns for {'+'.join(devices)} at {cache_dir()} "
              f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

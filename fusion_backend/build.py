"""``python -m fusion_backend.build [--arch 9.0a]``: build (or find cached) the CUDA kernels ahead of
time, so no compile ever happens inside a timed region. Needs no GPU when --arch is given."""
import argparse
import sys

import torch

from . import _ext


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", help="e.g. 9.0a (H100/H200), 8.0 (A100); default: this machine's GPU")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if a.arch is None and not torch.cuda.is_available():
        sys.exit("fusekit: no GPU here; pass --arch (e.g. --arch 9.0a) to build for one")
    so = _ext.build(a.arch or _ext.device_arch(), verbose=a.verbose)
    print(f"fusekit: kernels at {so}")


if __name__ == "__main__":
    main()

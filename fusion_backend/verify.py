"""options={"verify": True}: each rewritten site checks its fused result against the pattern's eager
reference on its first call, within the pattern's tolerance, and raises if it is out of tolerance."""
from __future__ import annotations

import torch

from . import table


class FusekitVerificationError(RuntimeError):
    """A fused site disagreed with its pattern's reference."""


_checked: set[tuple[str, str]] = set()


def _verify(outs, tensors, floats, pattern, site):
    if (pattern, site) not in _checked:
        p = table.by_id(pattern)
        args = [t if t is not None else _scalar(p, i, f) for i, (t, f) in enumerate(zip(tensors, floats))]
        ref = p.eager(*args)
        refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        for i, (o, r) in enumerate(zip(outs, refs)):
            _compare(p, site, i, o, r)
        _checked.add((pattern, site))
    return [o.clone() for o in outs]


def _scalar(p, i, f):
    kind = dict(p.params)[p.arg_names[i]]
    return int(f) if kind == "int" else f


def _compare(p, site, i, out, ref):
    where = f"fusekit verify: pattern {p.id!r} at site {site!r}, output {i}"
    if out.shape != ref.shape or out.dtype != ref.dtype:
        raise FusekitVerificationError(f"{where}: got {tuple(out.shape)} {out.dtype}, reference "
                                       f"{tuple(ref.shape)} {ref.dtype}")
    atol, rtol = p.tol.get(ref.dtype, (0.0, 0.0)) if ref.is_floating_point() else (0.0, 0.0)
    if not torch.allclose(out.double(), ref.double(), atol=atol, rtol=rtol, equal_nan=True):
        err = (out.double() - ref.double()).abs().nan_to_num(float("inf")).max().item()
        raise FusekitVerificationError(f"{where}: max abs error {err:.3g} exceeds atol={atol}, "
                                       f"rtol={rtol} against the eager reference")


for _dev in ("CPU", "CUDA"):
    torch.library.impl("fusekit::verify", _dev)(_verify)

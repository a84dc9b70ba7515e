"""fusekit: a torch.compile backend that is Inductor plus pattern-matched, prebuilt CUDA fused kernels.

    torch.compile(model, backend="fusekit")      # found through the torch_dynamo_backends entry point
    print(fusion_backend.explain(model, x))      # what fused, what nearly did and why
"""
from . import ops  # noqa: F401 - defines torch.ops.fusekit.*
from . import collectives  # noqa: F401 - defines torch.ops.fusekit.all_reduce_one_shot
from . import kv_cache  # noqa: F401 - the window-roll rewrite (its ops are defined in ops.py)
from .backend import backend, fusekit
from .report import Report, explain, report
from .verify import FusekitVerificationError

__version__ = "0.1.0"


def register() -> None:
    """Register backend="fusekit" by hand; only needed when running from a source tree that was
    never pip-installed (an installed package registers through its entry point)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "fusekit" not in _COMPILER_FNS:
        register_backend(fusekit, name="fusekit")


__all__ = ["FusekitVerificationError", "Report", "backend", "explain", "fusekit", "register", "report"]

"""The ``fusekit`` torch.compile backend: Inductor, plus fusekit's pass as ``post_grad_custom_post_pass``.

    torch.compile(model, backend="fusekit")                                  # entry point, no import
    torch.compile(model, backend="fusekit", mode="reduce-overhead")
    torch.compile(model, backend="fusekit", options={"cpu_reference": True, "max_autotune": True})
    torch.compile(model, backend=fusion_backend.backend(mode="reduce-overhead", options={...}))

torch.compile refuses ``mode`` and ``options`` together, so fusekit also takes ``options={"mode": ...}``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Mapping

import torch

from .options import parse as split_options  # (mode, options) -> (Options, Inductor's config patches)

log = logging.getLogger("fusion_backend")


def fusekit(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
            options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The backend function torch.compile calls (registered under the `torch_dynamo_backends`
    entry point, so it is deliberately not decorated with @register_backend)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from . import ops, table  # noqa: F401 - schemas must exist before any (cached) graph calls them
    from .passes import FusekitPass, inductor_config_value

    # A graph Inductor finds in its cache calls fusekit's ops without this pass running, so the kernels
    # must be loaded before the lookup (else: "Could not run 'fusekit::matmul_epilogue' with arguments from the
    # 'CUDA' backend" in a new process with a warm cache).
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs):
        from . import _ext

        _ext.load_for_device()
    fk, patches = split_options(mode, options)
    # The Inductor settings families declare (registry.InductorSettings) for the device: the pass sets them where
    # the family fired; the patch holds each key at its current value, so that it goes back after the compile. A
    # key the user set is left alone, as is one this torch lacks.
    capability = _cuda_capability(example_inputs)
    offered = []
    for family, settings in table.inductor_settings().items():
        if capability is None or capability < settings.min_capability:
            continue
        keys = tuple(k for k in settings.config if k not in patches and inductor_config_value(k) is not None)
        if keys:
            offered.append((family, keys))
            patches.update({k: inductor_config_value(k) for k in keys})
    fk = dataclasses.replace(fk, inductor=tuple(offered))
    user_post = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = fk_pass = FusekitPass(fk, user_post)
    try:
        return compile_fx(gm, example_inputs, config_patches=patches)
    except Exception as exc:
        # A family's settings were measured on the graphs its benchmarks compile; where Inductor fails with them,
        # the graph compiles again without them rather than fail the user's torch.compile. (Dynamo's own
        # control-flow exceptions, e.g. a restart of the analysis, and failures without those settings propagate.)
        control = tuple(getattr(torch._dynamo.exc, n) for n in ("RestartAnalysis", "SkipFrame", "ResetRequired")
                        if hasattr(torch._dynamo.exc, n))
        if not fk_pass.inductor_set or isinstance(exc, control):
            raise
        log.warning("fusekit: Inductor failed with the settings %s (%s: %s); compiling without them",
                    fk_pass.inductor_set, type(exc).__name__, exc)
        dropped = {k for _, keys in fk.inductor for k in keys}
        patches = {k: v for k, v in patches.items() if k not in dropped}
        patches["post_grad_custom_post_pass"] = FusekitPass(dataclasses.replace(fk, inductor=()), user_post)
        return compile_fx(gm, example_inputs, config_patches=patches)


def _cuda_capability(example_inputs: list[Any]) -> tuple[int, int] | None:
    """The compute capability of the CUDA GPU the graph runs on (None: not CUDA, or ROCm)."""
    dev = next((t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if dev is None or torch.version.hip is not None or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(dev))


def backend(mode: str | None = None, options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A configured backend callable, for `torch.compile(m, backend=fusion_backend.backend(...))`."""
    split_options(mode, options)  # fail early on bad options
    return functools.partial(fusekit, mode=mode, options=dict(options or {}))

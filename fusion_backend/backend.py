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

log = logging.getLogger("fusion_backend")


def _as_names(v: Any, key: str) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise TypeError(f"fusekit: options[{key!r}] must be a pattern id, a family or a list of them")


def split_options(mode: str | None, options: Mapping[str, Any] | None):
    """-> (FusekitOptions, Inductor config patches)."""
    from torch._inductor import list_mode_options

    from . import table
    from .passes import FusekitOptions

    opts = dict(options or {})
    opt_mode = opts.pop("mode", None)
    if opt_mode is not None and mode is not None and opt_mode != mode:
        raise ValueError(f"fusekit: mode={mode!r} and options['mode']={opt_mode!r} disagree")
    mode = mode or opt_mode
    patterns = opts.pop("patterns", None)
    disable = opts.pop("disable", ())
    named = None if patterns is None else _as_names(patterns, "patterns")
    fk = FusekitOptions(
        patterns=table.select(named, _as_names(disable, "disable") if disable else ()),
        forced=table.select(named) if named is not None else (),
        cpu_reference=bool(opts.pop("cpu_reference", False)),
        verify=bool(opts.pop("verify", False)),
        report=bool(opts.pop("report", False)),
    )
    patches: dict[str, Any] = {}
    if mode not in (None, "default"):
        try:
            patches.update(list_mode_options(mode))  # Inductor's own table and its error
        except KeyError:
            raise RuntimeError(f"Unrecognized mode={mode}") from None
    patches.update(opts)  # everything else is Inductor's, unchanged
    return fk, patches


def fusekit(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
            options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The backend function torch.compile calls (registered under the `torch_dynamo_backends`
    entry point, so it is deliberately not decorated with @register_backend)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from . import ops  # noqa: F401 - schemas must exist before any (cached) graph calls them
    from .passes import DECODE_INDUCTOR, FusekitPass, inductor_config_value

    # A graph Inductor finds in its cache calls fusekit's ops without this pass running, so the kernels
    # must be loaded before the lookup (seen on an H200: a warm cache, a new process, "Could not run
    # 'fusekit::matmul_epilogue' with arguments from the 'CUDA' backend").
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs):
        from . import _ext

        _ext.load_for_device()
    fk, patches = split_options(mode, options)
    if _hopper_or_newer(example_inputs):
        # Inductor's settings for graphs where a decode attention rule fires (passes.DECODE_INDUCTOR says which and
        # why): the pass sets them; the patch holds each key at its current value, so that it goes back after the
        # compile. A key the user set (options={"combo_kernels": ...}) is left alone, as is one this torch lacks.
        keys = tuple(k for k in DECODE_INDUCTOR if k not in patches and inductor_config_value(k) is not None)
        patches.update({k: inductor_config_value(k) for k in keys})
        fk = dataclasses.replace(fk, inductor_decode=keys)
    user_post = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = fk_pass = FusekitPass(fk, user_post)
    try:
        return compile_fx(gm, example_inputs, config_patches=patches)
    except Exception as exc:
        # Inductor's decode settings were measured on the graphs the benchmarks compile; where Inductor fails with
        # them, the graph compiles again without them rather than fail the user's torch.compile. (Dynamo's own
        # control-flow exceptions, e.g. a restart of the analysis, and failures without those settings propagate.)
        control = tuple(getattr(torch._dynamo.exc, n) for n in ("RestartAnalysis", "SkipFrame", "ResetRequired")
                        if hasattr(torch._dynamo.exc, n))
        if not fk_pass.decode_inductor_set or isinstance(exc, control):
            raise
        log.warning("fusekit: Inductor failed with its decode settings %s (%s: %s); compiling without them",
                    list(fk.inductor_decode), type(exc).__name__, exc)
        patches = {k: v for k, v in patches.items() if k not in fk.inductor_decode}
        patches["post_grad_custom_post_pass"] = FusekitPass(dataclasses.replace(fk, inductor_decode=()), user_post)
        return compile_fx(gm, example_inputs, config_patches=patches)


def _hopper_or_newer(example_inputs: list[Any]) -> bool:
    """Whether the graph runs on a CUDA GPU of compute capability 9.0 or later (not ROCm)."""
    dev = next((t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda), None)
    return (dev is not None and torch.version.hip is None and torch.cuda.is_available()
            and torch.cuda.get_device_capability(dev)[0] >= 9)


def backend(mode: str | None = None, options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A configured backend callable, for `torch.compile(m, backend=fusion_backend.backend(...))`."""
    split_options(mode, options)  # fail early on bad options
    return functools.partial(fusekit, mode=mode, options=dict(options or {}))

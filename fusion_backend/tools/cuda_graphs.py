"""One CUDA-graph capture for the benchmarks (bench --phase decode, benchmarks/bench_patterns.py) and the GPU tests."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Mapping

import torch


@contextlib.contextmanager
def environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    """Environment variables set (None: unset) for the block, restored after: fusekit's launch switches
    (FUSEKIT_PDL, FUSEKIT_DECODE_GEMM, ...) are read at each launch, so a graph keeps what its capture saw."""
    saved = {k: os.environ.get(k) for k in env or {}}
    try:
        for k, v in (env or {}).items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def capture(fn: Callable[[], Any], inner: int = 1) -> torch.cuda.CUDAGraph | None:
    """A CUDA graph of `inner` back-to-back calls of fn, warmed up off the default stream as
    torch.cuda.graphs asks and replayed 3 times, or None, with a note, where fn cannot be captured (eager
    Hugging Face code that syncs on the host, say)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
        for _ in range(3):
            g.replay()
        return g
    except Exception as e:  # noqa: BLE001 - the caller times call by call instead
        print(f"    (no CUDA graph: {type(e).__name__}: {str(e).splitlines()[0][:120]}; timed call by call)",
              flush=True)
        torch.cuda.synchronize()
        return None


def capture_output(fn: Callable[[], Any], env: Mapping[str, str | None] | None = None
                   ) -> tuple[torch.cuda.CUDAGraph | None, Any]:
    """(capture's graph of one call of fn, what that captured call returned: replays write it in place), or
    (None, None) where fn cannot be captured; warmed up and captured with `env` set (see environment)."""
    outs: list[Any] = []
    with environment(env):
        g = capture(lambda: outs.append(fn()))
    return (g, outs[-1]) if g is not None else (None, None)  # the last call is the captured one: replays run no Python

"""Prefill attention with grouped KV heads -> ``fusekit::gqa_attention``.

The chain of the decode rules, repeat_kv then SDPA, in a prompt: more than MAX_QUERY query rows (a prompt
against a static cache, a padded batch of prompts, chunked prefill). Inductor copies the whole cache per query
head before its fused SDPA kernel; the op hands PyTorch's cuDNN attention the KV heads as they are (PyTorch's
flash and memory-efficient kernels refuse grouped heads with a mask). The search patterns, inputs and checks
are the decode rules'; only the query length, the op and the kernel differ.

The attention alone (H100, torch 2.11, bf16, 16 query / 4 KV heads, D 128; results/h100_gqa_prefill_backends_
2026-11-24e.txt), Inductor's chain / cuDNN with grouped heads, us: 512-token prompt against 4096 slots 222 / 108
(batch 4: 285 / 214); 2048 against 4096 282 / 213; 128 rows at position 1024, batch 8, 424 / 117. In the
models (results/h100_prefill_cache_2026-11-24e.md), a 512-token prompt into 4096 slots: 1.03-1.06x Inductor's
whole forward. A prompt alone (keys = queries) lost in the models and is left to Inductor (prefill_inputs).
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true as known

from fusion_backend import guards as G
from fusion_backend.registry import FLOATS, Pattern

from .decode import GQA, MAX_QUERY, _bad, _forms, _inputs, cache_inputs, decode_attention_eager, decode_attention_ref

HEAD_DIMS = (64, 128)  # cuDNN's attention on sm_80/sm_90 at every torch version supported; 256 left to Inductor


def prefill_inputs(q: str, k: str, mask: str | None = None) -> G.Guard:
    """Should fire: more than MAX_QUERY query rows (fewer are the decode rules'), a cache at least twice as long
    as the prompt, head dim 64 or 128, and a mask that is bool or q's dtype (cuDNN takes the bias in q's dtype:
    a float32 mask would be rounded). A prompt alone (as many keys as queries) stays Inductor's: there the
    repeat copies little, and the op lost (H100, 4 x 512 tokens, Qwen2-style 0.96x, Llama-style 0.88x
    Inductor; results/h100_prefill_no_cache_2026-11-24e.md)."""
    def check(s: G.Site) -> str | None:
        t = s.tensor(q)
        lq, d, sk = t.shape[2], t.shape[3], s.tensor(k).shape[2]
        if not known(lq > MAX_QUERY):
            return f"{lq} query rows (<= {MAX_QUERY}): decode, not prefill"
        if not known(sk >= 2 * lq):
            return f"{sk} keys for {lq} query rows (< 2x): a prompt alone, Inductor's"
        if not any(known(d == x) for x in HEAD_DIMS):
            return f"head dim {d} is not one of {HEAD_DIMS}"
        if mask is not None and s.tensor(mask).dtype not in (torch.bool, t.dtype):
            return f"mask dtype {s.tensor(mask).dtype} is neither bool nor q's {t.dtype}"
        return None

    return G.Guard(f"prefill_inputs({q}, {k}{', ' + mask if mask else ''})", check)


def _cases(kind):  # (B, Hq, Hkv, Lq, S, D, mask): prompts against caches 2-3.5x as long, groups of 2 and 3
    # (MQA, one KV head, traces to another graph on the CPU: its CPU sites stay Inductor's; GPU_CASES call the op)
    return ((2, 4, 2, 17, 40, 64, kind), (1, 4, 2, 24, 48, 128, kind), (3, 6, 2, 20, 70, 64, kind))


# a 512-token prompt against 4096 slots, awkward lengths, MQA, batch 8 of a chunk at a later position
GPU_CASES = ((1, 16, 4, 512, 4096, 128), (2, 12, 2, 100, 333, 128), (3, 8, 1, 40, 40, 64), (8, 16, 4, 17, 1000, 64),
             (1, 32, 8, 257, 520, 128))


def _rule(what: str, kind: str, forms: bool, **kw) -> Pattern:
    masked = kind != "none"
    return Pattern(
        f"prefill.{what}", reference=decode_attention_ref, op="gqa_attention", inputs=_inputs, dtypes=FLOATS,
        trace="inductor", trace_case=(2, *GQA, 1, 6, 8, kind), cases=_cases(kind),  # decode's trace
        gpu_cases=tuple((*c, kind) for c in GPU_CASES), baseline=decode_attention_eager, literals=("scale",),
        bad_layout=_bad(_cases(kind)[0]), bad_reason="head dim", graph_forms=_forms(masked) if forms else (),
        guards=(cache_inputs("q", "k", "v", "mask" if masked else None), prefill_inputs("q", "k", "mask" if masked else None)),
        **kw)


# Grouped heads only: without them there is no copy to save (MHA prefill stays Inductor's).
PATTERNS = [
    _rule("gqa_bool_mask", "bool", forms=False),   # math decomposition with a bool mask
    _rule("gqa", "float", forms=True),             # additive mask: math, cuDNN, efficient, CPU flash
    _rule("gqa_no_mask", "none", forms=True, static={"mask": None}),
]

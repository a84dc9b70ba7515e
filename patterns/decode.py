"""Decode attention: a few query rows against a KV cache -> ``fusekit::decode_attention``.

Hugging Face decoders with grouped KV heads call ``repeat_kv`` before SDPA, which Inductor runs as a copy of
the whole cache (every slot, every query head: ``unsqueeze -> expand -> clone -> view``) followed by a fused
SDPA kernel that reads that copy, masked slots included. The op reads each KV head once for its query group
and skips every 64-slot block the mask hides (a static cache's empty tail, left padding, a sliding window).

The rules match the SDPA op Inductor's graph holds: the math decomposition (the reference, traced), and
PyTorch's fused ops (``graph_forms``: cuDNN and memory-efficient on CUDA, flash on CPU), with the repeat
(GQA/MQA) or without it (MHA, where the gain is the skipped blocks). A bool mask reaches a fused op already
converted to 0/-inf, so only the math form has a bool-mask rule of its own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true as known
from torch.nn.attention import SDPBackend, sdpa_kernel

from fusion_backend import guards as G
from fusion_backend.ops import window_roll_ref
from fusion_backend.registry import FLOATS, Fixtures, InductorSettings, Pattern, rand

aten = torch.ops.aten
MAX_QUERY = 16  # query rows per sequence the op takes by default (decode, speculative and chunked steps)
HEAD_DIMS = (64, 128, 256)
# Head dims the kernel runs in the next tile up (Phi-3's 96, StableLM's 80, ...), the columns past D neither read nor
# written: checked against float64 on a GPU (tests/test_kernels_gpu.py, tests/test_decode_gpu.py).
PADDED_HEAD_DIMS = (80, 96, 112, 160, 192)
# Without grouped heads there is no repeat_kv copy to save, only hidden blocks to skip; at few rows the op's
# extra launches cost more. H100, GPT-2 (12 heads, 1024 slots, position 128, CUDA graphs): batch 1 (12 rows)
# 0.94x Inductor, batch 32 (384 rows) 1.37x.
MHA_MIN_ROWS = 128

# Inductor settings for the rest of a compile whose graph a decode attention rule rewrote (sm_90+; the backend
# offers the keys the user did not set). Measured on an H100, the Llama-style decode step @1024 in a CUDA graph:
# - triton.enable_pdl: Inductor's Triton kernels launch with programmatic dependent launch, as fusekit's decode
#   kernels do, so each overlaps the tail of the kernel before: b1 0.611 -> 0.598 ms, b32 0.898 -> 0.896. Only
#   where the rule fired: Inductor's own step, whose repeat_kv copy and SDPA stay, went 7.19 -> 8.63 ms at b32.
# - combo_kernels: Inductor's independent small kernels (a layer's rotary embedding of q and of k with its cache
#   write, v's cache write, the cache-length updates) launched as one horizontal kernel: b32 0.868 -> 0.838 ms,
#   b1 0.577 -> 0.550, logits bit-identical.
# - combo_kernels_pointwise_only: reductions stay out of the combo kernels (with them in, layer 0's RMSNorm was
#   combined with other reductions into one 13.4 us kernel at b32, the RMSNorm alone ~2.6): b32 0.850 -> 0.841 ms.
INDUCTOR = InductorSettings({"triton.enable_pdl": True, "combo_kernels": True, "combo_kernels_pointwise_only": True},
                            min_capability=(9, 0))


def repeat_kv(x: Tensor, n: int) -> Tensor:
    """transformers' repeat_kv: [B, Hkv, S, D] -> [B, Hkv * n, S, D], each KV head n times in a row."""
    if n == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


@torch.fx.wrap  # a leaf for fx.symbolic_trace: the group size comes from shapes, known only when traced with tensors
def repeat_for(x: Tensor, q: Tensor) -> Tensor:
    """x's KV heads repeated to q's query heads; one KV head stays as it is: SDPA and matmul broadcast it themselves
    (Falcon-7B's multi-query attention, traced so by the decode.mqa_sdpa rules)."""
    return x if x.shape[1] == 1 else repeat_kv(x, q.shape[1] // x.shape[1])


def decode_attention_ref(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                         scale: float = 0.125) -> Tensor:
    with sdpa_kernel(SDPBackend.MATH):  # fully masked rows give 0, as SDPA's fused kernels do
        return F.scaled_dot_product_attention(q, repeat_for(k, q), repeat_for(v, q), attn_mask=mask, scale=scale)


def decode_attention_eager(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                           scale: float = 0.125) -> Tensor:
    """Same-dtype eager attention (scores and probabilities rounded to q's dtype): bounds the kernel's error."""
    n = q.shape[1] // k.shape[1]
    s = torch.matmul(q, repeat_kv(k, n).transpose(-1, -2)) * scale
    if mask is not None:
        s = s + (torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, float("-inf"))
                 if mask.dtype == torch.bool else mask.to(q.dtype))
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0)
    return torch.matmul(p.to(q.dtype), repeat_kv(v, n))


def decode_attention_softcap_ref(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float = 0.125,
                                 softcap: float = 2.0) -> Tensor:
    """Gemma-2's attention: transformers' eager_attention_forward with logit soft-capping, in eval mode (SDPA
    cannot soft-cap, so these models always take this path)."""
    w = torch.matmul(q, repeat_for(k, q).transpose(2, 3)) * scale
    w = torch.tanh(w / softcap) * softcap
    w = F.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, repeat_for(v, q))


decode_attention_softcap_ref.exact_clones = True  # a decode step's clones only (see _eager)


def decode_attention_roll_ref(q: Tensor, k: Tensor, v: Tensor, new_k: Tensor, new_v: Tensor, mask: Tensor | None,
                              scale: float, softcap: float = 0.0) -> Tensor:
    """The rules' rolling form (kv_cache.py): k and v moved one slot to the left in place, new_k and new_v into their
    last slots (window_roll's reference), then the attention over them, soft-capped where softcap > 0."""
    window_roll_ref(k, new_k)
    window_roll_ref(v, new_v)
    if softcap:
        return decode_attention_softcap_ref(q, k, v, mask, scale, softcap)
    return decode_attention_ref(q, k, v, mask, scale)


torch.library.impl("fusekit::decode_attention_roll", "CPU")(decode_attention_roll_ref)


def _fused(op: str, masked: bool):
    """A fused SDPA op as the composite calls it (defaults dropped by the dispatcher, as in a traced graph)."""
    def cudnn(q, k, v, mask, scale):
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, False, scale=scale)[0]

    def efficient(q, k, v, mask, scale):
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, scale=scale)[0]

    def flash_cpu(q, k, v, mask, scale):
        if mask is None:
            return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)[0]
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)[0]

    call = {"cudnn": cudnn, "efficient": efficient, "flash_cpu": flash_cpu}[op]

    def form(q, k, v, mask, scale):
        return call(q, repeat_for(k, q), repeat_for(v, q), mask, scale)

    def form_no_mask(q, k, v, scale):
        return call(q, repeat_for(k, q), repeat_for(v, q), None, scale)

    f = form if masked else form_no_mask
    f.__name__ = f"{op}_{'mask' if masked else 'no_mask'}"
    return f


def _eager(masked: bool):
    """transformers' eager_attention_forward in eval mode (its dropout is gone): the scores in q's dtype, the mask
    added, the softmax in float32 rounded back, then P @ V. Models that cannot use SDPA (Gemma-2) or that a user
    set to attn_implementation="eager" reach the same cache chain this way."""
    def eager(q, k, v, mask, scale):
        w = torch.matmul(q, repeat_for(k, q).transpose(2, 3)) * scale
        w = F.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, repeat_for(v, q))

    def eager_no_mask(q, k, v, scale):
        w = torch.matmul(q, repeat_for(k, q).transpose(2, 3)) * scale
        return torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), repeat_for(v, q))

    f = eager if masked else eager_no_mask
    # The clones of a decode step's graph only (k transposed: copied; q of one row, P, v: not), as traced at
    # trace_case: every clone variant of its four matmul operands, commuted, would be 64 more forms.
    f.exact_clones = True
    return f


def _forms(masked: bool) -> tuple:
    return tuple(_fused(op, masked) for op in ("cudnn", "efficient", "flash_cpu"))


# ---- checks ----------------------------------------------------------------------------------------
def cache_inputs(q: str, k: str, v: str, mask: str | None = None) -> G.Guard:
    """Can fire: q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0, D in HEAD_DIMS or
    PADDED_HEAD_DIMS, unit last strides, k and v rows 16-byte aligned; every expand in the match is repeat_kv's
    [B,Hkv,Hq/Hkv,S,D]; a mask is bool, float32 or q's dtype and broadcasts to [B,Hq,Lq,S]."""
    def check(s: G.Site) -> str | None:
        tq, tk, tv = s.tensor(q), s.tensor(k), s.tensor(v)
        if (bad := G.qkv_problem((q, k, v), tq, tk, tv)) is not None:
            return bad
        b, hq, lq, d = tq.shape
        _, hkv, sk, _ = tk.shape
        if not (all(known(x == y) for x, y in zip(tk.shape, tv.shape)) and known(tk.shape[0] == b)
                and known(tk.shape[3] == d) and known(hkv > 0) and known(hq % hkv == 0)):
            return (f"shapes are not q [B,Hq,Lq,D], k and v [B,Hkv,S,D] with Hq % Hkv == 0: {tuple(tq.shape)}, "
                    f"{tuple(tk.shape)}, {tuple(tv.shape)}")
        if not any(known(d == x) for x in HEAD_DIMS + PADDED_HEAD_DIMS):
            return f"head dim {d} is not one of {tuple(sorted(HEAD_DIMS + PADDED_HEAD_DIMS))}"
        if not (known(lq > 0) and known(sk > 0)):
            return "empty query or cache"
        if (bad := G.unit_last_stride_problem(tq, tk, tv)) is not None:
            return bad
        if not all(known(st % 8 == 0) for t in (tk, tv) for st in (*t.stride()[:3], t.storage_offset())):
            return f"{k}/{v} rows are not 16-byte aligned: strides {tk.stride()}, {tv.stride()}"
        for node in s.match.nodes:  # the repeat is transformers' repeat_kv of these k/v, nothing else
            if node.target is aten.expand.default and getattr(node.args[0], "target", None) is aten.unsqueeze.default:
                want = (b, hkv, hq // hkv, sk, d)
                got = tuple(node.meta["val"].shape)
                if len(got) != 5 or not all(known(x == y) for x, y in zip(got, want)):
                    return f"an expand to {got} is not repeat_kv's {want}"
        if mask is not None:
            return G.mask_problem(mask, s.tensor(mask), (torch.bool, torch.float32, tq.dtype), (b, hq, lq, sk),
                                  "[B,Hq,Lq,S]")
        return None

    return G.Guard(f"cache_inputs({q}, {k}, {v}{', ' + mask if mask else ''})", check)


def short_queries(q: str) -> G.Guard:
    """Policy: at most MAX_QUERY query rows per sequence. Longer prompts are prefill, where PyTorch's tensor-core
    attention kernels do more work per byte than this decode kernel."""
    def check(s: G.Site) -> str | None:
        lq = s.tensor(q).shape[2]
        return None if known(lq <= MAX_QUERY) else f"{lq} query rows (> {MAX_QUERY}): prefill, not decode"

    return G.Guard(f"short_queries({q})", check, policy=True)


def enough_rows(q: str) -> G.Guard:
    """Policy (CUDA, no grouped heads): at least MHA_MIN_ROWS query rows (batch x heads x rows)."""
    def check(s: G.Site) -> str | None:
        t = s.tensor(q)
        if t.device.type != "cuda":
            return None
        rows = t.shape[0] * t.shape[1] * t.shape[2]
        return None if known(rows >= MHA_MIN_ROWS) else f"{rows} query rows without grouped heads (< {MHA_MIN_ROWS})"

    return G.Guard(f"enough_rows({q})", check, policy=True)


def broadcast_kv_heads(q: str, k: str, v: str) -> G.Guard:
    """Can fire (quietly: a cache of its own per head is not this rule's site): k and v are one KV head broadcast to
    every query head, stride 0 along the heads. repeat_kv of a single KV head (MQA) is such a view, not a copy, so
    SDPA sees as many "heads" as q; the op reads the one KV head once for the whole group."""
    def check(s: G.Site) -> str | None:
        tq, tk, tv = s.tensor(q), s.tensor(k), s.tensor(v)
        if tk.dim() == tv.dim() == tq.dim() == 4 and known(tk.shape[1] == tq.shape[1]) and known(tq.shape[1] > 1) \
                and known(tk.stride(1) == 0) and known(tv.stride(1) == 0):
            return None
        return f"{k}/{v} are not one KV head broadcast to {q}'s heads"

    return G.Guard(f"broadcast_kv_heads({k}, {v})", check, quiet=True)


def kv_heads(q: str, k: str, one: bool) -> G.Guard:
    """Can fire (quietly: the other rule of the same chain takes the site): k has one head and q more (one=True: SDPA
    broadcasts it), or as many heads as q (one=False: MHA)."""
    def check(s: G.Site) -> str | None:
        hq, hk = s.tensor(q).shape[1], s.tensor(k).shape[1]
        if one and known(hk == 1) and known(hq > 1) or not one and known(hk == hq):
            return None
        return f"{k} has {hk} heads for {q}'s {hq}"

    return G.Guard(f"kv_heads({k}, {'one' if one else 'as many as ' + q})", check, quiet=True)


# ---- test inputs -----------------------------------------------------------------------------------
# case = (B, Hq, Hkv, Lq, S, D, mask: "float" [B,1,Lq,S] | "bool" [B,1,Lq,S] | "none"); Hkv = 0: one KV head
# broadcast to the Hq query heads (stride 0), as repeat_kv leaves an MQA cache; Hkv = -1: one KV head as it is
def _qkv(case, dt, dev):
    b, hq, hkv, lq, s, d, _ = case
    q = rand((b, lq, hq, d), dt, dev).transpose(1, 2)  # heads split from [B, L, H*D], as in HF models
    if hkv == 0:
        return q, rand((b, 1, s, d), dt, dev).expand(b, hq, s, d), rand((b, 1, s, d), dt, dev).expand(b, hq, s, d)
    return q, rand((b, max(hkv, 1), s, d), dt, dev), rand((b, max(hkv, 1), s, d), dt, dev)


def _keep(case, dev):
    """A static cache's causal mask (each sequence at its own position), with one sequence left-padded."""
    b, _, _, lq, s, _, _ = case
    pos = torch.randint(0, s - lq + 1, (b, 1, 1, 1), device=dev) + torch.arange(lq, device=dev).view(1, 1, lq, 1)
    keep = torch.arange(s, device=dev).view(1, 1, 1, s) <= pos
    keep[0, ..., : min(3, s - 1)] = False  # left padding: hidden from every row, each row still sees itself
    keep[0, ..., -1] |= True
    return keep


def _inputs(case, dt, dev):
    kind = case[-1]
    if kind == "none":
        return _qkv(case, dt, dev)
    keep = _keep(case, dev)
    if kind == "bool":
        return (*_qkv(case, dt, dev), keep)
    return (*_qkv(case, dt, dev), torch.zeros(keep.shape, dtype=dt, device=dev).masked_fill(~keep, float("-inf")))


def _bad(case):  # head dim 48: not one the kernel takes
    return lambda dt, dev: _inputs((*case[:5], 48, case[6]), dt, dev)


def _cases(hq, hkv, kind):
    return ((2, hq, hkv, 1, 70, 64, kind), (1, hq, hkv, 3, 130, 128, kind), (3, hq, hkv, 1, 9, 64, kind),
            (2, hq, hkv, 1, 40, 96, kind))  # a padded head dim: matched and computed on CPU


# (Hq, Hkv) of the CPU cases; MQA: one KV head broadcast (see _qkv); MQA_SDPA: one KV head as it is, SDPA broadcasts it
GQA, MHA, MQA, MQA_SDPA = (4, 2), (4, 4), (4, 0), (4, -1)
# (B, Hq, Hkv, Lq, S, D): awkward cache lengths, one slot, several rows, MQA, every head dim, batch 64
GPU_CASES = ((1, 32, 8, 1, 4096, 128), (4, 16, 4, 1, 1000, 128), (2, 8, 1, 4, 257, 64), (32, 4, 4, 16, 129, 256),
             (64, 16, 4, 1, 520, 128), (1, 12, 2, 1, 1, 64), (5, 28, 4, 2, 3000, 128), (16, 8, 8, 1, 64, 256),
             (2, 8, 0, 4, 257, 64), (32, 8, 0, 1, 1000, 256), (1, 16, 0, 1, 4096, 128),
             # the padded head dims (PADDED_HEAD_DIMS): partial blocks, several splits, MHA, MQA, 16-row groups
             (2, 32, 32, 1, 1000, 96), (4, 32, 8, 1, 130, 80), (3, 16, 4, 3, 2049, 112), (1, 8, 0, 1, 700, 160),
             (8, 16, 16, 1, 513, 192), (2, 32, 2, 1, 4096, 96), (32, 32, 32, 1, 1024, 96))


def _kv_kind(hq: int, hkv: int) -> str:
    return "broadcast" if hkv == 0 else "sdpa" if hkv == -1 else "mha" if hq == hkv else "grouped"


def _rule(what: str, heads: tuple[int, int], kind: str, forms: bool, **kw) -> Pattern:
    masked = kind != "none"
    kv = _kv_kind(*heads)
    heads_guard = {"broadcast": (broadcast_kv_heads("q", "k", "v"),), "sdpa": (kv_heads("q", "k", one=True),),
                   "mha": (kv_heads("q", "k", one=False),)}.get(kv, ())
    return Pattern(
        f"decode.{what}", reference=decode_attention_ref, op="decode_attention", inputs=_inputs, dtypes=FLOATS,
        # the broadcast cache reaches SDPA as [B, Hq, S, D]: the MHA chain, told apart by k's strides
        # one KV head SDPA broadcasts: traced at batch 1, where its batched matmuls' copies are views (the forms add
        # the clones a batch of more sequences has)
        trace="inductor", trace_case=(1 if kv == "sdpa" else 2, *(MHA if kv == "broadcast" else heads), 1, 6, 8, kind),
        literals=("scale",),
        graph_forms=_forms(masked) if forms else (),
        # eager attention of a broadcast KV head copies it before its matmul (a clone the trace here lacks): not matched;
        # a KV head that SDPA broadcasts itself: SDPA's math decomposition or a fused op that takes it as it is
        variants=(_eager(masked),) if forms and kv not in ("broadcast", "sdpa") else (),
        guards=(*heads_guard, cache_inputs("q", "k", "v", "mask" if masked else None), short_queries("q"),
                *((enough_rows("q"),) if kv == "mha" else ())), **kw,
        fixtures=Fixtures(cases=_cases(*heads, kind), baseline=decode_attention_eager,
                          # one KV head as it is: the MQA cases' shapes
                          gpu_cases=tuple((c[0], c[1], -1 if kv == "sdpa" else c[2], *c[3:], kind) for c in GPU_CASES
                                          if _kv_kind(*c[1:3]) == ("broadcast" if kv == "sdpa" else kv)),
                          bad_layout=_bad(_cases(*heads, kind)[0]), bad_reason="head dim"),
        rolling_op="decode_attention_roll")  # (csrc/decode/decode_attention_roll.cu)


PATTERNS = [
    _rule("gqa_bool_mask", GQA, "bool", forms=False),   # math decomposition with a bool mask
    _rule("gqa", GQA, "float", forms=True),             # additive mask: math, cuDNN, efficient, CPU flash, eager
    _rule("gqa_no_mask", GQA, "none", forms=True, static={"mask": None}),
    # One KV head (MQA: Gemma, Gemma-3, ...): repeat_kv leaves a view with stride 0 along the heads, so SDPA gets
    # the MHA chain; the op reads the head once for every query head instead of once per head.
    _rule("mqa_bool_mask", MQA, "bool", forms=False),
    _rule("mqa", MQA, "float", forms=True),
    _rule("mqa_no_mask", MQA, "none", forms=True, static={"mask": None}),
    # One KV head that SDPA broadcasts itself (Falcon-7B): its math decomposition, the only one that takes unequal
    # heads, copies the head for every query head before each batched matmul; the op reads it once for the group.
    # (A decode step against a static cache always has a mask: no rule for none, whose forms every compile would pay.)
    # From torch 2.14 CPU SDPA takes the one head as it is (the flash op): the fused forms, mask of either dtype.
    _rule("mqa_sdpa_bool_mask", MQA_SDPA, "bool", forms=False),
    _rule("mqa_sdpa", MQA_SDPA, "float", forms=True),
    # Without grouped heads the kernel's only gain is the blocks the mask hides: near a full cache it measured
    # slower than the fused SDPA Inductor calls (GPT-2, H100, per step: b32/b64 at position 1000 of 1024 0.96x /
    # 0.95x, 1.17-1.62x at 128 and 512), and a compiled step serves every position, so on CUDA these fire only
    # when named. Named, at position 1024 of 4096 (Phi-3, StableLM-2, GPT-NeoX, OLMo-2 widths): 1.02-1.25x at batch 1,
    # 2.03-2.26x at batch 32; at 4000 of 4096, with the one-row tile, 1.03-1.13x at batch 1 and 0.97-1.00x at batch 32.
    _rule("mha_bool_mask", MHA, "bool", forms=False, cuda_default=False),
    _rule("mha", MHA, "float", forms=True, cuda_default=False),
    # Gemma-2 (grouped heads, soft-capped scores): the same kernel, the cap applied in its softmax pass.
    Pattern("decode.gqa_softcap", reference=decode_attention_softcap_ref, op="decode_attention_softcap",
            inputs=_inputs, dtypes=FLOATS, trace="inductor", trace_case=(2, *GQA, 1, 6, 8, "float"),
            literals=("scale", "softcap"), guards=(cache_inputs("q", "k", "v", "mask"), short_queries("q")),
            fixtures=Fixtures(cases=_cases(*GQA, "float"), baseline=decode_attention_softcap_ref,
                              gpu_cases=tuple((*c, "float") for c in GPU_CASES if _kv_kind(*c[1:3]) == "grouped"),
                              bad_layout=_bad(_cases(*GQA, "float")[0]), bad_reason="head dim"),
            rolling_op="decode_attention_roll"),
]


# ---- the prefill family (`prefill.*` -> fusekit::gqa_attention, csrc/prefill/): the same chain in a prompt ----
# Prefill attention with grouped KV heads -> ``fusekit::gqa_attention``.
#
# The chain of the decode rules, repeat_kv then SDPA, in a prompt: more than MAX_QUERY query rows (a prompt
# against a static cache, a padded batch of prompts, chunked prefill). Inductor copies the whole cache per query
# head before its fused SDPA kernel; the op hands PyTorch's cuDNN attention the KV heads as they are (PyTorch's
# flash and memory-efficient kernels refuse grouped heads with a mask). The search patterns, inputs and checks
# are the decode rules'; only the query length, the op and the kernel differ.
#
# The attention alone (H100, bf16, 16 query / 4 KV heads, D 128), Inductor's chain / cuDNN with grouped heads, us:
# 512-token prompt against 4096 slots 222 / 108 (batch 4: 285 / 214); 2048 against 4096 282 / 213; 128 rows at
# position 1024, batch 8, 424 / 117. In the models, a 512-token prompt into 4096 slots: 1.03-1.06x Inductor's whole
# forward. A prompt alone (keys = queries) lost in the models and is left to Inductor (prompt_against_cache).
PREFILL_HEAD_DIMS = (64, 128)  # cuDNN's attention on sm_80/sm_90 at every torch version supported


def prefill_kernel_inputs(q: str, mask: str | None = None) -> G.Guard:
    """Can fire: head dim 64 or 128 and a mask that is bool or q's dtype (cuDNN's attention takes the bias in q's
    dtype: a float32 mask would be rounded)."""
    def check(s: G.Site) -> str | None:
        t = s.tensor(q)
        if not any(known(t.shape[3] == x) for x in PREFILL_HEAD_DIMS):
            return f"head dim {t.shape[3]} is not one of {PREFILL_HEAD_DIMS}"
        if mask is not None and s.tensor(mask).dtype not in (torch.bool, t.dtype):
            return f"mask dtype {s.tensor(mask).dtype} is neither bool nor q's {t.dtype}"
        return None

    return G.Guard(f"prefill_kernel_inputs({q}{', ' + mask if mask else ''})", check)


def prompt_against_cache(q: str, k: str) -> G.Guard:
    """Policy: more than MAX_QUERY query rows (fewer are the decode rules') and a cache at least twice as long as
    the prompt. A prompt alone (as many keys as queries) stays Inductor's: there the repeat copies little, and the
    op lost (H100, 4 x 512 tokens: Qwen2-style 0.96x, Llama-style 0.88x Inductor)."""
    def check(s: G.Site) -> str | None:
        lq, sk = s.tensor(q).shape[2], s.tensor(k).shape[2]
        if not known(lq > MAX_QUERY):
            return f"{lq} query rows (<= {MAX_QUERY}): decode, not prefill"
        if not known(sk >= 2 * lq):
            return f"{sk} keys for {lq} query rows (< 2x): a prompt alone, Inductor's"
        return None

    return G.Guard(f"prompt_against_cache({q}, {k})", check, policy=True)


def _prefill_cases(kind):  # (B, Hq, Hkv, Lq, S, D, mask): prompts against caches 2-3.5x as long, groups of 2 and 3
    # (MQA, one KV head, traces to another graph on the CPU: its CPU sites stay Inductor's; GPU_CASES call the op)
    return ((2, 4, 2, 17, 40, 64, kind), (1, 4, 2, 24, 48, 128, kind), (3, 6, 2, 20, 70, 64, kind))


# a 512-token prompt against 4096 slots, awkward lengths, MQA, batch 8 of a chunk at a later position
PREFILL_GPU_CASES = ((1, 16, 4, 512, 4096, 128), (2, 12, 2, 100, 333, 128), (3, 8, 1, 40, 40, 64),
                     (8, 16, 4, 17, 1000, 64), (1, 32, 8, 257, 520, 128))


def _prefill_rule(what: str, kind: str, forms: bool, **kw) -> Pattern:
    masked = kind != "none"
    return Pattern(
        f"prefill.{what}", reference=decode_attention_ref, op="gqa_attention", inputs=_inputs, dtypes=FLOATS,
        trace="inductor", trace_case=(2, *GQA, 1, 6, 8, kind),  # decode's trace
        literals=("scale",), graph_forms=_forms(masked) if forms else (),
        guards=(cache_inputs("q", "k", "v", "mask" if masked else None),
                prefill_kernel_inputs("q", "mask" if masked else None), prompt_against_cache("q", "k")),
        **kw,
        fixtures=Fixtures(cases=_prefill_cases(kind), gpu_cases=tuple((*c, kind) for c in PREFILL_GPU_CASES),
                          baseline=decode_attention_eager, bad_layout=_bad(_prefill_cases(kind)[0]),
                          bad_reason="head dim"))


# Grouped heads only: without them there is no copy to save (MHA prefill stays Inductor's).
PREFILL = [
    _prefill_rule("gqa_bool_mask", "bool", forms=False),   # math decomposition with a bool mask
    _prefill_rule("gqa", "float", forms=True),             # additive mask: math, cuDNN, efficient, CPU flash
    _prefill_rule("gqa_no_mask", "none", forms=True, static={"mask": None}),
]


# What the two families' kernels do not take, for `fusekit doctor` (those sites stay Inductor's).
LIMITS = (
    f"decode.*: head dims {', '.join(map(str, sorted(HEAD_DIMS + PADDED_HEAD_DIMS)))} "
    f"({', '.join(map(str, PADDED_HEAD_DIMS))} in the next tile up); at most "
    f"{MAX_QUERY} query rows; without grouped heads (MHA) opt-in",
    f"prefill.*: head dims {' and '.join(map(str, PREFILL_HEAD_DIMS))}, grouped heads only, a prompt against a cache "
    f"at least twice its length",
)

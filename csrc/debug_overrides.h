// Test and debug overrides: the only environment variables fusekit's kernels read. Each one forces a choice
// the launch code otherwise makes itself, so that the GPU tests can run every kernel variant and compare
// against the default; none is a tuning knob, and with none set every launch takes its default. Each is
// read at each launch, so a CUDA graph keeps what its capture saw.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fusekit {
namespace debug {

// FUSEKIT_PDL: whether kernels of `part` may launch with programmatic dependent launch (pdl.cuh), where their
// build has it. Unset or "1": every part; "0": none; otherwise the parts whose letter the value holds: 'a' the
// attention kernels (decode_attention), 'g' the decode GEMMs (decode_linear, decode_qkv).
inline bool pdl_enabled(char part) {
  const char* e = std::getenv("FUSEKIT_PDL");
  if (e == nullptr || std::strcmp(e, "1") == 0) return true;
  return std::strchr(e, part) != nullptr;
}

// FUSEKIT_DECODE_FP8_BLOCKS: the 8-column blocks per CTA of the one-weight fp8 decode GEMM (decode_linear_fp8,
// decode_qkv_fp8: decode_gemm/decode_linear_fp8.cuh's launch_fp8) at up to 8 rows, "1" or "2"; 0 (unset or
// anything else): its own choice.
inline int decode_fp8_blocks() {
  const char* e = std::getenv("FUSEKIT_DECODE_FP8_BLOCKS");
  return e != nullptr && (std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0) ? e[0] - '0' : 0;
}

// FUSEKIT_DECODE_FP8: the kernel of the fp8 decode GEMMs (decode_linear_fp8, decode_qkv_fp8, decode_gate_up_fp8:
// decode_gemm/decode_linear_fp8.cuh's launch_fp8). "mma": the mma.sync kernels; "tma" / "tma:S": the TMA + wgmma
// kernel at 1-64 rows of an sm_90a build (S splits of K; 0: its own choice). Unset (or anything else): the default
// selection.
struct DecodeFp8Override {
  int kernel = -1;  // -1: none, 1: mma.sync, 2: TMA
  int splits = 0;
};

inline DecodeFp8Override decode_fp8_override() {
  DecodeFp8Override o;
  const char* e = std::getenv("FUSEKIT_DECODE_FP8");
  if (e == nullptr) return o;
  if (std::strcmp(e, "mma") == 0) o.kernel = 1;
  if (std::strncmp(e, "tma", 3) == 0) o.kernel = 2, o.splits = e[3] == ':' ? std::max(0, std::atoi(e + 4)) : 0;
  return o;
}

// FUSEKIT_DECODE_ATTN_ROWS: decode_attention's one-row CTAs (MHA decode, head dims <= 128; decode/decode_attention.cu)
// in another tile: "4" the 4-row tile with its two-stage ring, "1" the tensor-core one-row tile (what builds
// without sm_90 run); 0 (unset or anything else): the default, the streaming one-row tile where it applies.
inline int decode_attention_rows() {
  const char* e = std::getenv("FUSEKIT_DECODE_ATTN_ROWS");
  return e != nullptr && (std::strcmp(e, "4") == 0 || std::strcmp(e, "1") == 0) ? e[0] - '0' : 0;
}

// FUSEKIT_DECODE_ATTN_STAGES: N in 1..6 stages of the streaming one-row tile's K/V ring (decode_attention);
// 0 (unset or anything else): its own choice.
inline int decode_attention_stages() {
  const char* e = std::getenv("FUSEKIT_DECODE_ATTN_STAGES");
  const int n = e == nullptr ? 0 : std::atoi(e);
  return n >= 1 && n <= 6 ? n : 0;
}

// FUSEKIT_WINDOW_ROLL_PIECE: N > 0 16-byte chunks of each row per window_roll CTA (cache/window_roll.cu; N must
// divide the row's chunks, else the op's own choice); 0 (unset or not a number): its own choice.
inline int window_roll_piece() {
  const char* e = std::getenv("FUSEKIT_WINDOW_ROLL_PIECE");
  return e == nullptr ? 0 : std::max(0, std::atoi(e));
}

// FUSEKIT_ROLL_ATTENTION: "separate" runs decode_attention_roll as window_roll on k and v, then decode_attention
// (decode/decode_attention_roll.cu: the unfused steps, to time the fusion against); anything else: its own choice.
inline bool roll_attention_separate() {
  const char* e = std::getenv("FUSEKIT_ROLL_ATTENTION");
  return e != nullptr && std::strcmp(e, "separate") == 0;
}

// FUSEKIT_DECODE_ATTN_SPLITS: N > 0 splits of the cache per decode_attention CTA row (at most one per 64-key
// block, at least what the split's key limit needs); 0 (unset or not a number): its own choice.
inline int decode_attention_splits() {
  const char* e = std::getenv("FUSEKIT_DECODE_ATTN_SPLITS");
  return e == nullptr ? 0 : std::max(0, std::atoi(e));
}

// FUSEKIT_DECODE_GEMM: the kernel of decode_linear and decode_qkv (decode_gemm/decode_linear_splitk.cuh's
// launch_decode_linear). "old": decode_linear_kernel; "splitk": the split-K kernel wherever it fits (1-64 rows),
// "splitk:S" with S splits of K; "tma" / "tma:S" / "tma:S:N" / "tma:S:N:B": the TMA kernel (1-64 rows, sm_90a
// builds; S splits, N stages of B k boxes, B 1 or 2; 0: its own choice); "tmaearly..." that kernel with the
// first weight tiles issued before pdl_wait. Where the forced kernel cannot run (a build without it, rows or
// a K it does not take), decode_linear_kernel runs. It also picks the 8-bit weight-only ops' kernel
// (decode_gemm/decode_linear_w8.cuh): "old" their mma.sync kernel, "tma..." the TMA kernel's W8 form at 1-64 rows,
// "row" their one-row GEMV at every row count (each row re-reads the weights).
struct DecodeGemmOverride {
  int kernel = -1;  // -1: none (the default selection), 0: decode_linear_kernel, 1: split-K, 2: TMA, 3: row GEMV
  int splits = 0;
  bool early = false;
  int stages = 0;
  int boxes = 1;
};

inline DecodeGemmOverride decode_gemm_override() {
  DecodeGemmOverride o;
  const char* e = std::getenv("FUSEKIT_DECODE_GEMM");
  if (e == nullptr) return o;
  const auto with_splits = [&](int len, int kind) {
    if (e[len] == ':') {
      o.splits = std::atoi(e + len + 1);
      if (const char* c = std::strchr(e + len + 1, ':')) {
        o.stages = std::atoi(c + 1);
        if (const char* d = std::strchr(c + 1, ':')) o.boxes = std::atoi(d + 1);
      }
    }
    o.kernel = kind;
    return o;
  };
  if (std::strncmp(e, "old", 3) == 0) return o.kernel = 0, o;
  if (std::strncmp(e, "splitk", 6) == 0) return with_splits(6, 1);
  if (std::strncmp(e, "tmaearly", 8) == 0) return o.early = true, with_splits(8, 2);
  if (std::strncmp(e, "tma", 3) == 0) return with_splits(3, 2);
  if (std::strcmp(e, "row") == 0) return o.kernel = 3, o;
  return o;
}

}  // namespace debug
}  // namespace fusekit

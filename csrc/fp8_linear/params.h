// Plain POD parameter block of the block-scaled FP8 linear at decode sizes (fp8_linear/kernel.cuh).
// Every field is 8 bytes wide (pointer, int64_t) so the ctypes mirror in deepseek_v4_kernel/_ext.py
// (Fp8LinearParams) has no padding surprises. Keep the order in sync.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Most tokens per call: 8 token tiles of the MMA's n = 8 (Python: ops/fp8_linear/dispatch.MAX_M).
#define DSV4_FP8_LINEAR_MAX_M 64
// Weight rows per block (8 warps x one m16 tile): the split-K partials and counters are per 128-row tile.
#define DSV4_FP8_LINEAR_TILE_N 128
// Most K splits per call (the fixed-order reduction of the last block loops over them).
#define DSV4_FP8_LINEAR_MAX_SPLITS 64
// kernel: 0 = weights through a shared-memory ring of cp.async stages (kernel_ring.cuh, x converted once per call
// by a prep kernel); 1 = the first kernel, weights straight to a register ring (kernel.cuh), kept for A/B runs.
#define DSV4_FP8_LINEAR_KERNEL_RING 0
#define DSV4_FP8_LINEAR_KERNEL_REGS 1

// Weight scale forms (scale_mode):
//   0: float32 [G, ceil(N/128), K/128] (SGLang's weight_scale_inv: w = w_fp8 * scale)
//   1: uint8 UE8M0 bytes of the same shape (2^(byte - 127); float8_e8m0fnu viewed as uint8)
//   2: DeepGEMM's packed UE8M0: int32 [G, N, ceil(K/512)], one row per output row, byte j of word w is the
//      scale of K block 4w + j (transform_sf_into_required_layout / requant_weight_ue8m0 on SM100 / SM120)
typedef struct Fp8LinearParams {
  const void* x;            // bf16 [M, G, K]: unit stride along K, rows 16-byte aligned
  int64_t x_stride_m;       // elements between tokens
  int64_t x_stride_g;       // elements between groups
  const void* w;            // e4m3 [G, N, K]
  int64_t w_stride_n;       // bytes between rows (multiple of 16)
  int64_t w_stride_g;       // bytes between groups
  const void* scale;        // see scale_mode
  int64_t s_stride_n;       // elements between scale rows (row blocks for modes 0 / 1, rows for mode 2)
  int64_t s_stride_k;       // elements between K blocks (modes 0 / 1) or packed words (mode 2)
  int64_t s_stride_g;       // elements between groups
  int64_t scale_mode;       // 0, 1, 2 (above)
  const void* bias;         // bf16 [G, N] or null
  int64_t bias_stride_g;    // elements
  void* out;                // bf16 [M, G, N], unit stride along N
  int64_t out_stride_m;     // elements between tokens
  int64_t out_stride_g;     // elements between groups
  float* ws;                // fp32 split-K partials [G, splits, tiles, M, 128] (splits > 1; else unused)
  int32_t* counters;        // int32 [G, tiles], all zero between calls (the last block of a tile resets its own)
  int64_t M;                // 1..DSV4_FP8_LINEAR_MAX_M
  int64_t N;                // >= 1
  int64_t K;                // positive multiple of 128
  int64_t G;                // groups (1 for a plain linear)
  int64_t splits;           // K splits, 1..min(K / 128, DSV4_FP8_LINEAR_MAX_SPLITS)
  int64_t cvt_int;          // 1: e4m3 -> f16 by integer ops instead of cvt.rn.f16x2.e4m3x2 (A/B switch)
  int64_t kernel;           // DSV4_FP8_LINEAR_KERNEL_*: which kernel runs the call
  void* xf;                 // ring kernel: f16 B fragments of x, [G, K/128, MT, 4, 32] x 16 B (written by its prep
                            // kernel in the same call), then the 2^-s per (group, step, token): [G, K/128, 8 MT] fp32
} Fp8LinearParams;

#ifdef __cplusplus
}
#endif

// Plain POD parameter block of the hc_prenorm GEMM kernel (hc_prenorm/kernel.cuh): DeepGEMM's
// tf32_hc_prenorm_gemm semantics (docs/hc_prenorm.md section 1). Every field is 8 bytes wide (pointer
// or int64_t) so the ctypes mirror in deepseek_v4_kernel/_ext.py has no padding surprises. Keep the
// order in sync.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// fn rows (n): the MMA's A operand is [hi rows 0..n-1 | lo rows 0..n-1], three m16 tiles.
#define DSV4_HC_PRENORM_MAX_N 24
// K sub-slices per caller split (P): bounded so one reducing block reads at most 64 partials per output.
#define DSV4_HC_PRENORM_MAX_SUB 64
// DeepGEMM's split granularity (BLOCK_K of its sm90 / sm100 kernels): split s of S gets nb / S of the nb 64-wide K
// blocks, the first nb % S one more; both kernels partition K this way.
#define DSV4_HC_PRENORM_KBLOCK 64
// x rows per block of the few-rows kernel (kernel_small.cuh): small_rows is one of 1, 2, 4, 8, 16.
#define DSV4_HC_PRENORM_SMALL_MAX_ROWS 16
// The few-rows kernel's exchange buffer (xchg, kernel_small.cuh: the sub-slice partials of num_splits None summed
// in the launch): uint32 epochs [64 rows], uint32 tickets [64 row blocks], then uint64 tagged partials
// [64 rows][DSV4_HC_PRENORM_MAX_SUB sub-slices][25 values: 24 fn rows, the square-sum]. Zeroed once by its owner.
#define DSV4_HC_PRENORM_XCHG_ROWS 64
#define DSV4_HC_PRENORM_XCHG_HEADER_BYTES 512
#define DSV4_HC_PRENORM_XCHG_BYTES \
  (DSV4_HC_PRENORM_XCHG_HEADER_BYTES + DSV4_HC_PRENORM_XCHG_ROWS * DSV4_HC_PRENORM_MAX_SUB * 25 * 8)
// x rows the whole-K kernel (fn_row_kernel, kernel_small.cuh hc_prenorm_fnrow_kernel) takes at most.
#define DSV4_HC_PRENORM_FNROW_MAX_M 2

typedef struct HcPrenormParams {
  const void* x;          // bf16 [m, K], unit stride along K; rows 16-byte aligned (x_stride % 8 == 0)
  int64_t x_stride;       // elements between rows
  const float* fn;        // fp32 [n, K], unit stride along K; rows 16-byte aligned (fn_stride % 4 == 0)
  int64_t fn_stride;
  float* out;             // fp32 [S, m, n] (any strides; S = 1 for a 2-D out)
  int64_t out_stride_s;
  int64_t out_stride_m;
  int64_t out_stride_n;
  float* sqrsum;          // fp32 [S, m] (any strides)
  int64_t sq_stride_s;
  int64_t sq_stride_m;
  float* ws;              // P > 1: fp32 partials (any content), at least S * m_tiles * P * 1600 floats: the general
                          // kernel's [S * m_tiles * P, 1600], or, kFast shapes (hc_prenorm.cu), out [S * P, m, 24]
                          // then sqrsum [S * P, m]; 16-byte aligned for the latter
  int32_t* counters;      // P > 1 (the MMA kernel): int32 [S * m_tiles], zero on entry; left zero on exit
  int64_t m;
  int64_t n;              // 1 .. DSV4_HC_PRENORM_MAX_N
  int64_t K;              // multiple of 8
  int64_t num_splits;     // S, the caller's splits (DeepGEMM's 64-wide block partition)
  int64_t sub_splits;     // P, sub-slices of every split (1: no workspace, no counters)
  int64_t small_rows;     // 0: the MMA kernel (kernel.cuh); 1, 2, 4, 8 or 16: the few-rows FMA kernel
                          // (kernel_small.cuh) with this many x rows per block (P > 1: n = 24 and S = 1 only,
                          // no counters used)
  void* xchg;             // few-rows kernel with P > 1 only (else nullptr): the exchange buffer above
                          // (DSV4_HC_PRENORM_XCHG_BYTES, 8-byte aligned, zero when first used, then left to the
                          // kernel), m <= DSV4_HC_PRENORM_XCHG_ROWS; the partials are then summed in the launch
                          // instead of by the reduce grid (ws unused)
  int64_t fn_row_kernel;  // 1: the whole-K kernel (kernel_small.cuh hc_prenorm_fnrow_kernel): one block per fn row,
                          // m <= DSV4_HC_PRENORM_FNROW_MAX_M, one split, no sub-slices (small_rows 0, no workspace,
                          // no xchg): no cross-block sum
  int64_t atomic_sum;     // 1: the P > 1 sub-slices of one split are added into the caller's out / sqrsum with float
                          // atomics after a zero kernel (no workspace, no reduce grid; the sum order, so the last
                          // bits, may differ between calls): n = 24, out with unit n stride, m stride % 4 == 0 and a
                          // 16-byte aligned base; small_rows 0 (the MMA kernel) also needs its kFast shape (m >= its
                          // rows per block, mma_rows or 64; K % 32 == 0, out rows contiguous: m stride 24); no xchg
  int64_t mma_rows;       // the MMA kernel's x rows per block (kernel.cuh kR): 0 or 64 (the default), or 16 / 32
                          // for its kFast instance only (small_rows 0, n = 24, K % 32 == 0, m >= mma_rows) with
                          // atomic_sum, or sub-slices into the workspace (sub_splits > 1, ws 16-byte aligned; no
                          // counters needed), or none (sub_splits 1: out rows contiguous, m stride 24, unit n stride,
                          // 16-byte aligned, S stride % 4 == 0)
  int64_t fn_groups;      // the few-rows kernel's fn rows over this many blocks per (split, row block): 0 or 1 (each
                          // block all n fn rows), or 3 / 6 (8 / 4 fn rows each: fn is read once per split instead of
                          // once per row block); 3 / 6 only with small_rows 2 / 4 / 8, sub_splits 1, no xchg, no
                          // atomic_sum
} HcPrenormParams;

#ifdef __cplusplus
}
#endif

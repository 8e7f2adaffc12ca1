// Plain POD parameter block of the MXFP4 MoE decode kernels (fp4_moe/kernel.cuh).
// Every field is 8 bytes wide (pointer, int64_t or double) so the ctypes mirror in
// deepseek_v4_kernel/_ext.py has no padding surprises. Keep the order in sync.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Most routed slots (tokens x top-k) per call: every block keeps the whole slot -> expert table in
// shared memory (2 x 256 x 4 B) and counts it with two block-wide votes of 128 threads.
// Checked at the C ABI (api.cu); Python's ops/fp4_moe.DECODE_MAX_SLOTS matches it.
#define DSV4_FP4_MOE_MAX_SLOTS 256
// Output columns per gemm2 block: one tile counter each (Fp4MoeDecodeParams.counters has hidden / 32).
#define DSV4_FP4_MOE_GEMM2_TILE 32

typedef struct Fp4MoeDecodeParams {
  const void* x;              // bf16 [M, hidden], unit stride along hidden, rows 16-byte aligned
  int64_t x_stride;           // elements between token rows
  const void* w13;            // packed e2m1 [E, 2I, hidden/2] (gate rows, then up rows; low nibble first)
  int64_t w13_stride_e;       // bytes
  int64_t w13_stride_n;       // bytes (multiple of 16)
  const void* s13;            // UE8M0 scales [E, 2I, hidden/32]: uint8 bytes or float32 powers of two
  int64_t s13_stride_e;       // elements
  int64_t s13_stride_n;
  int64_t s13_f32;            // 1: float32 (the exponent field is read), 0: uint8
  const void* w2;             // packed e2m1 [E, hidden, I/2]
  int64_t w2_stride_e;
  int64_t w2_stride_n;
  const void* s2;             // [E, hidden, I/32]
  int64_t s2_stride_e;
  int64_t s2_stride_n;
  int64_t s2_f32;
  const void* topk_ids;       // contiguous [M, topk], int32 or int64; id < 0 or >= E: slot dropped
  int64_t ids_int64;
  const void* topk_weights;   // contiguous [M, topk]
  int64_t tw_dtype;           // 0: float32, 1: bf16, 2: fp16
  void* h;                    // workspace bf16 [M*topk, I]: silu(gate) * up per slot
  float* y;                   // workspace fp32 [M*topk, hidden]: h W2^T per slot
  int32_t* counters;          // workspace int32 [hidden / DSV4_FP4_MOE_GEMM2_TILE] (any content: gemm1 zeroes it for gemm2)
  void* out;                  // bf16 [M, hidden], unit stride along hidden
  int64_t out_stride;         // elements between token rows
  int64_t M;
  int64_t topk;
  int64_t E;
  int64_t hidden;             // multiple of 128
  int64_t inter;              // I, multiple of 128
  int64_t swiglu;             // 1: gate = min(gate, limit), up = clamp(up, -limit, limit)
  double swiglu_limit;
  double rsf;                 // routed scaling factor (1.0 when none)
} Fp4MoeDecodeParams;

// The streaming decode kernels (kernel_stream.cuh, C ABI dsv4_fp4_moe_stream): a persistent grid over (expert
// pass, row tile) work items, so up to this many slots and this many experts per call (the slot -> expert
// table, the per-expert counts and the pass list live in shared memory, ~21 KB per block).
#define DSV4_FP4_MOE_STREAM_MAX_SLOTS 2048
#define DSV4_FP4_MOE_STREAM_MAX_EXPERTS 1024

#define DSV4_FP4_MOE_STREAM_VARIANTS 6
#define DSV4_FP4_MOE_DIAG_LOADS 16    // loads only (decode + MMA replaced by an XOR fold): wrong results by design
#define DSV4_FP4_MOE_DIAG_COMPUTE 32  // decode + MMA on weights loaded once (no weight stream): wrong results by design

typedef struct Fp4MoeStreamParams {
  Fp4MoeDecodeParams d;       // as for the two-launch kernels, except: counters int32 [M * hidden / 32] (one per
                              // token x 32-column tile; gemm1 zeroes them), h / y workspaces as there
  int64_t wpi1;               // warps per work item of gemm1: 1, 2 or 4 (they split K; clamped to K / 128 steps)
  int64_t wpi2;               // the same for gemm2
  int64_t variant;            // low 4 bits (< DSV4_FP4_MOE_STREAM_VARIANTS; fp4_moe.cu): ring / blocks per SM:
                              // 0: 3 register ring steps, 3 blocks of 128 threads per SM; 1: 2 steps, 4 blocks
                              // (<= 128 registers); 2: cp.async shared-memory ring of 4 steps per warp, 3 blocks;
                              // 3: shared ring of 3, 4 blocks; 4: variant 0 with 2 MMA chains per tile; 5: variant 3
                              // with 2 MMA chains. Bits 4-5: a bench-only diagnostic (uint8 scales only):
                              // DSV4_FP4_MOE_DIAG_LOADS with variant 0, 1 or 3, DSV4_FP4_MOE_DIAG_COMPUTE with 0 or 1
  int64_t blocks_per_sm;      // grid cap per SM (0: the occupancy the kernel reaches)
} Fp4MoeStreamParams;

#ifdef __cplusplus
}
#endif

// MXFP4 routed experts of DeepSeek-V4 at decode sizes (M * topk <= DSV4_FP4_MOE_MAX_SLOTS), two
// launches, no routing pass, no dequantised weight copy:
//
//   fp4_moe_gemm1_kernel  grid (I / 16, slots): h[slot] = silu(min(g, l)) * clamp(u, -l, l), g|u = x W13^T
//   fp4_moe_gemm2_kernel  grid (hidden / 32, slots): y[slot] = h[slot] W2^T (fp32); the last block of
//                         each 32-column tile sums out[t] = rsf * sum_k w[t,k] y[t*topk+k] (fixed order)
//
// Routing by de-duplication instead of a sort: block (tile, j) runs only if slot j's expert is valid and
// appears at no earlier slot; it then computes that expert's tile for every slot routed to it (in passes
// of 8, the n = 8 of the MMA), so each expert's weights are streamed once per call at decode (at most one
// slot per expert is the common case; duplicates across tokens cost nothing extra).
//
// Inner product: weights are the MMA's M side (m16n8k16, bf16, fp32 accumulators), slots the N side.
// A warp step covers K = 128: lane (g = lane / 4, c = lane % 4) loads 16 bytes = 32 e2m1 values = one
// whole scale group of each of its 4 rows (two m16 tiles: rows g and g + 8 of each), so a 16-byte load
// per row and one scale per row per step. The 32 values are decoded to bf16 in registers (exact: e2m1
// bits placed in a bf16 subnormal-class pattern by and / imad / and, times 2^(e8m0 - 1)), and K is
// permuted inside the lane's 32 values to make the decode cheap; the B operand (x or h) is read with the
// same permutation.
// Warps split K (step q goes to warp q % 4) and their fp32 partials are summed in shared memory.
// Weight loads run kStages - 1 steps ahead (register ring, L1::no_allocate), the B operand one step.
//
// PDL: gemm1 waits before its first read (topk_ids, x come from earlier kernels) and then lets gemm2 be
// scheduled; gemm2 reads topk_ids (written before gemm1 started) and issues its first weight loads
// before waiting for gemm1's h. gemm1 also zeroes gemm2's tile counters (gemm2 counts only after its
// wait), so they live in the per-call workspace: no state kept between calls, streams or graphs.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "fp4_moe/params.h"
#include "common/device.cuh"

namespace dsv4 {
namespace fp4moe {

constexpr int kThreads = 128;                 // 4 warps; they split K
constexpr int kWarps = kThreads / 32;
constexpr int kStepK = 128;                   // K per warp step (4 lanes x one 32-value scale group)
constexpr int kStepBytes = kStepK / 2;        // packed bytes per row per step
constexpr int kGroup = 32;                    // values per UE8M0 scale
constexpr int kCols = 8;                      // slots per MMA pass (n of m16n8k16)
// m16 weight tiles per block (a lane holds 2 * kTiles rows). One tile per block (twice the blocks, fewer
// registers, 4-5 blocks per SM) measured 5-15 % slower on the H100 (docs/fp4_moe.md), so two it is.
constexpr int kTiles = 2;
constexpr int kRows = 2 * kTiles;             // weight rows per lane: rows g + 8 r of the block, r < kRows
constexpr int kGemm1Rows = 8 * kTiles;        // gate rows per gemm1 block (+ as many up rows)
constexpr int kGemm2Rows = 16 * kTiles;       // W2 rows (output columns) per gemm2 block
constexpr int kMaxSlots = DSV4_FP4_MOE_MAX_SLOTS;
// Register budget: 3 blocks of 128 threads per SM (<= 168 registers; no spills on sm_90a or sm_120a) with
// 3 weight steps in flight per warp. H100 (docs/fp4_moe.md, sweeps via DSV4_NVCC_FLAGS -D
// overrides): 4 blocks per SM (128 registers) was 7-13 % faster at 8-32 tokens but 8 % slower at 1 token
// and spills on sm_90a; 4 stages spill at 168 registers.
#ifndef DSV4_FP4_MOE_STAGES
#define DSV4_FP4_MOE_STAGES 3
#endif
#ifndef DSV4_FP4_MOE_MIN_BLOCKS
#define DSV4_FP4_MOE_MIN_BLOCKS 3
#endif
// Early weights: with at most kEarlyMaxSlots slots, a block issues its first weight steps right after
// reading its own slot's expert, so that DRAM round trip overlaps the routing votes; a block that turns
// out to be a duplicate drops them. H100 (docs/fp4_moe.md): 1 token 53.0 -> 51.6 us, but at
// 32 tokens (192 slots, ~50 duplicate slots x 256 blocks x 16 KB of dropped loads) 1076 -> 1113 us,
// hence the slot limit. DSV4_FP4_MOE_EARLY_WEIGHTS=0: never.
#ifndef DSV4_FP4_MOE_EARLY_WEIGHTS
#define DSV4_FP4_MOE_EARLY_WEIGHTS 1
#endif
#ifndef DSV4_FP4_MOE_EARLY_MAX_SLOTS
#define DSV4_FP4_MOE_EARLY_MAX_SLOTS 64
#endif
constexpr bool kEarlyWeights = DSV4_FP4_MOE_EARLY_WEIGHTS != 0;
constexpr int kEarlyMaxSlots = DSV4_FP4_MOE_EARLY_MAX_SLOTS;
constexpr int kStages = DSV4_FP4_MOE_STAGES;  // weight steps in flight per warp (20 registers each)
constexpr int kMinBlocks = DSV4_FP4_MOE_MIN_BLOCKS;
// Static shared memory per block: slot table + this expert's slots (2 x 256 x 4 = 2048 B) + the
// cross-warp partials (4 warps x 2 tiles x 16 x 8 fp32 = 4096 B) + flags = ~6.2 KB << 101376 B.
static_assert(kMaxSlots == 2 * kThreads, "slot votes: two per thread");
static_assert(kGemm2Rows == DSV4_FP4_MOE_GEMM2_TILE, "gemm2 column tile = the counters' granularity (params.h)");
static_assert(kGemm1Rows * kCols <= kThreads, "gemm1 epilogue: one (gate row, slot) pair per thread");

// ---- loads --------------------------------------------------------------------------------------------
// L2 prefetch size of the weight loads (PTX .L2::64B / 128B / 256B, sm_75+): a lane reads 16 B, a warp
// 64 contiguous bytes of a row per step, and the block's warps take consecutive steps, so the hint lets the
// L2 fetch the segment the sibling warps read next in one DRAM access. H100 (docs/fp4_moe.md,
// same call, 2 rounds alternating): 256 B 1.5-2.5 % faster than no hint at 1 to 32 tokens (1 token 55.4 ->
// 54.2 us). 0: no hint. (Build-time switch for A/B runs: DSV4_NVCC_FLAGS=-D...)
#ifndef DSV4_FP4_MOE_W_PREFETCH
#define DSV4_FP4_MOE_W_PREFETCH 256
#endif
#if DSV4_FP4_MOE_W_PREFETCH == 0
#define DSV4_FP4_MOE_W_LD "ld.global.nc.L1::no_allocate.v4.u32"
#elif DSV4_FP4_MOE_W_PREFETCH == 128
#define DSV4_FP4_MOE_W_LD "ld.global.nc.L1::no_allocate.L2::128B.v4.u32"
#elif DSV4_FP4_MOE_W_PREFETCH == 256
#define DSV4_FP4_MOE_W_LD "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
#else
#error "DSV4_FP4_MOE_W_PREFETCH: 0, 128 or 256"
#endif
// Weights: read once per call, so keep them out of L1.
__device__ __forceinline__ uint4 ld_weights(const uint8_t* p) {
  uint4 v;
  asm(DSV4_FP4_MOE_W_LD " {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
// Activations and workspaces written by earlier kernels of the stream: L2 (coherent) loads.
__device__ __forceinline__ uint4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

// UE8M0 exponent of a scale: the byte itself, or the exponent field of a float32 power of two.
template <bool kF32>
__device__ __forceinline__ uint32_t ld_scale_exp(const void* base, int64_t idx) {
  if (kF32) return (__ldg(reinterpret_cast<const uint32_t*>(base) + idx) >> 23) & 0xFFu;
  return __ldg(reinterpret_cast<const uint8_t*>(base) + idx);
}

// ---- e2m1 -> bf16 ---------------------------------------------------------------------------------------
// The low nibbles of bytes 0 and 2 of `w` -> bf16x2 {lo(b0), lo(b2)} carrying e2m1 * 2^-126: magnitude bits
// to bf16 bits 8..6, sign to 15 (code 1 = 0.5 lands on the subnormal 2^-127); multiplying by 2^126 * scale
// makes them exact. The nibbles are isolated first, so the multiply by 0x1040 = (<< 6) + (<< 12) adds two
// disjoint copies (no carries): and, imad, and = 3 instructions per bf16x2 (a shift/mask form took ~4.5
// plus a prmt per two: 1 token 55.5 -> 53.0 us on the H100). High nibbles: the copies 4 bits lower; bytes
// 1 and 3: the same on w >> 8. Host-callable: tests/host/fp4_decode_check.cu checks every input on the CPU.
__host__ __device__ __forceinline__ uint32_t e2m1_lo_to_bf16x2(uint32_t w) {
  return ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
}
__host__ __device__ __forceinline__ uint32_t e2m1_hi_to_bf16x2(uint32_t w) {
  return ((w & 0x00F000F0u) * 0x104u) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// One K step of one lane: kRows weight rows x 16 bytes and their scale exponents (a ring kStages deep: they
// come from DRAM), and 32 B-operand values (one buffer refilled during the step: they come from L2).
struct WeightStep {
  uint4 w[kRows];
  uint32_t e[kRows];
};
struct OperandStep {
  uint4 b[4];
};

// The kRows rows of a lane (lane-row r = tile r / 2, row g + 8 (r % 2) of it; each kernel maps r to a
// weight row) as row pointers + scale row offsets.
struct Rows {
  const uint8_t* w[kRows];
  int64_t s[kRows];   // scale element offset of the row
};

template <bool kScaleF32>
__device__ __forceinline__ void load_weights(WeightStep& st, const Rows& r, const void* scales, int q, int c) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    st.w[i] = ld_weights(r.w[i] + (int64_t)q * kStepBytes + c * 16);
    st.e[i] = ld_scale_exp<kScaleF32>(scales, r.s[i] + q * (kStepK / kGroup) + c);
  }
}

// B operand values k = q*128 + c*32 .. +32 of this lane's slot row (zeros for lanes past the last slot).
__device__ __forceinline__ void load_operand(OperandStep& st, const __nv_bfloat16* brow, int q, int c) {
  if (brow != nullptr) {
    const __nv_bfloat16* p = brow + (int64_t)q * kStepK + c * 32;
#pragma unroll
    for (int i = 0; i < 4; ++i) st.b[i] = ld_cg16(p + 8 * i);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.b[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ uint32_t u4(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// B refill of one 16-byte piece for the next step; lanes without one (nullptr) keep their registers (zeros
// for lanes past the last slot). Predicated instead of branched so that the step stays one basic block.
__device__ __forceinline__ void ld_cg16_if(uint4& v, const __nv_bfloat16* p) {
  asm("{\n .reg .pred q;\n setp.ne.u64 q, %4, 0;\n @q ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p));
}

// acc[t] += W[tile t rows] . B over this lane's step. K order inside the lane's 32 values: MMA k16 step s
// (0..7) takes word j = s / 2 (values 8j..8j+7) of each row; with o = 2 (s % 2), slots (2c, 2c+1) <- values
// 8j + o + (0, 4) (low nibbles of bytes o / 2 and o / 2 + 2), slots (2c+8, 2c+9) <- 8j + o + (1, 5) (their
// high nibbles). B follows suit. (Any permutation shared by the lanes of one c works.)
// kBig: some scale of the warp's step is > 2 (e8m0 > 128), where 2^126 * scale overflows bf16: two
// multiplies (2^126, then the scale). Branching once per step keeps the common path free of branches.
// `next`: this lane's B values of the following step (nullptr: none, or a lane past the last slot, whose
// operand stays zero); each 16-byte piece of `op` is refilled from it right after its last use, so the
// operand needs one register buffer and still arrives a step ahead.
// acc_odd: the accumulators of the odd k16 steps (the same array as acc for one chain per tile; a second array
// gives each tile two independent MMA chains, summed by the caller: kernel_stream.cuh's kAcc = 2).
template <bool kBig>
__device__ __forceinline__ void compute_step_body(float (&acc)[kTiles][4], float (&acc_odd)[kTiles][4],
                                                  const WeightStep& st, OperandStep& op, const __nv_bfloat16* next) {
  uint32_t f[kRows], f2[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const uint32_t e = st.e[i];
    if (kBig) {
      const bool b = e > 128u;
      f[i] = b ? 0x7E807E80u : ((e + 126u) << 7) * 0x10001u;
      f2[i] = b ? (e << 7) * 0x10001u : 0x3F803F80u;
    } else {
      f[i] = ((e + 126u) << 7) * 0x10001u;   // 2^126 * 2^(e - 127) = 2^(e - 1), a normal bf16 for e <= 128
    }
  }
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint4& xv = op.b[s >> 1];
    const uint32_t xa = (s & 1) ? xv.y : xv.x, xb = (s & 1) ? xv.w : xv.z;
    uint32_t b[2];
    b[0] = __byte_perm(xa, xb, 0x5410u);   // {x[0], x[4]} of the word's 8 values (odd s: {x[2], x[6]})
    b[1] = __byte_perm(xa, xb, 0x7632u);   // {x[1], x[5]} (odd s: {x[3], x[7]})
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      uint32_t wg = u4(st.w[2 * t], s >> 1), wh = u4(st.w[2 * t + 1], s >> 1);   // tile rows g, g + 8
      if (s & 1) {
        wg >>= 8;
        wh >>= 8;
      }
      uint32_t a[4];
      a[0] = e2m1_lo_to_bf16x2(wg);
      a[2] = e2m1_hi_to_bf16x2(wg);
      a[1] = e2m1_lo_to_bf16x2(wh);
      a[3] = e2m1_hi_to_bf16x2(wh);
      a[0] = mul_bf16x2(a[0], f[2 * t]);
      a[2] = mul_bf16x2(a[2], f[2 * t]);
      a[1] = mul_bf16x2(a[1], f[2 * t + 1]);
      a[3] = mul_bf16x2(a[3], f[2 * t + 1]);
      if (kBig) {
        a[0] = mul_bf16x2(a[0], f2[2 * t]);
        a[2] = mul_bf16x2(a[2], f2[2 * t]);
        a[1] = mul_bf16x2(a[1], f2[2 * t + 1]);
        a[3] = mul_bf16x2(a[3], f2[2 * t + 1]);
      }
      mma_bf16_16816((s & 1) ? acc_odd[t] : acc[t], a, b);
    }
    if (s & 1) ld_cg16_if(op.b[s >> 1], next != nullptr ? next + 8 * (s >> 1) : nullptr);
  }
}

__device__ __forceinline__ void compute_step(float (&acc)[kTiles][4], float (&acc_odd)[kTiles][4],
                                             const WeightStep& st, OperandStep& op, const __nv_bfloat16* next) {
  bool big = false;
#pragma unroll
  for (int i = 0; i < kRows; ++i) big |= st.e[i] > 128u;
  if (__any_sync(0xffffffffu, big))
    compute_step_body<true>(acc, acc_odd, st, op, next);
  else
    compute_step_body<false>(acc, acc_odd, st, op, next);
}
__device__ __forceinline__ void compute_step(float (&acc)[kTiles][4], const WeightStep& st, OperandStep& op,
                                             const __nv_bfloat16* next) {
  compute_step(acc, acc, st, op, next);
}

__device__ __forceinline__ int warp_steps(int steps, int warp) {
  return steps > warp ? (steps - warp + kWarps - 1) / kWarps : 0;
}

// The first kStages - 1 weight steps of this warp's share of the K loop (steps warp, warp + 4, ...).
template <bool kScaleF32>
__device__ __forceinline__ void prime_weights(WeightStep (&ring)[kStages], const Rows& rows, const void* scales,
                                              int steps, int warp, int c) {
  const int n = warp_steps(steps, warp);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (i < n) load_weights<kScaleF32>(ring[i], rows, scales, warp + i * kWarps, c);
}

// This warp's share of the K loop: weights kStages - 1 steps ahead, the B operand one step ahead (refilled
// inside compute_step). `primed`: the caller already issued the first weight steps into `ring`
// (prime_weights). kWaitAfterWeights: issue the first weight loads, then pdl_wait(), then the B operand
// (gemm2: h comes from gemm1).
template <bool kScaleF32, bool kWaitAfterWeights>
__device__ __forceinline__ void warp_gemm(float (&acc)[kTiles][4], WeightStep (&ring)[kStages], bool primed,
                                          const Rows& rows, const void* scales, const __nv_bfloat16* brow,
                                          int steps, int warp, int c) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
  const int n = warp_steps(steps, warp);
  OperandStep op;
  if (!primed) prime_weights<kScaleF32>(ring, rows, scales, steps, warp, c);
  if (kWaitAfterWeights) pdl_wait();
  if (n > 0) load_operand(op, brow, warp, c);
  const __nv_bfloat16* bnext = brow != nullptr ? brow + (int64_t)(warp + kWarps) * kStepK + c * 32 : nullptr;
  for (int i0 = 0; i0 < n; i0 += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int i = i0 + s;
      if (i + kStages - 1 < n)
        load_weights<kScaleF32>(ring[(s + kStages - 1) % kStages], rows, scales, warp + (i + kStages - 1) * kWarps, c);
      if (i < n) compute_step(acc, ring[s], op, i + 1 < n ? bnext : nullptr);
      bnext = bnext != nullptr ? bnext + kWarps * kStepK : nullptr;
    }
  }
}

// ---- routing by de-duplication -----------------------------------------------------------------------------
struct SlotTable {
  int expert[kMaxSlots];   // expert of each slot, -1 when dropped
  int cols[kMaxSlots];     // the slots of this block's expert, ascending
  int ncols;
  int last;                // gemm2: this block finishes the tile
};

// Expert of slot i, -1 when dropped (out of range).
__device__ __forceinline__ int slot_expert(const Fp4MoeDecodeParams& p, int i) {
  const int64_t id = p.ids_int64 ? __ldcg(reinterpret_cast<const long long*>(p.topk_ids) + i)
                                 : (int64_t)__ldcg(reinterpret_cast<const int*>(p.topk_ids) + i);
  return (id >= 0 && id < p.E) ? (int)id : -1;
}

// Fills the table; returns the block's expert (-1: the block has nothing to do) and, in *n_valid, the
// number of valid slots. Every thread of the block must call it (block-wide votes).
__device__ __forceinline__ int route_block(const Fp4MoeDecodeParams& p, SlotTable& tab, int* n_valid) {
  const int S = (int)(p.M * p.topk);
  const int tid = threadIdx.x;
  for (int i = tid; i < S; i += kThreads) tab.expert[i] = slot_expert(p, i);
  __syncthreads();
  const int j = blockIdx.y;
  const int e = tab.expert[j];
  bool dup = false;
  int valid = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = tid + h * kThreads;
    if (i < S) {
      valid += tab.expert[i] >= 0;
      dup |= i < j && tab.expert[i] == e;
    }
  }
  *n_valid = __syncthreads_count(valid >= 1) + __syncthreads_count(valid >= 2);
  dup = __syncthreads_or(dup);
  if (e < 0 || dup) return -1;
  if (tid < 32) {   // warp 0: this expert's slots in ascending order
    int n = 0;
    for (int base = 0; base < S; base += 32) {
      const int i = base + tid;
      const bool m = i < S && tab.expert[i] == e;
      const unsigned bal = __ballot_sync(0xffffffffu, m);
      if (m) tab.cols[n + __popc(bal & ((1u << tid) - 1u))] = i;
      n += __popc(bal);
    }
    if (tid == 0) tab.ncols = n;
  }
  __syncthreads();
  return e;
}

// Cross-warp partials: part[warp][r][g][col] = this warp's sum for lane-row r (tile r / 2, half r % 2),
// row-in-group g, slot column col.
__device__ __forceinline__ void store_partials(float (*part)[8][kCols], const float (&acc)[kTiles][4], int g, int c) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    part[2 * t][g][2 * c] = acc[t][0];
    part[2 * t][g][2 * c + 1] = acc[t][1];
    part[2 * t + 1][g][2 * c] = acc[t][2];
    part[2 * t + 1][g][2 * c + 1] = acc[t][3];
  }
}

// ---- gemm1: gate | up, fused clamp + SiLU * up -> h (bf16) --------------------------------------------------
// Lane-row r < kTiles is gate row n0 + 8 r + g, lane-row kTiles + r the up row of the same index.
__device__ __forceinline__ Rows gemm1_rows(const Fp4MoeDecodeParams& p, int e, int n0, int g) {
  const uint8_t* wbase = reinterpret_cast<const uint8_t*>(p.w13) + (int64_t)e * p.w13_stride_e;
  const int64_t sbase = (int64_t)e * p.s13_stride_e;
  Rows rows;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = (r < kTiles ? 0 : p.inter) + n0 + 8 * (r % kTiles) + g;
    rows.w[r] = wbase + row * p.w13_stride_n;
    rows.s[r] = sbase + row * p.s13_stride_n;
  }
  return rows;
}

template <bool kScaleF32>
__global__ void __launch_bounds__(kThreads, kMinBlocks) fp4_moe_gemm1_kernel(Fp4MoeDecodeParams p) {
  __shared__ SlotTable tab;
  __shared__ float part[kWarps][kRows][8][kCols];
  pdl_wait();                 // topk_ids and x come from earlier kernels
  pdl_launch_dependents();    // gemm2 may get resident and prefetch its weights
  if (blockIdx.y == 0 && threadIdx.x == 0)   // gemm2's tile counters: zeroed here, so the caller need not
    for (int i = blockIdx.x; i < p.hidden / kGemm2Rows; i += gridDim.x) p.counters[i] = 0;
  WeightStep ring[kStages];
  Rows rows;
  bool primed = false;
  if (kEarlyWeights && p.M * p.topk <= kEarlyMaxSlots) {   // route_block returns this expert if the block runs
    const int e0 = slot_expert(p, blockIdx.y);
    if (e0 >= 0) {
      const int lane = threadIdx.x & 31;
      rows = gemm1_rows(p, e0, blockIdx.x * kGemm1Rows, lane >> 2);
      prime_weights<kScaleF32>(ring, rows, p.s13, (int)(p.hidden / kStepK), threadIdx.x >> 5, lane & 3);
      primed = true;
    }
  }
  int n_valid;
  const int e = route_block(p, tab, &n_valid);
  if (e < 0) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int n0 = blockIdx.x * kGemm1Rows;
  if (!primed) rows = gemm1_rows(p, e, n0, g);
  const int steps = (int)(p.hidden / kStepK);
  const float limit = (float)p.swiglu_limit;
  __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(p.h);
  for (int c0 = 0; c0 < tab.ncols; c0 += kCols) {
    const int col = c0 + g;
    const __nv_bfloat16* brow = nullptr;
    if (col < tab.ncols)
      brow = reinterpret_cast<const __nv_bfloat16*>(p.x) + (int64_t)(tab.cols[col] / p.topk) * p.x_stride;
    float acc[kTiles][4];
    warp_gemm<kScaleF32, false>(acc, ring, primed && c0 == 0, rows, p.s13, brow, steps, warp, c);
    store_partials(part[warp], acc, g, c);
    __syncthreads();
    const int j = tid / kCols, slot_col = c0 + tid % kCols;   // gate row n0 + j
    if (tid < kGemm1Rows * kCols && slot_col < tab.ncols) {
      float gate = 0.f, up = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        gate += part[w][j / 8][j % 8][tid % kCols];
        up += part[w][kTiles + j / 8][j % 8][tid % kCols];
      }
      if (p.swiglu) {
        gate = fminf(gate, limit);
        up = fminf(fmaxf(up, -limit), limit);
      }
      const float act = gate / (1.f + __expf(-gate)) * up;
      h[(int64_t)tab.cols[slot_col] * p.inter + n0 + j] = __float2bfloat16_rn(act);
    }
    __syncthreads();   // part[] is reused by the next pass
  }
}

__device__ __forceinline__ float topk_weight(const Fp4MoeDecodeParams& p, int slot) {
  if (p.tw_dtype == 0) return __ldcg(reinterpret_cast<const float*>(p.topk_weights) + slot);
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p.topk_weights) + slot);
  if (p.tw_dtype == 1) return __bfloat162float(__ushort_as_bfloat16(bits));
  return __half2float(__ushort_as_half(bits));
}

// ---- gemm2: y = h W2^T per slot, then the tile's last block combines the slots of every token ---------------
// Lane-row r is W2 row (output column) n0 + 8 r + g.
__device__ __forceinline__ Rows gemm2_rows(const Fp4MoeDecodeParams& p, int e, int n0, int g) {
  const uint8_t* wbase = reinterpret_cast<const uint8_t*>(p.w2) + (int64_t)e * p.w2_stride_e;
  const int64_t sbase = (int64_t)e * p.s2_stride_e;
  Rows rows;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = n0 + 8 * r + g;
    rows.w[r] = wbase + row * p.w2_stride_n;
    rows.s[r] = sbase + row * p.s2_stride_n;
  }
  return rows;
}

template <bool kScaleF32>
__global__ void __launch_bounds__(kThreads, kMinBlocks) fp4_moe_gemm2_kernel(Fp4MoeDecodeParams p) {
  __shared__ SlotTable tab;
  __shared__ float part[kWarps][kRows][8][kCols];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int n0 = blockIdx.x * kGemm2Rows;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  // topk_ids were written before gemm1 started (gemm1 passed its pdl_wait before letting this grid in)
  WeightStep ring[kStages];
  Rows rows;
  bool primed = false;
  if (kEarlyWeights && p.M * p.topk <= kEarlyMaxSlots) {   // as in gemm1
    const int e0 = slot_expert(p, blockIdx.y);
    if (e0 >= 0) {
      rows = gemm2_rows(p, e0, n0, g);
      prime_weights<kScaleF32>(ring, rows, p.s2, (int)(p.inter / kStepK), warp, c);
      primed = true;
    }
  }
  int n_valid;
  const int e = route_block(p, tab, &n_valid);
  if (e < 0) {
    if (n_valid == 0 && blockIdx.y == 0) {   // no valid slot at all: nobody else writes this tile
      pdl_wait();
      for (int i = tid; i < p.M * kGemm2Rows; i += kThreads)
        out[(int64_t)(i / kGemm2Rows) * p.out_stride + n0 + i % kGemm2Rows] = __float2bfloat16_rn(0.f);
    }
    return;
  }
  if (!primed) rows = gemm2_rows(p, e, n0, g);
  const int steps = (int)(p.inter / kStepK);
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(p.h);
  for (int c0 = 0; c0 < tab.ncols; c0 += kCols) {
    const int col = c0 + g;
    const __nv_bfloat16* brow = col < tab.ncols ? h + (int64_t)tab.cols[col] * p.inter : nullptr;
    float acc[kTiles][4];
    warp_gemm<kScaleF32, true>(acc, ring, primed && c0 == 0, rows, p.s2, brow, steps, warp, c);   // waits for gemm1 inside
    store_partials(part[warp], acc, g, c);
    __syncthreads();
    for (int i = tid; i < kGemm2Rows * kCols; i += kThreads) {
      const int j = i / kCols, slot_col = c0 + i % kCols;   // output column n0 + j
      if (slot_col < tab.ncols) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += part[w][j / 8][j % 8][i % kCols];
        p.y[(int64_t)tab.cols[slot_col] * p.hidden + n0 + j] = v;
      }
    }
    __syncthreads();
  }
  pdl_launch_dependents();
  // Last block of this column tile (by slots done, which every block counts the same way) combines.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int done = atomicAdd(&p.counters[blockIdx.x], tab.ncols) + tab.ncols;
    tab.last = done == n_valid;
  }
  __syncthreads();
  if (!tab.last) return;
  __threadfence();
  const float rsf = (float)p.rsf;
  for (int i = tid; i < p.M * kGemm2Rows; i += kThreads) {
    const int t = i / kGemm2Rows, col = n0 + i % kGemm2Rows;
    float acc = 0.f;
    for (int k = 0; k < p.topk; ++k) {   // fixed order: bit-identical across runs
      const int slot = t * (int)p.topk + k;
      if (tab.expert[slot] >= 0) acc += topk_weight(p, slot) * __ldcg(p.y + (int64_t)slot * p.hidden + col);
    }
    out[(int64_t)t * p.out_stride + col] = __float2bfloat16_rn(acc * rsf);
  }
}

}  // namespace fp4moe
}  // namespace dsv4

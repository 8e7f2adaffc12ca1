// Sparse FP8 MLA decode, version 3 ("mma64"): 64 heads per block, Q and O in registers, cp.async
// staging of the raw 584-byte token rows, double-buffered bf16 K/V tile. SM80+ ISA only (mma.sync
// m16n8k16 bf16, ldmatrix, cp.async), shared by SM90 and SM120. Same contract and split-KV scheme as
// kernel.cuh / kernel_mma.cuh.
//
//   block = 8 warps (256 threads, one block per SM: 255 registers/thread), kM64Heads = 64 heads (4 m16
//   tiles) of one (row, split), or 32 / 16 heads (template MT = 2 / 1, impl 3 / 4: only those m16 tiles
//   are computed; S by all 8 warps, split over the dims); token tile kM64Tok = 32. Three barriers per tile i:
//     barrier C  buffer i%2 holds tile i (dequantised during PV of tile i-1, or by the prologue), the
//              staging area is free, PV of tile i-1 is done with P, alpha and buffer (i+1)%2.
//     issue    cp.async of tile i+1's raw rows into the staging area (invalid slots staged as zeros),
//              raw slot indices of tile i+2 into registers (tested only when they are issued: a test
//              right after the load stalls the warp for the whole global round trip).
//     phase 1  S = Q K^T of tile i from K/V buffer i%2: warp (mq = warp % MT, kq = warp / MT) computes
//              S[16 heads of mq, 32 tokens] over its 64 MT dims [kq * 64 MT, +64 MT): every
//              warp takes part, whatever the heads per block; Q A-fragments live in registers for the whole
//              block (16 MT registers: 64 / 32 / 16), K B-fragments via ldmatrix.x4; the warps kq >= 1 hand
//              their partials to kq = 0 through smem (Sx at MT = 4; at MT = 2 / 1 the 3 / 7 partials go to
//              the other K/V buffer, free from barrier C to barrier B). At MT = 4 the 4 mq warps each read
//              the same K fragments (128 KB of ldmatrix per tile), yet halving that made the kernel slower
//              (more instructions; it is latency-bound, docs/sparse_decode.md).  -- barrier A
//     phase 2  warps kq = 0: online softmax of tile i in registers (FlashAttention-2 style: a quad owns
//              a head row, max by quad shuffles), P -> smem bf16, alpha -> smem; then every thread waits
//              for its copies of tile i+1.                                             -- barrier B
//     phase 3  O = O * alpha + P V of tile i: warp w owns O[64 heads, dims 64w .. 64w+63] (128 fp32
//              registers), P via ldmatrix.x4, V via ldmatrix.x4.trans from buffer i%2; in the same basic
//              block (so the scheduler interleaves it with the mma.sync) warp w dequantises chunk w of
//              tile i+1 from the staging rows into buffer (i+1)%2 (exact, lane = token).
//   H100 (docs/sparse_decode.md): this order is 12-14 % faster at b >= 128 than the earlier one
//   (dequantisation by warps 4..7 during the softmax, two barriers), mostly from the deferred index test.
#pragma once
#include "kernel_mma.cuh"

namespace dsv4 {

constexpr int kM64Heads = 64;
constexpr int kM64Threads = 256;
constexpr int kM64Tok = 32;
constexpr int kM64StageData = kM64Tok * kRowBytes;              // 18432 B raw data rows
constexpr int kM64StageScale = kM64Tok * kScaleBytes;           //   256 B scale rows
constexpr int kM64StageBytes = kM64StageData + kM64StageScale + kM64Tok * 4;   // + valid flags = 18816 B
constexpr int kSxPitch = kM64Tok + 8;                           // fp32 per Sx row (conflict-free float2)
// K/V buffer layouts (template SWZ): rows of kKPitch bf16 (1040 B), or, swizzled, rows of 1024 B in which the
// 16-byte unit u of row (token) n sits at unit (u & ~7) | ((u ^ n) & 7). ldmatrix reads 8 consecutive rows at one
// unit and is conflict-free in both; the dequantisation's 16-byte stores (lane = row) are 2-way conflicted in
// the padded layout for every unit order that keeps its staging-row reads conflict-free, and conflict-free in
// the swizzled one with the unit orders in dequant_piece. H100, docs/sparse_decode.md: swizzled is
// 3-5.5 % faster at b = 1-2 (b = 1, h_q 64, extra 512: 8.8 -> 8.3 us) and 1-3 % for 16 / 32-head blocks at
// b = 128, within +-1 % at b = 4..32, and 1-2 % slower for unsplit 64-head blocks (b >= 128), so the launcher
// takes it for every launch but the latter.
constexpr int kM64KTile = kM64Tok * kKPitch;                    // bf16 elements per K/V buffer (the larger layout)
constexpr int kM64SmemRing = kM64StageBytes;                    // 18816 B (one staging stage)
constexpr int kM64SmemK = 2 * kM64KTile * 2;                    // 66560 B (two bf16 K/V tiles, pitch 520; swizzled: 65536 B used)
constexpr int kM64SmemSx = kM64Heads * kSxPitch * 4;            // 10240 B (partial S of kq = 1 at MT = 4; final m, l)
constexpr int kM64SmemP = kM64Heads * kPPitch * 2;              //  5120 B (P, bf16, pitch 40)
constexpr int kM64SmemStats = kM64Heads * 4 + 2 * kM64Tok * 4;  //   512 B (alpha; valid flags per K/V buffer)
// + 128 B of slack: the swizzled kernels align their regions to 128 bytes themselves (their addresses are XORs,
// exact only on 128-byte-aligned rows; the declared alignment of dynamic shared memory is 16 bytes)
constexpr int kM64SmemBytes = kM64SmemRing + kM64SmemK + kM64SmemSx + kM64SmemP + kM64SmemStats + 128;  // 101376 B
static_assert(kM64SmemBytes <= 101376, "SM120: at most 101376 B dynamic smem per block");
static_assert(kM64Threads == kM64Tok * 8, "cp.async mapping: 8 threads per token");
static_assert(kM64StageBytes % 16 == 0 && kM64SmemK % 16 == 0, "smem regions must stay 16-byte aligned");
static_assert(2 * kM64Heads <= kM64Heads * kSxPitch, "final m, l alias the Sx region");
// MT < 4: the 8 / MT - 1 partials of S (16 MT rows each, pitch kSxPitch floats) live in the idle K/V buffer
static_assert((8 - 1) * 16 * kSxPitch * 4 <= kM64Tok * kDim * 2, "MT = 1 S partials fit one K/V buffer");
static_assert(kM64SmemRing % 128 == 0, "the swizzled K/V rows start on 128-byte bank-group boundaries");

// 16 / 8 bytes global -> shared, asynchronous; src_bytes = 0 writes zeros and reads nothing (the
// slot is invalid: its staged row becomes all zeros, so the dequantisation needs no branch)
__device__ __forceinline__ void cp_async16(void* smem_ptr, const void* gmem_ptr, int src_bytes) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_ptr);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_ptr), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async8(void* smem_ptr, const void* gmem_ptr, int src_bytes) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_ptr);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem_ptr), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// two e4m3 (low byte first) * scale -> bf16x2 (exact: fp8 * 2^k fits bf16; one rounding as before)
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float s) {
  __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
  __half2 h;
  *(__half2_raw*)&h = hr;
  const float2 f = __half22float2(h);
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
  return *(uint32_t*)&b;
}

// 2^x for the softmax (x <= 0 or -inf): ex2.approx with flush-to-zero, without exp2f's extra
// instructions for results below 2^-126 (such a P is 0 in bf16 and negligible in the fp32 sum)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- pieces shared by the mma64 kernel and the warp-specialised one (kernel_ws.cuh) ----------------------------

// The swizzled K/V layout (kM64KTile) in a kernel's dynamic shared memory: its XOR addresses are exact only on
// 128-byte-aligned rows and the declared alignment is 16 bytes, so the kernels that use it allocate 128 B of slack and
// start their regions this many bytes further on.
__device__ __forceinline__ uint32_t m64_align128_offset(const void* smem_raw) {
  return (128u - ((uint32_t)__cvta_generic_to_shared(smem_raw) & 127u)) & 127u;
}
// The dequantisation's staging unit of token row n (lane = row) at step s, swizzled layout. NoPE (4 steps, each
// 16 fp8 -> units 2 kk, 2 kk + 1 of the row's chunk, stored at 2 kk ^ n, 2 kk + 1 ^ n): the staging reads of a quarter
// warp need kk distinct among the rows of one parity, the stores kk ^ m distinct too (m = n / 2 % 4): kk =
// sigma(m) ^ s with sigma = (0, 2, 3, 1), for which sigma(m) and sigma(m) ^ m are both permutations of 0..3
// (multiplication by a generator of GF(4)). RoPE (8 steps, a bf16 copy stored at kk ^ n): kk ^ 4 (n & 1), the staging
// read's bank group, and kk ^ n, the store's, are both distinct over a quarter warp.
__device__ __forceinline__ int m64_swz_nope_unit(int n, int s) { return ((0x78 >> (2 * ((n >> 1) & 3))) & 3) ^ s; }
__device__ __forceinline__ int m64_swz_rope_unit(int n, int s) { return ((n >> 1) & 3) ^ s; }

// Lane addresses of the tensor-core loops' ldmatrix reads of a K/V buffer, for both layouts (SWZ: swizzled rows of
// kDim bf16, else padded rows of kKPitch), computed once per tile (or 16-token step) and used by the mma64 kernel and
// the warp-specialised one alike.
// S loop, M64KFrags: ldmatrix.x4 = k-steps ks, ks + 1 (ks even) of n-tile j, i.e. rows (lane & 7) + 8 j, 16-byte unit
// d0 / 8 + 2 ks + (lane >> 3) (d0 a multiple of 64). Swizzled, the unit's in-group part (2 ks % 8) + (lane >> 3) is
// (2 ks % 8) ^ (lane >> 3), so its XOR with the row is (2 ks % 8) ^ cl, cl = (lane >> 3) ^ (lane & 7): two lane
// addresses, kb0 and kb4 = kb0 ^ 64 (unit cl ^ 4: the row address is 128-byte aligned).
template <bool SWZ>
struct M64KFrags {
  static constexpr int kPitch = SWZ ? kDim : kKPitch;   // bf16 elements per K/V row
  uint32_t kb0, kb4;                                    // swizzled
  const __nv_bfloat16* kb;                              // padded
  __device__ __forceinline__ M64KFrags(const __nv_bfloat16* Ks, int d0, int lane) {
    if constexpr (SWZ) {
      const int cl = (lane >> 3) ^ (lane & 7);
      kb0 = (uint32_t)__cvta_generic_to_shared(Ks + (lane & 7) * kPitch + d0 + 8 * cl);
      kb4 = kb0 ^ 64u;
    } else {
      kb = Ks + (lane & 7) * kPitch + d0 + 8 * (lane >> 3);
    }
  }
  __device__ __forceinline__ void load(uint32_t (&b)[4], int j, int ks) const {
    if constexpr (SWZ)
      ldsm_x4(b, ((ks & 2) ? kb4 : kb0) + 2 * (j * 8 * kPitch + (ks & ~3) * 16));
    else
      ldmatrix_x4(b, kb + j * 8 * kPitch + ks * 16);
  }
};
// P V loop, M64VFrags: ldmatrix.x4.trans = dims d0 + 16 np .. + 15 (np = 0..3, d0 a multiple of 64) of tokens kk ..
// kk + 15, i.e. row kk + (lane & 15), unit d0 / 8 + (lane >> 4) + 2 np. Swizzled, that unit is d0 / 8 + (((lane >> 4)
// ^ (lane & 7)) ^ 2 np) (the row's low 3 bits are lane & 7): one lane address, XORed with 32 np.
template <bool SWZ>
struct M64VFrags {
  static constexpr int kPitch = SWZ ? kDim : kKPitch;
  uint32_t vsw;                // swizzled
  const __nv_bfloat16* vrow;   // padded
  __device__ __forceinline__ M64VFrags(const __nv_bfloat16* Ks, int kk, int d0, int lane) {
    if constexpr (SWZ)
      vsw = (uint32_t)__cvta_generic_to_shared(Ks + (kk + (lane & 15)) * kPitch + d0) + 16 * ((lane >> 4) ^ (lane & 7));
    else
      vrow = Ks + (kk + (lane & 15)) * kPitch + d0 + 8 * (lane >> 4);
  }
  __device__ __forceinline__ void load(uint32_t (&bb)[4], int np) const {
    if constexpr (SWZ)
      ldsm_x4_trans(bb, vsw ^ (32u * np));
    else
      ldmatrix_x4_trans(bb, vrow + 16 * np);
  }
};

// cp.async of one tile's raw rows into the staging area: 8 threads per token (gn), part gj copies 16-byte chunks
// gj, gj + 8, ... of the 576-byte row, part 7 the 8-byte scale row, part 0 writes the valid flag. An invalid
// slot (idx < 0) stages zeros (src size 0): no branch in the dequantisation.
__device__ __forceinline__ void m64_stage_rows(const SparseDecodeParams& p, unsigned char* ring, int64_t t0, int raw_idx,
                                               int gn, int gj, int64_t pos_end, int64_t main_lim, int64_t extra_lim) {
  const int64_t pos = t0 + gn;
  const int idx = slot_resolve(p, raw_idx, pos, pos_end, main_lim, extra_lim);
  if (gj == 0) ((int*)(ring + kM64StageData + kM64StageScale))[gn] = idx >= 0;
  const uint8_t* srow = (const uint8_t*)p.k_cache;
  const uint8_t* tok = srow;
  if (idx >= 0) tok = token_row(p, pos >= p.topk, idx, &srow);
  const int nb = idx >= 0 ? 16 : 0;
  unsigned char* dst = ring + gn * kRowBytes;
#pragma unroll
  for (int k = 0; k < 4; ++k) cp_async16(dst + 16 * (gj + 8 * k), tok + 16 * (gj + 8 * k), nb);
  if (gj < 4) cp_async16(dst + 16 * (32 + gj), tok + 16 * (32 + gj), nb);
  if (gj == 7) cp_async8(ring + kM64StageData + gn * kScaleBytes, srow, nb / 2);
}

// Q A-fragments of head rows hl, hl + 8 (zero beyond h_end), dims d0 + 16 ks + 2 t4 (+8), ks < kKSteps. Even
// strides + a 4-byte-aligned base (the usual case): each bf16 pair is one 4-byte load, which halves the load
// instructions (64 KB of Q per 64-head block; on the b = 1 critical path).
template <int kKSteps>
__device__ __forceinline__ void m64_load_q(const SparseDecodeParams& p, uint32_t (&qf)[kKSteps][4], int64_t bi, int64_t si,
                                           int hl, int h_end, int d0, int t4) {
  const unsigned short* q = (const unsigned short*)p.q;
  const int hh = hl + 8;
  const int64_t qb = bi * p.q_stride_b + si * p.q_stride_s;
  const unsigned short* ql = q + qb + (int64_t)hl * p.q_stride_h + d0 + 2 * t4;
  const unsigned short* qh = q + qb + (int64_t)hh * p.q_stride_h + d0 + 2 * t4;
  const bool vl = hl < h_end, vh = hh < h_end;
  const bool pairs = ((p.q_stride_b | p.q_stride_s | p.q_stride_h) & 1) == 0 && ((uintptr_t)p.q & 3) == 0;
  if (pairs) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int d = 16 * ks;
      qf[ks][0] = vl ? __ldg((const unsigned int*)(ql + d)) : 0u;
      qf[ks][1] = vh ? __ldg((const unsigned int*)(qh + d)) : 0u;
      qf[ks][2] = vl ? __ldg((const unsigned int*)(ql + d + 8)) : 0u;
      qf[ks][3] = vh ? __ldg((const unsigned int*)(qh + d + 8)) : 0u;
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int d = 16 * ks;
      qf[ks][0] = vl ? (uint32_t)__ldg(ql + d) | ((uint32_t)__ldg(ql + d + 1) << 16) : 0u;
      qf[ks][1] = vh ? (uint32_t)__ldg(qh + d) | ((uint32_t)__ldg(qh + d + 1) << 16) : 0u;
      qf[ks][2] = vl ? (uint32_t)__ldg(ql + d + 8) | ((uint32_t)__ldg(ql + d + 9) << 16) : 0u;
      qf[ks][3] = vh ? (uint32_t)__ldg(qh + d + 8) | ((uint32_t)__ldg(qh + d + 9) << 16) : 0u;
    }
  }
}

// Online softmax of one m16 tile of head rows over one 32-token tile (fp32, base 2), shared by the 64-head kernels:
// sacc = the tile's S fragment (rows g, g + 8; tokens 8 j + 2 t4 (+1)), complete over the dims; slots whose flag in
// vf is 0 are masked; updates the running max m (scaled) and this thread's part of the sum l (reduced over t4 at
// the end), writes P as bf16 into rows r, r + 8 of the P tile Pt (columns 2 t4 (+1) + 8 j) and, from t4 = 0, the
// factors that rescale those rows of O to alpha[r], alpha[r + 8]. l sums the fp32 P, P V uses the bf16 P.
__device__ __forceinline__ void m64_softmax_tile(float (&sacc)[4][4], const int* vf, float scale2, float& m_lo,
                                                 float& m_hi, float& l_lo, float& l_hi, __nv_bfloat16* Pt,
                                                 float* alpha, int r, int t4) {
  float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool v0 = vf[8 * j + 2 * t4] != 0, v1 = vf[8 * j + 2 * t4 + 1] != 0;
    sacc[j][0] = v0 ? sacc[j][0] * scale2 : -INFINITY;
    sacc[j][1] = v1 ? sacc[j][1] * scale2 : -INFINITY;
    sacc[j][2] = v0 ? sacc[j][2] * scale2 : -INFINITY;
    sacc[j][3] = v1 ? sacc[j][3] * scale2 : -INFINITY;
    mx_lo = fmaxf(mx_lo, fmaxf(sacc[j][0], sacc[j][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sacc[j][2], sacc[j][3]));
  }
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
  const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
  const float al_lo = fast_exp2(m_lo - mu_lo), al_hi = fast_exp2(m_hi - mu_hi);
  m_lo = mn_lo; m_hi = mn_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
  __nv_bfloat16* pr = Pt + r * kPPitch + 2 * t4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float e0 = fast_exp2(sacc[j][0] - mu_lo), e1 = fast_exp2(sacc[j][1] - mu_lo);
    const float e2 = fast_exp2(sacc[j][2] - mu_hi), e3 = fast_exp2(sacc[j][3] - mu_hi);
    sum_lo += e0 + e1;
    sum_hi += e2 + e3;
    *(__nv_bfloat162*)(pr + 8 * j) = __floats2bfloat162_rn(e0, e1);
    *(__nv_bfloat162*)(pr + 8 * kPPitch + 8 * j) = __floats2bfloat162_rn(e2, e3);
  }
  l_lo = l_lo * al_lo + sum_lo;
  l_hi = l_hi * al_hi + sum_hi;
  if (t4 == 0) { alpha[r] = al_lo; alpha[r + 8] = al_hi; }
}

// End of the softmax of rows r, r + 8: l summed over the 4 lanes of a row (t4), final m and l -> Mf, Lf; and with
// `unsplit` (the warp-specialised kernel without split) lane t4 = 0 also turns the row's final m, l (and its sink
// value in Sf) into its lse and output factor -> Lse, Inv. Why: the S warps are done a tile before the P V
// warps, whose unsplit epilogue then reads two floats per row instead of running a MUFU / division chain per row,
// which (with the stores' half sectors, m64_store_rows) kept its rows going out one after the other (H100).
// The split epilogue, whose fp32 partials take as long however the factors arrive, computes them from Mf, Lf as
// before (from Lse, Inv it was ~1 us slower at b = 32, H100).
__device__ __forceinline__ void m64_store_final(float m_lo, float m_hi, float l_lo, float l_hi, const float* Sf,
                                                bool unsplit, bool with_sink, float* Mf, float* Lf, float* Lse,
                                                float* Inv, int r, int t4) {
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  if (t4 == 0) {
    Mf[r] = m_lo; Lf[r] = l_lo;
    Mf[r + 8] = m_hi; Lf[r + 8] = l_hi;
    if (unsplit) {
      const RowFinal lo = finalize_row(m_lo, l_lo, with_sink, Sf[r]), hi = finalize_row(m_hi, l_hi, with_sink, Sf[r + 8]);
      Lse[r] = lo.lse; Inv[r] = lo.inv;
      Lse[r + 8] = hi.lse; Inv[r + 8] = hi.inv;
    }
  }
}

// The same without the lse / factor part (the 8-warp kernel): m64_store_final with unsplit = false, which the
// compiler folds away (the 8-warp kernels' SASS is byte-identical to the earlier separate copy).
__device__ __forceinline__ void m64_store_ml(float m_lo, float m_hi, float l_lo, float l_hi, float* Mf, float* Lf,
                                             int r, int t4) {
  m64_store_final(m_lo, m_hi, l_lo, l_hi, nullptr, false, false, Mf, Lf, nullptr, nullptr, r, t4);
}

// O *= alpha per head row before a tile's P V (rows 16 m + g, 16 m + g + 8 of the block's MT m16 tiles)
template <int MT>
__device__ __forceinline__ void m64_rescale_o(float (&acc)[4][8][4], const float* alpha, int g) {
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const float a_lo = alpha[m * 16 + g], a_hi = alpha[m * 16 + g + 8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      acc[m][n][0] *= a_lo; acc[m][n][1] *= a_lo; acc[m][n][2] *= a_hi; acc[m][n][3] *= a_hi;
    }
  }
}

// Epilogue of the 64-head kernels: the block's O[MT m16 tiles of heads (of acc's 4), dims 64 warp .. 64 warp + 63]
// (mma.sync accumulator layout) times the final factor of each head row, stored as the bf16 output + lse (no split)
// or as the fp32 partial + lse of this split. final_of(m, half, r): RowFinal (lse, factor) of head row r = 16 m + g +
// 8 half: the 8-warp kernel computes it here from the final m, l in shared memory (Mf, Lf) and the sink values in
// registers; the warp-specialised one reads, unsplit, what its S warps computed (m64_store_final).
// kStaged (the warp-specialised kernel): the bf16 rows go out through shared memory as whole 128-byte rows. In the
// accumulator layout lane t4 holds 4 bytes of each 16-byte run (dims 8 n + 2 t4, + 1), so a direct warp store
// writes 8 half sectors. Each warp writes its rows into its own 8 KB of `scratch` (row r = 128 bytes, 16-byte piece n
// at n ^ (r & 7): conflict-free both ways) and stores 4 whole rows per warp store; no block barrier. `scratch`:
// 8 x 8 KB of shared memory nothing uses any more (staging area + K/V buffers after the last tile). H100, b =
// 128: the unsplit epilogue took ~4.7 us, staged alone as long, with the factors from the S warps alone as long,
// both together ~3.2 us (1.5-3 % of the call at extra 512). The 8-warp kernels keep the direct stores (staged, the
// 64-head one spilled 40 B on sm_120a; the others were not faster). The fp32 partials' 8-byte stores fill whole
// sectors already.
constexpr int kM64WarpScratch = kM64Heads * 128;   // bytes of `scratch` per warp: 64 rows x 64 bf16
static_assert(8 * kM64WarpScratch <= kM64SmemRing + kM64SmemK, "the epilogue's scratch: staging area + K/V buffers");
template <int MT, bool kStaged, class FinalOf>
__device__ __forceinline__ void m64_store_rows(const SparseDecodeParams& p, const float (&acc)[4][8][4],
                                               FinalOf final_of, int64_t row, int64_t bi, int64_t si, int split,
                                               int h0, int h_end, int warp, int g, int t4, unsigned char* scratch) {
  unsigned char* const sw = scratch + warp * kM64WarpScratch;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + g + 8 * half;
      const int h = h0 + r;
      if (h >= h_end) continue;
      const RowFinal f = final_of(m, half, r);
      const float lse = f.lse, inv = f.inv;
      if (p.num_splits == 1) {
        __nv_bfloat16* o = (__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim + 64 * warp + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(acc[m][n][2 * half] * inv, acc[m][n][2 * half + 1] * inv);
          if constexpr (kStaged)
            *(__nv_bfloat162*)(sw + r * 128 + ((n ^ g) << 4) + 4 * t4) = v;
          else
            *(__nv_bfloat162*)(o + 8 * n) = v;
        }
        if (warp == 0 && t4 == 0) p.lse[(bi * p.h_q + h) * p.s_q + si] = lse_out(lse);
      } else {
        const int64_t prw = ((int64_t)split * p.b * p.s_q + row) * p.h_q + h;
        float* o = p.o_part + prw * kDim + 64 * warp + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *(float2*)(o + 8 * n) = make_float2(acc[m][n][2 * half] * inv, acc[m][n][2 * half + 1] * inv);
        if (warp == 0 && t4 == 0) p.lse_part[prw] = lse;
      }
    }
  }
  if constexpr (kStaged) {
    if (p.num_splits == 1) {
      __syncwarp();
      const int lane = 4 * g + t4, k = lane & 7;
#pragma unroll
      for (int i = 0; i < 4 * MT; ++i) {
        const int r = 4 * i + (lane >> 3);
        const int h = h0 + r;
        if (h < h_end)
          *(uint4*)((__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim + 64 * warp + 8 * k) =
              *(const uint4*)(sw + r * 128 + ((k ^ (r & 7)) << 4));
      }
    }
  }
}

// MT: m16 tiles with real heads (4: 64 heads per block; 2 / 1: 32 / 16, impl 3 / 4). With MT < 4 the rows
// beyond the block's heads are skipped (no S, softmax or PV on them) instead of computed as zero rows.
// SWZ: the swizzled K/V layout (see kM64KTile).
template <int MT, bool SWZ>
__global__ void __launch_bounds__(kM64Threads, 1)
sparse_decode_mma64_kernel(const SparseDecodeParams p) {
  static_assert(MT == 4 || MT == 2 || MT == 1, "m16 tiles per block: 4, 2 or 1");
  constexpr int kPitchKV = SWZ ? kDim : kKPitch;   // bf16 elements per K/V row
  constexpr int kTileKV = kM64Tok * kPitchKV;      // bf16 elements per K/V buffer
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // swizzled: regions aligned to 128 bytes here (the XOR addresses below need it); padded: as allocated
  unsigned char* const smem = SWZ ? smem_raw + m64_align128_offset(smem_raw) : smem_raw;
  pdl_launch_dependents();   // the combine grid gets scheduled early; it waits for this grid's completion
  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  unsigned char* ring = smem;                                             // staging rows of one tile
  __nv_bfloat16* Kb = (__nv_bfloat16*)(smem + kM64SmemRing);              // K/V buffers 0, 1
  float* Sx = (float*)(smem + kM64SmemRing + kM64SmemK);
  __nv_bfloat16* Ps = (__nv_bfloat16*)(smem + kM64SmemRing + kM64SmemK + kM64SmemSx);
  float* As = (float*)(smem + kM64SmemRing + kM64SmemK + kM64SmemSx + kM64SmemP);
  int* Vf = (int*)(As + kM64Heads);                                       // valid flags per K/V buffer
  float* Mf = Sx;                                                         // epilogue only (Sx is dead)
  float* Lf = Sx + kM64Heads;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // S / softmax roles: warp (mq, kq) = m16 tile mq, dims [kq * kDims, +kDims) with kDims = 64 MT, i.e. all 8
  // warps compute S (with MT < 4 fewer heads per warp-row, so more warps along the dims: H100, before it
  // only warps 0 .. 2 MT - 1 did, over 256 dims each). The softmax warps kq = 0 are 0 .. MT - 1.
  constexpr int kDims = 64 * MT;       // S split over the dims: 8 / MT warps per m16 tile, 512 / (8 / MT) dims each
  constexpr int kKSteps = kDims / 16;   // k16 steps of a warp's S (16 / 8 / 4 for MT = 4 / 2 / 1)
  const int mq = warp % MT, kq = warp / MT;
  // heads per block: 64, or 32 / 16 (MT = 2 / 1; ops/sparse_decode.mma64_heads_per_block: when they hold
  // all heads or the grid is small): each block stores fewer head rows
  // and computes fewer m16 tiles, and the grid has more blocks (at b = 1 the partial stores are a large
  // part of the block's time)
  const int hpb = 16 * MT;
  const int head_blocks = (int)((p.h_q + hpb - 1) / hpb);
  const int64_t row = blockIdx.x / head_blocks;
  const int h0 = (int)(blockIdx.x - row * head_blocks) * hpb;
  const int h_end = (int)min((int64_t)h0 + hpb, p.h_q);   // this block's heads: [h0, h_end)
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int split = blockIdx.z;
  const int64_t total = p.topk + p.extra_topk;
  const int64_t pos_begin = (int64_t)split * p.split_tokens;
  const int64_t pos_end = min(total, pos_begin + p.split_tokens);
  const int64_t ntiles = pos_end > pos_begin ? (pos_end - pos_begin + kM64Tok - 1) / kM64Tok : 0;
  int64_t main_lim, extra_lim;
  slot_limits(p, bi, &main_lim, &extra_lim);

  // ---- cp.async of one tile's raw rows into the staging area (m64_stage_rows)
  const int gn = tid >> 3, gj = tid & 7;
  auto issue = [&](int64_t t0, int raw_idx) {
    m64_stage_rows(p, ring, t0, raw_idx, gn, gj, pos_end, main_lim, extra_lim);
  };
  if (ntiles > 0) issue(pos_begin, slot_load(p, bi, si, pos_begin + gn, pos_end));
  cp_async_commit();
  // raw index of the next tile: loaded now, tested when its rows are issued (slot_resolve in issue)
  int nidx = slot_load(p, bi, si, pos_begin + kM64Tok + gn, pos_end);

  // ---- dequantise 64-value chunk c (0..6 fp8 NoPE, 7 RoPE copy; warp-uniform) of every token (lane =
  //      token) from the staging rows into K/V buffer buf; rotated 16 B order (conflict-free reads of the
  //      staging rows; the bf16 stores into the 1040-byte rows stay 2-way conflicted, H100). Invalid
  //      slots were staged as zeros, so there is no branch on them. Chunk 0 also copies the valid flags.
  //      Done in 8 pieces (step 0..7) so that phase 3 can interleave them with its tensor-core steps.
  auto dequant_piece = [&](int c, int buf, int step) {
    const int n = lane;
    if (c == 0 && step == 0) Vf[buf * kM64Tok + n] = ((const int*)(ring + kM64StageData + kM64StageScale))[n];
    unsigned char* dst = (unsigned char*)(Kb + buf * kTileKV + n * kPitchKV + c * 64);
    if (c < 7) {
      // NoPE: 16 fp8 (16 B in) -> 16 bf16 (32 B out) on the even steps
      if (step & 1) return;
      const float sc = ue8m0_to_float(ring[kM64StageData + n * kScaleBytes + c]);
      // staging unit kk: the reads of a quarter warp need kk distinct among the rows of one parity; swizzled, the
      // stores too (m64_swz_nope_unit)
      const int kk = SWZ ? m64_swz_nope_unit(n, step >> 1) : ((step >> 1) + (n >> 1)) & 3;
      const uint4 raw = *(const uint4*)(ring + n * kRowBytes + c * 64 + 16 * kk);
      uint4 o0, o1;
      o0.x = e4m3x2_to_bf16x2(raw.x, sc); o0.y = e4m3x2_to_bf16x2(raw.x >> 16, sc);
      o0.z = e4m3x2_to_bf16x2(raw.y, sc); o0.w = e4m3x2_to_bf16x2(raw.y >> 16, sc);
      o1.x = e4m3x2_to_bf16x2(raw.z, sc); o1.y = e4m3x2_to_bf16x2(raw.z >> 16, sc);
      o1.z = e4m3x2_to_bf16x2(raw.w, sc); o1.w = e4m3x2_to_bf16x2(raw.w >> 16, sc);
      const int sw = SWZ ? (n & 7) : 0;
      ((uint4*)dst)[(2 * kk) ^ sw] = o0;
      ((uint4*)dst)[(2 * kk + 1) ^ sw] = o1;
    } else {
      // RoPE: a bf16 copy, 16 B per step (swizzled: m64_swz_rope_unit)
      const int kk = SWZ ? m64_swz_rope_unit(n, step) : (step + (n >> 1)) & 7;
      ((uint4*)dst)[SWZ ? kk ^ (n & 7) : kk] = *(const uint4*)(ring + n * kRowBytes + kNope + 16 * kk);
    }
  };
  auto dequant_chunk = [&](int c, int buf) {
#pragma unroll
    for (int step = 0; step < 8; ++step) dequant_piece(c, buf, step);
  };

  // ---- Q A-fragments (registers for the whole block): heads h0 + 16mq + g (+8), dims kDims kq + 16ks + 2t4 (+8)
  uint32_t qf[kKSteps][4];
  m64_load_q<kKSteps>(p, qf, bi, si, h0 + mq * 16 + g, h_end, kDims * kq, t4);

  const float scale2 = (float)(p.softmax_scale * 1.4426950408889634);
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // warps kq = 0: rows g, g + 8 of mq
  float acc[4][8][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;

  // ---- prologue: tile 0 into K/V buffer 0 (all warps)
  if (ntiles > 0) {
    cp_async_wait<0>();
    __syncthreads();
    dequant_chunk(warp, 0);
  }

  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    const __nv_bfloat16* Ks = Kb + buf * kTileKV;
    const int* vf = Vf + buf * kM64Tok;
    const bool has_next = it + 1 < ntiles;

    __syncthreads();      // C: buffer buf (tile it) dequantised, staging area free, PV of tile it-1 done

    // ---- rows of tile it+1 into the staging area: they land during S and the softmax of tile it;
    //      slot indices of tile it+2 into registers
    if (has_next) issue(pos_begin + (it + 1) * kM64Tok, nidx);
    cp_async_commit();
    nidx = slot_load(p, bi, si, pos_begin + (it + 2) * kM64Tok + gn, pos_end);

    // ---- phase 1: S partial: heads 16mq.., tokens 8j.., dims kDims kq + 16ks; ldmatrix.x4 = 2 k-steps of one
    //      n-tile (MT = 4: the four m16 warps of a kq half each read the same K fragments; see the header)
    float sacc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
    {
      const M64KFrags<SWZ> kfrag(Ks, kDims * kq, lane);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];
          kfrag.load(b, j, ks);
          mma_bf16_16816(sacc[j], qf[ks], b);
          mma_bf16_16816(sacc[j], qf[ks + 1], b + 2);
        }
      }
    }
    // partials of the warps kq >= 1: rows ((kq - 1) MT + mq) 16 + g of Sx (MT = 4) or of the K/V buffer that
    // holds no tile now (MT < 4: tile it-1 was consumed by PV before barrier C, tile it+1 is written into it
    // only after barrier B)
    float* const sxp = MT == 4 ? Sx : (float*)(Kb + (buf ^ 1) * kTileKV);
    if (kq > 0) {
      float* sx = sxp + (((kq - 1) * MT + mq) * 16 + g) * kSxPitch + 2 * t4;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *(float2*)(sx + 8 * j) = make_float2(sacc[j][0], sacc[j][1]);
        *(float2*)(sx + 8 * kSxPitch + 8 * j) = make_float2(sacc[j][2], sacc[j][3]);
      }
    }
    __syncthreads();      // A: partials of kq >= 1 visible

    // ---- phase 2: kq = 0 softmax of tile it
    if (kq == 0) {  // online softmax in registers (fp32, base 2); l from fp32 P, PV uses P in bf16
      // the other warps' partials, added in kq order (the same order on every launch)
#pragma unroll
      for (int r = 0; r < 8 / MT - 1; ++r) {
        const float* sx = sxp + ((r * MT + mq) * 16 + g) * kSxPitch + 2 * t4;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 lo = *(const float2*)(sx + 8 * j);
          const float2 hi = *(const float2*)(sx + 8 * kSxPitch + 8 * j);
          sacc[j][0] += lo.x; sacc[j][1] += lo.y; sacc[j][2] += hi.x; sacc[j][3] += hi.y;
        }
      }
      m64_softmax_tile(sacc, vf, scale2, m_lo, m_hi, l_lo, l_hi, Ps, As, mq * 16 + g, t4);
    }
    cp_async_wait<0>();   // this thread's copies of tile it+1 have landed
    __syncthreads();      // B: P, alpha ready; staging rows of tile it+1 visible

    // ---- phase 3: O = O * alpha + P V of tile it (tensor-core bound), and in the same basic block
    //      chunk `warp` of tile it+1 from the staging rows into buffer buf^1: its conversions and
    //      shared-memory traffic fill the issue slots between the mma.sync (one piece per V fragment)
    auto pv = [&](auto&& hook) {
      m64_rescale_o<MT>(acc, As, g);
#pragma unroll
      for (int kk = 0; kk < kM64Tok; kk += 16) {
        uint32_t pa[4][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
          ldmatrix_x4(pa[m], Ps + (m * 16 + (lane & 15)) * kPPitch + kk + 8 * (lane >> 4));
        const M64VFrags<SWZ> vfrag(Ks, kk, 64 * warp, lane);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bb[4];
          vfrag.load(bb, np);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_bf16_16816(acc[m][2 * np], pa[m], bb);
            mma_bf16_16816(acc[m][2 * np + 1], pa[m], bb + 2);
          }
          hook((kk / 16) * 4 + np);
        }
      }
    };
    if (!has_next) {
      pv([](int) {});
    } else if (warp < 7) {
      pv([&](int step) { dequant_piece(warp, buf ^ 1, step); });
    } else {
      pv([&](int step) { dequant_piece(7, buf ^ 1, step); });
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: final m, l of each head row -> smem. The sink values of this thread's 8 head rows are
  //      loaded before the barrier so that global round trip overlaps it (it used to sit inside the store
  //      loop, one dependent load per row).
  float sink[4][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = h0 + m * 16 + g + 8 * half;
      sink[m][half] = (p.num_splits == 1 && p.attn_sink != nullptr && h < h_end) ? p.attn_sink[h] : 0.f;
    }
  if (kq == 0) {
    m64_store_ml(m_lo, m_hi, l_lo, l_hi, Mf, Lf, mq * 16 + g, t4);
  }
  __syncthreads();
  m64_store_rows<MT, false>(
      p, acc,
      [&](int m, int half, int r) {
        return finalize_row(Mf[r], Lf[r], p.num_splits == 1 && p.attn_sink != nullptr, sink[m][half]);
      },
      row, bi, si, split, h0, h_end, warp, g, t4, smem);
}

}  // namespace dsv4

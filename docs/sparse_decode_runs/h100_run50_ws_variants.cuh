// Sparse FP8 MLA decode, warp-specialised 64-head block ("mma64ws", impl 5). Same contract, split-KV
// scheme, staging and dequantisation as kernel_mma64.cuh; SM80+ ISA only (mma.sync m16n8k16 bf16,
// ldmatrix, cp.async, named barriers), shared by SM90 and SM120.
//
// Why: the 8-warp mma64 block holds Q (64 registers) and O (128) in every warp, so it runs two warps per
// scheduler, the S, softmax and PV phases of a tile one after the other, and the tensor pipe idles in
// the softmax and the S partial exchange (27 % of the mma.sync ceiling at b = 128, docs/sparse_decode.md
// runs 29-36). Here the two register-hungry states live in different warps, and the two phases of
// consecutive tiles run at the same time:
//   S warps  (kWsSWarps = 4, warps 8..11, one per scheduler): warp mq holds Q of heads 16 mq .. 16 mq + 15
//            over all 512 dims (128 registers, no partials to exchange), computes S of tile i from K/V
//            buffer i % 2, the online softmax of its rows, and writes P and alpha of tile i into their
//            buffer i % 2.
//   PV warps (kWsPvWarps = 8, warps 0..7, two per scheduler): warp w owns O[64 heads, dims 64 w ..
//            64 w + 63] (128 registers), does O = O * alpha + P V of tile i, then dequantises tile i + 2
//            from the staging rows into buffer i % 2 (chunk w, lane = token) and issues the cp.async of
//            tile i + 3; the PV warps also do the prologue (tiles 0 and 1) and the epilogue.
//   So while the PV warps work on tile i, the S warps work on tile i + 1: 3 warps per scheduler, all
//   issuing mma.sync. 384 threads -> at most 168 registers per thread on SM120 and SM90.
// Hand-offs (named barriers, count 384 = producers' bar.arrive + consumers' bar.sync):
//   kWsBarKReady + j: PV warps -> S warps, K/V buffer j holds its next tile (and its valid flags)
//   kWsBarPReady + j: S warps -> PV warps, P / alpha buffer j hold the tile of buffer j
//   kWsBarPv (256): among the PV warps, around the staging area and the K/V buffer they rewrite.
// A buffer's next use is ordered by these alone: the S warps rewrite P / alpha j (tile i + 2) only after
// kWsBarKReady + j for tile i + 2, which the PV warps arrive at after PV(i) has read P / alpha j.
#pragma once
#include "kernel_mma64.cuh"

namespace dsv4 {

constexpr int kWsPvWarps = 8;
constexpr int kWsSWarps = 4;                                     // kM64Heads / 16: one m16 tile each
constexpr int kWsPvThreads = 32 * kWsPvWarps;                    // 256 = 8 threads per token of a tile
constexpr int kWsThreads = 32 * (kWsPvWarps + kWsSWarps);        // 384
#ifndef DSV4_WS_PV_REGS
#define DSV4_WS_PV_REGS 160
#endif
#ifndef DSV4_WS_L2PF
#define DSV4_WS_L2PF 0
#endif
#ifndef DSV4_WS_ABLATE
#define DSV4_WS_ABLATE 0
#endif
#ifndef DSV4_WS_BULK
#define DSV4_WS_BULK 0
#endif
#ifndef DSV4_WS_SMEMIDX
#define DSV4_WS_SMEMIDX 0
#endif
#ifndef DSV4_WS_S8
#define DSV4_WS_S8 0
#endif
constexpr int kWsPvRegs = DSV4_WS_PV_REGS;
constexpr int kWsSRegs = (65536 / kWsThreads / 8 * 8 * kWsThreads - kWsPvThreads * kWsPvRegs) / (kWsThreads - kWsPvThreads) / 8 * 8;
constexpr int kWsBarPv = 1, kWsBarKReady = 2, kWsBarPReady = 4;  // named barrier ids (0 = __syncthreads)
// shared memory (padded K/V rows of kKPitch bf16, as the unsplit mma64 kernel):
constexpr int kWsSmemStage = kM64StageBytes;                     // 18816 B raw rows, scales, flags of one tile
constexpr int kWsSmemK = 2 * kM64Tok * kKPitch * 2;              // 66560 B two bf16 K/V tiles
constexpr int kWsSmemP = 2 * kM64Heads * kPPitch * 2;            // 10240 B two P tiles (bf16, pitch 40)
constexpr int kWsSmemAlpha = 2 * kM64Heads * 4;                  //   512 B two alpha vectors
constexpr int kWsSmemValid = 2 * kM64Tok * 4;                    //   256 B valid flags per K/V buffer
constexpr int kWsSmemML = 2 * kM64Heads * 4;                     //   512 B final m, l
constexpr int kWsSmemBar = 16;                                   //    16 B mbarrier of the staging area
constexpr int kWsSmemIdx = 2 * kM64Tok * 4;                      //   256 B raw slot indices of the next two tiles
constexpr int kWsSmemBytes = kWsSmemStage + kWsSmemK + kWsSmemP + kWsSmemAlpha + kWsSmemValid + kWsSmemML + kWsSmemBar + kWsSmemIdx;  // 97168 B
static_assert(kWsSmemBytes <= 101376, "SM120: at most 101376 B dynamic smem per block");
static_assert(kWsPvThreads == kM64Tok * 8, "cp.async mapping: 8 threads per token");
static_assert(kWsSWarps * 16 == kM64Heads && kWsPvWarps * 64 == kDim, "warp roles cover the block");

#if DSV4_WS_TRACE
__device__ long long dsv4_ws_trace[16 * 4096];
#define WS_TR(pt, v) do { if (blockIdx.x < 4096 && blockIdx.z == 0) dsv4_ws_trace[(pt) * 4096 + blockIdx.x] = (v); } while (0)
#define WS_CLK(var) var = clock64()
#else
#define WS_CLK(var) do {} while (0)
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, int bytes) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// global -> shared bulk copy (the copy engine; bytes and both addresses multiples of 16), completion counted on bar
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__global__ void __launch_bounds__(kWsThreads, 1)
sparse_decode_ws_kernel(const SparseDecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_launch_dependents();   // the combine grid gets scheduled early; it waits for this grid's completion
  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  unsigned char* ring = smem;
  __nv_bfloat16* Kb = (__nv_bfloat16*)(smem + kWsSmemStage);
  __nv_bfloat16* Pb = (__nv_bfloat16*)(smem + kWsSmemStage + kWsSmemK);
  float* Ab = (float*)(smem + kWsSmemStage + kWsSmemK + kWsSmemP);
  int* Vf = (int*)(Ab + 2 * kM64Heads);
  float* Mf = (float*)(Vf + 2 * kM64Tok);
  float* Lf = Mf + kM64Heads;
  [[maybe_unused]] const uint32_t sbar = (uint32_t)__cvta_generic_to_shared(Lf + kM64Heads);
  [[maybe_unused]] int* Ix = (int*)(Lf + kM64Heads + 4);
  constexpr int kTileKV = kM64Tok * kKPitch;   // bf16 elements per K/V buffer
  constexpr int kTileP = kM64Heads * kPPitch;  // bf16 elements per P buffer

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int head_blocks = (int)((p.h_q + kM64Heads - 1) / kM64Heads);
  const int64_t row = blockIdx.x / head_blocks;
  const int h0 = (int)(blockIdx.x - row * head_blocks) * kM64Heads;
  const int h_end = (int)min((int64_t)h0 + kM64Heads, p.h_q);
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int split = blockIdx.z;
  const int64_t total = p.topk + p.extra_topk;
  const int64_t pos_begin = (int64_t)split * p.split_tokens;
  const int64_t pos_end = min(total, pos_begin + p.split_tokens);
  const int64_t ntiles = pos_end > pos_begin ? (pos_end - pos_begin + kM64Tok - 1) / kM64Tok : 0;

  if (warp >= kWsPvWarps) {
    // ================= S warps: S = Q K^T and the online softmax of heads 16 mq .. 16 mq + 15 =================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsSRegs));
    const int mq = warp - kWsPvWarps;
    uint32_t qf[kDim / 16][4];   // A-fragments: heads h0 + 16 mq + g (+8), dims 16 ks + 2 t4 (+8)
    {
      const unsigned short* q = (const unsigned short*)p.q;
      const int hl = h0 + mq * 16 + g, hh = hl + 8;
      const int64_t qb = bi * p.q_stride_b + si * p.q_stride_s;
      const unsigned short* ql = q + qb + (int64_t)hl * p.q_stride_h + 2 * t4;
      const unsigned short* qh = q + qb + (int64_t)hh * p.q_stride_h + 2 * t4;
      const bool vl = hl < h_end, vh = hh < h_end;
      const bool pairs = ((p.q_stride_b | p.q_stride_s | p.q_stride_h) & 1) == 0 && ((uintptr_t)p.q & 3) == 0;
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ++ks) {
        const int d = 16 * ks;
        if (pairs) {
          qf[ks][0] = vl ? __ldg((const unsigned int*)(ql + d)) : 0u;
          qf[ks][1] = vh ? __ldg((const unsigned int*)(qh + d)) : 0u;
          qf[ks][2] = vl ? __ldg((const unsigned int*)(ql + d + 8)) : 0u;
          qf[ks][3] = vh ? __ldg((const unsigned int*)(qh + d + 8)) : 0u;
        } else {
          qf[ks][0] = vl ? (uint32_t)__ldg(ql + d) | ((uint32_t)__ldg(ql + d + 1) << 16) : 0u;
          qf[ks][1] = vh ? (uint32_t)__ldg(qh + d) | ((uint32_t)__ldg(qh + d + 1) << 16) : 0u;
          qf[ks][2] = vl ? (uint32_t)__ldg(ql + d + 8) | ((uint32_t)__ldg(ql + d + 9) << 16) : 0u;
          qf[ks][3] = vh ? (uint32_t)__ldg(qh + d + 8) | ((uint32_t)__ldg(qh + d + 9) << 16) : 0u;
        }
      }
    }
    const float scale2 = (float)(p.softmax_scale * 1.4426950408889634);
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
#if DSV4_WS_TRACE
    long long c0, c1, c2, c3, sk = 0, ss = 0, sf = 0;
    WS_CLK(c0);
    if (lane == 0 && mq == 0) WS_TR(0, c0);
#endif
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = (int)(it & 1);
      WS_CLK(c0);
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
      WS_CLK(c1);
      const __nv_bfloat16* Ks = Kb + buf * kTileKV;
      const int* vf = Vf + buf * kM64Tok;
      float sacc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
      // B-fragments: ldmatrix.x4 = 2 k-steps of one n-tile (tokens 8 j ..), lane row (lane & 7) + 8 j
      const __nv_bfloat16* kb = Ks + (lane & 7) * kKPitch + 8 * (lane >> 3);
#if DSV4_WS_S8
      float sodd[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) sodd[j][0] = sodd[j][1] = sodd[j][2] = sodd[j][3] = 0.f;
#endif
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];
          ldmatrix_x4(b, kb + j * 8 * kKPitch + ks * 16);
          mma_bf16_16816(sacc[j], qf[ks], b);
#if DSV4_WS_S8
          mma_bf16_16816(sodd[j], qf[ks + 1], b + 2);
#else
          mma_bf16_16816(sacc[j], qf[ks + 1], b + 2);
#endif
        }
      }
#if DSV4_WS_S8
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) sacc[j][r] += sodd[j][r];
#endif
      WS_CLK(c2);
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
      __nv_bfloat16* pr = Pb + buf * kTileP + (mq * 16 + g) * kPPitch + 2 * t4;
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
      if (t4 == 0) {
        Ab[buf * kM64Heads + mq * 16 + g] = al_lo;
        Ab[buf * kM64Heads + mq * 16 + g + 8] = al_hi;
      }
      named_bar_arrive(kWsBarPReady + buf, kWsThreads);   // P, alpha of tile it in buffer buf
#if DSV4_WS_TRACE
      WS_CLK(c3);
      sk += c1 - c0; ss += c2 - c1; sf += c3 - c2;
#endif
    }
#if DSV4_WS_TRACE
    if (lane == 0 && mq == 0) { WS_TR(1, sk); WS_TR(2, ss); WS_TR(3, sf); WS_TR(4, clock64()); }
#endif
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    if (t4 == 0) {
      Mf[mq * 16 + g] = m_lo; Lf[mq * 16 + g] = l_lo;
      Mf[mq * 16 + g + 8] = m_hi; Lf[mq * 16 + g + 8] = l_hi;
    }
    __syncthreads();   // E: final m, l visible to the PV warps (which store the output)
    return;
  }

  // ================= PV warps: gather, dequantisation, O = O * alpha + P V, epilogue =================
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsPvRegs));
  int64_t main_lim, extra_lim;
  slot_limits(p, bi, &main_lim, &extra_lim);
  // cp.async of one tile's raw rows into the staging area: 8 threads per token (gn), part gj copies 16-byte
  // chunks gj, gj + 8, ... of the 576-byte row, part 7 the 8-byte scale row, part 0 writes the valid flag;
  // an invalid slot stages zeros (src size 0)
  const int gn = tid >> 3, gj = tid & 7;
  auto issue = [&](int64_t t0, int raw_idx) {
    const int64_t pos = t0 + gn;
    const int idx = slot_resolve(p, raw_idx, pos, pos_end, main_lim, extra_lim);
    if (gj == 0) ((int*)(ring + kM64StageData + kM64StageScale))[gn] = idx >= 0;
    const uint8_t* srow = (const uint8_t*)p.k_cache;
    const uint8_t* tok = srow;
    if (idx >= 0) tok = token_row(p, pos >= p.topk, idx, &srow);
    const int nb = idx >= 0 ? 16 : 0;
    unsigned char* dst = ring + gn * kRowBytes;
#if DSV4_WS_BULK
    // one bulk copy per token row (the copy engine: one instruction instead of 36 cp.async); an invalid slot's
    // staged row keeps stale bytes, which the dequantisation replaces by zeros (its valid flag is 0)
    if (gj == 0) {
      mbar_arrive_tx(sbar, idx >= 0 ? kRowBytes : 0);
      if (idx >= 0) bulk_g2s((uint32_t)__cvta_generic_to_shared(dst), tok, kRowBytes, sbar);
    }
#else
#pragma unroll
    for (int k = 0; k < 4; ++k) cp_async16(dst + 16 * (gj + 8 * k), tok + 16 * (gj + 8 * k), nb);
    if (gj < 4) cp_async16(dst + 16 * (32 + gj), tok + 16 * (32 + gj), nb);
#endif
    if (gj == 7) cp_async8(ring + kM64StageData + gn * kScaleBytes, srow, nb / 2);
  };
  // chunk c = warp (0..6 fp8 NoPE, 7 RoPE copy) of every token (lane = token) from the staging rows into K/V
  // buffer buf, exact; rotated 16-byte order (conflict-free staging reads). Chunk 0 also copies the flags.
  auto dequant = [&](int buf) {
    const int n = lane, c = warp;
    const int vflag = ((const int*)(ring + kM64StageData + kM64StageScale))[n];
    if (c == 0) Vf[buf * kM64Tok + n] = vflag;
    [[maybe_unused]] const uint32_t vmask = DSV4_WS_BULK ? (vflag ? 0xffffffffu : 0u) : 0xffffffffu;
    unsigned char* dst = (unsigned char*)(Kb + buf * kTileKV + n * kKPitch + c * 64);
    if (c < 7) {
      const float sc = ue8m0_to_float(ring[kM64StageData + n * kScaleBytes + c]);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int kk = (s + (n >> 1)) & 3;
        uint4 raw = *(const uint4*)(ring + n * kRowBytes + c * 64 + 16 * kk);
#if DSV4_WS_BULK
        raw.x &= vmask; raw.y &= vmask; raw.z &= vmask; raw.w &= vmask;
#endif
        uint4 o0, o1;
        o0.x = e4m3x2_to_bf16x2(raw.x, sc); o0.y = e4m3x2_to_bf16x2(raw.x >> 16, sc);
        o0.z = e4m3x2_to_bf16x2(raw.y, sc); o0.w = e4m3x2_to_bf16x2(raw.y >> 16, sc);
        o1.x = e4m3x2_to_bf16x2(raw.z, sc); o1.y = e4m3x2_to_bf16x2(raw.z >> 16, sc);
        o1.z = e4m3x2_to_bf16x2(raw.w, sc); o1.w = e4m3x2_to_bf16x2(raw.w >> 16, sc);
        ((uint4*)dst)[2 * kk] = o0;
        ((uint4*)dst)[2 * kk + 1] = o1;
      }
    } else {
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int kk = (s + (n >> 1)) & 7;
        uint4 v = *(const uint4*)(ring + n * kRowBytes + kNope + 16 * kk);
#if DSV4_WS_BULK
        v.x &= vmask; v.y &= vmask; v.z &= vmask; v.w &= vmask;
#endif
        ((uint4*)dst)[kk] = v;
      }
    }
  };
#if DSV4_WS_L2PF
  // L2 prefetch of tile t0's rows (one 128-byte line per thread: parts 0..4 the row's lines, 5 its last byte,
  // 6 the scale row), kWsPfAhead tiles before their cp.async
  auto prefetch = [&](int64_t t0, int raw_idx) {
    const int64_t pos = t0 + gn;
    const int idx = slot_resolve(p, raw_idx, pos, pos_end, main_lim, extra_lim);
    if (idx < 0 || gj == 7) return;
    const uint8_t* srow;
    const uint8_t* tok = token_row(p, pos >= p.topk, idx, &srow);
    const uint8_t* a = gj < 5 ? tok + 128 * gj : gj == 5 ? tok + kRowBytes - 1 : srow;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
  };
  int pfidx = slot_load(p, bi, si, pos_begin + (1 + DSV4_WS_L2PF) * kM64Tok + gn, pos_end);
#endif
  // tile t from the staging area into buffer t % 2, handed to the S warps; then the copies of tile t + 1
#if DSV4_WS_TRACE
  long long d0, d1, d2, d3, tw = 0, td = 0, ti = 0, tp = 0, tq = 0;
#endif
  // raw slot index of tile t's token gn -> Ix[t % 2][gn] by a 4-byte cp.async (no register waits for it; a
  // position beyond the split reads nothing and its slot resolves to -1 anyway)
  [[maybe_unused]] auto idx_async = [&](int64_t t) {
    if (gj != 0) return;
    const int64_t pos = pos_begin + t * kM64Tok + gn;
    const int32_t* src = p.indices;
    int nb = 0;
    if (pos < pos_end) {
      nb = 4;
      src = pos < p.topk ? p.indices + bi * p.idx_stride_b + si * p.idx_stride_s + pos * p.idx_stride_k
                         : p.extra_indices + bi * p.extra_idx_stride_b + si * p.extra_idx_stride_s +
                               (pos - p.topk) * p.extra_idx_stride_k;
    }
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(Ix + (int)(t & 1) * kM64Tok + gn);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(nb));
  };
  auto stage_next = [&](int64_t t, int& nidx) {
    WS_CLK(d0);
#if DSV4_WS_BULK
    mbar_wait(sbar, (int)(t & 1));             // the bulk copies of tile t (phase t of the barrier)
#endif
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    WS_CLK(d1);
    dequant((int)(t & 1));
    named_bar_sync(kWsBarPv, kWsPvThreads);    // the staging area is free
    WS_CLK(d2);
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
#if DSV4_WS_ABLATE
    if (t < 1)
#endif
#if DSV4_WS_SMEMIDX
    if (t + 1 < ntiles) issue(pos_begin + (t + 1) * kM64Tok, Ix[(int)((t + 1) & 1) * kM64Tok + gn]);
    if (t + 2 < ntiles) idx_async(t + 2);
    cp_async_commit();
#else
    if (t + 1 < ntiles) issue(pos_begin + (t + 1) * kM64Tok, nidx);
    cp_async_commit();
    nidx = slot_load(p, bi, si, pos_begin + (t + 2) * kM64Tok + gn, pos_end);
#endif
#if DSV4_WS_L2PF
    if (t + 1 + DSV4_WS_L2PF < ntiles) prefetch(pos_begin + (t + 1 + DSV4_WS_L2PF) * kM64Tok, pfidx);
    pfidx = slot_load(p, bi, si, pos_begin + (t + 2 + DSV4_WS_L2PF) * kM64Tok + gn, pos_end);
#endif
#if DSV4_WS_TRACE
    WS_CLK(d3);
    tw += d1 - d0; td += d2 - d1; ti += d3 - d2;
#endif
  };

#if DSV4_WS_BULK
  if (tid == 0) {
    mbar_init(sbar, kM64Tok);   // one arrival per token of a tile, plus the bytes of its valid rows
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  named_bar_sync(kWsBarPv, kWsPvThreads);
#endif
  if (ntiles > 0) issue(pos_begin, slot_load(p, bi, si, pos_begin + gn, pos_end));
#if DSV4_WS_SMEMIDX
  if (ntiles > 1) idx_async(1);
  int nidx = 0;
#endif
  cp_async_commit();
#if !DSV4_WS_SMEMIDX
  int nidx = slot_load(p, bi, si, pos_begin + kM64Tok + gn, pos_end);
#endif
#if DSV4_WS_L2PF
  for (int d = 1; d <= DSV4_WS_L2PF; ++d)
    if (d < ntiles) prefetch(pos_begin + d * kM64Tok, slot_load(p, bi, si, pos_begin + d * kM64Tok + gn, pos_end));
#endif
  float acc[4][8][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
  if (ntiles > 0) stage_next(0, nidx);
  if (ntiles > 1) stage_next(1, nidx);

#if DSV4_WS_TRACE
  long long e0, e1, e2;
  if (tid == 0) WS_TR(5, clock64());
#endif
  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    WS_CLK(e0);
    named_bar_sync(kWsBarPReady + buf, kWsThreads);   // P, alpha of tile it
    WS_CLK(e1);
    const __nv_bfloat16* Ks = Kb + buf * kTileKV;
    const __nv_bfloat16* Ps = Pb + buf * kTileP;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float a_lo = Ab[buf * kM64Heads + m * 16 + g], a_hi = Ab[buf * kM64Heads + m * 16 + g + 8];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        acc[m][n][0] *= a_lo; acc[m][n][1] *= a_lo; acc[m][n][2] *= a_hi; acc[m][n][3] *= a_hi;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kM64Tok; kk += 16) {
      uint32_t pa[4][4];
#pragma unroll
      for (int m = 0; m < 4; ++m) ldmatrix_x4(pa[m], Ps + (m * 16 + (lane & 15)) * kPPitch + kk + 8 * (lane >> 4));
      const __nv_bfloat16* vrow = Ks + (kk + (lane & 15)) * kKPitch + 64 * warp + 8 * (lane >> 4);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, vrow + 16 * np);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          mma_bf16_16816(acc[m][2 * np], pa[m], bb);
          mma_bf16_16816(acc[m][2 * np + 1], pa[m], bb + 2);
        }
      }
    }
#if DSV4_WS_TRACE
    WS_CLK(e2);
    tq += e1 - e0; tp += e2 - e1;
#endif
    if (it + 2 < ntiles) stage_next(it + 2, nidx);
  }
  cp_async_wait<0>();
#if DSV4_WS_TRACE
  if (tid == 0) { WS_TR(6, tq); WS_TR(7, tp); WS_TR(8, tw); WS_TR(9, td); WS_TR(10, ti); WS_TR(11, clock64()); WS_TR(12, ntiles); }
#endif

  // ---- epilogue (as kernel_mma64.cuh's): sink values loaded before the barrier
  float sink[4][2];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = h0 + m * 16 + g + 8 * half;
      sink[m][half] = (p.num_splits == 1 && p.attn_sink != nullptr && h < h_end) ? p.attn_sink[h] : 0.f;
    }
  __syncthreads();   // E
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + g + 8 * half;
      const int h = h0 + r;
      if (h >= h_end) continue;
      const RowFinal f = finalize_row(Mf[r], Lf[r], p.num_splits == 1 && p.attn_sink != nullptr, sink[m][half]);
      const float lse = f.lse, inv = f.inv;
      if (p.num_splits == 1) {
        __nv_bfloat16* o = (__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim + 64 * warp + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *(__nv_bfloat162*)(o + 8 * n) =
              __floats2bfloat162_rn(acc[m][n][2 * half] * inv, acc[m][n][2 * half + 1] * inv);
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
}

}  // namespace dsv4

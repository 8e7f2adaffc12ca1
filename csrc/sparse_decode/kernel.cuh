// Sparse FP8 MLA decode (DeepSeek-V4 "MODEL1" fp8_ds_mla cache, 584 B per token).
//
// Version 1: a correctness-first SIMT kernel (fp32 FMA, no tensor cores yet).
//   grid  = (b*s_q, ceil(h_q / kHeadTile), num_splits), block = kThreads.
//   Each block handles kHeadTile heads of one (batch row, query position) and one
//   contiguous range of the concatenated position list [main topk | extra topk].
//   Per tile of kTokTile positions: gather + dequantise the selected tokens into smem
//   (bf16, exact: fp8 * 2^k fits bf16), scores S = Q K^T (fp32), online softmax (base 2),
//   O += P V (V = K). K/V bytes are read once per block for all kHeadTile heads.
//   num_splits > 1: each split writes a normalised partial (o, lse) in fp32 and
//   sparse_decode_combine_kernel merges them, adds attn_sink and writes bf16.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <math.h>
#include "params.h"
#include "common/device.cuh"

namespace dsv4 {

constexpr int kDim = 512;        // q/k/v head dim (448 NoPE + 64 RoPE)
constexpr int kNope = 448;
constexpr int kRowBytes = 576;   // per token data row: 448 fp8 + 64 bf16
constexpr int kScaleBytes = 8;   // per token scale row: 7 UE8M0 + 1 pad
constexpr int kHeadTile = 16;    // query heads per block
constexpr int kTokTile = 32;     // tokens per smem tile
constexpr int kThreads = 256;
constexpr int kKPitch = kDim + 8;   // bf16 elements per smem K row (pad vs bank conflicts)
constexpr int kQPitch = kDim + 8;
constexpr int kSPitch = kTokTile + 1;

constexpr int kSmemK = kTokTile * kKPitch * 2;       // 33280 B
constexpr int kSmemQ = kHeadTile * kQPitch * 2;      // 16640 B
constexpr int kSmemS = kHeadTile * kSPitch * 4;      //  2112 B
constexpr int kSmemStats = 3 * kHeadTile * 4 + kTokTile * 4;  // m, l, alpha, valid flags
constexpr int kSmemBytes = kSmemK + kSmemQ + kSmemS + kSmemStats;
static_assert(kSmemBytes <= 101376, "SM120: at most 101376 B dynamic smem per block");
static_assert(kThreads == kTokTile * 8, "gather mapping: 8 threads per token");
static_assert(kThreads == kHeadTile * 16, "PV mapping: 16 threads per head");

__device__ __forceinline__ float ue8m0_to_float(uint8_t e) {
  // 2^(e-127); e = 0 gives 2^-127 (denormal), fine for a scale.
  return __int_as_float(e == 0 ? 0x00400000 : ((int)e << 23));
}

// ---- slot resolution, shared by all kernels --------------------------------------------------
// Valid-position limits of batch row bi: positions [0, main_lim) of the main list and [0, extra_lim)
// of the extra list count (topk_length / extra_topk_length clipped to the list lengths).
__device__ __forceinline__ void slot_limits(const SparseDecodeParams& p, int64_t bi, int64_t* main_lim,
                                            int64_t* extra_lim) {
  *main_lim = p.topk;
  *extra_lim = p.extra_topk;
  if (p.topk_length != nullptr) *main_lim = min(*main_lim, (int64_t)p.topk_length[bi * p.topk_length_stride]);
  if (p.extra_topk_length != nullptr)
    *extra_lim = min(*extra_lim, (int64_t)p.extra_topk_length[bi * p.extra_topk_length_stride]);
}

// Slot of position pos of the concatenated [main topk | extra topk] list of row (bi, si): >= 0 is a
// token of the main (pos < topk) or extra cache, -1 when the position does not count (pos >= pos_end,
// beyond the lengths, index -1 / < -1 / >= num_pages * page_size).
// The index is loaded before the length test (pos < topk / e < extra_topk keeps it inside the indices
// tensor), so this load does not wait for the topk_length load behind main_lim / extra_lim: one
// dependent global round trip less on the b = 1 critical path.
// Two halves, so that a kernel can load the index of a later tile and test it only when it needs the
// slot: slot_load issues the load (its result register is not read), slot_resolve does the tests. A
// test right after the load would stall the warp for the whole global round trip (H100 Nsight
// Compute, H100: ~10 % of the mma64 kernel's stall samples at b = 128 sat on that one compare).
// slot_load: the raw index of position pos (-1 when pos >= pos_end), as loaded
__device__ __forceinline__ int slot_load(const SparseDecodeParams& p, int64_t bi, int64_t si, int64_t pos,
                                         int64_t pos_end) {
  if (pos >= pos_end) return -1;
  if (pos < p.topk) return p.indices[bi * p.idx_stride_b + si * p.idx_stride_s + pos * p.idx_stride_k];
  const int64_t e = pos - p.topk;
  return p.extra_indices[bi * p.extra_idx_stride_b + si * p.extra_idx_stride_s + e * p.extra_idx_stride_k];
}
// slot_resolve: the tests on raw index idx of position pos (only the index is kept between the two:
// the position tests are redone here, which costs fewer registers than carrying their results)
__device__ __forceinline__ int slot_resolve(const SparseDecodeParams& p, int idx, int64_t pos, int64_t pos_end,
                                            int64_t main_lim, int64_t extra_lim) {
  if (pos >= pos_end) return -1;
  const bool extra = pos >= p.topk;
  const bool in_len = extra ? pos - p.topk < extra_lim : pos < main_lim;
  const int64_t n = extra ? p.extra_num_pages * p.extra_page_size : p.k_num_pages * p.k_page_size;
  return (!in_len || idx < 0 || (int64_t)idx >= n) ? -1 : idx;
}
__device__ __forceinline__ int slot_index(const SparseDecodeParams& p, int64_t bi, int64_t si, int64_t pos,
                                          int64_t pos_end, int64_t main_lim, int64_t extra_lim) {
  return slot_resolve(p, slot_load(p, bi, si, pos, pos_end), pos, pos_end, main_lim, extra_lim);
}

// Data row (576 B) of valid slot idx of the main or the extra cache; *scale_row = its 8-byte scale row
// (after the page's page_size data rows). 32-bit page / row arithmetic (idx < 2^31). Power-of-two page sizes (SGLang's
// 64 / 256) by shift and mask: a division by a runtime value is a ~20-instruction sequence, run by every issuing
// thread for every tile.
__device__ __forceinline__ const uint8_t* token_row(const SparseDecodeParams& p, bool extra, int idx,
                                                    const uint8_t** scale_row) {
  const uint8_t* base = (const uint8_t*)(extra ? p.extra_k_cache : p.k_cache);
  const int64_t pstride = extra ? p.extra_page_stride : p.k_page_stride;
  const unsigned psize = (unsigned)(extra ? p.extra_page_size : p.k_page_size);
  const unsigned m = psize - 1u;
  unsigned page, r;
  if ((psize & m) == 0u) {
    page = (unsigned)idx >> __popc(m);
    r = (unsigned)idx & m;
  } else {
    page = (unsigned)idx / psize;
    r = (unsigned)idx - page * psize;
  }
  const uint8_t* pg = base + (int64_t)page * pstride;
  *scale_row = pg + (int64_t)psize * kRowBytes + (int64_t)r * kScaleBytes;
  return pg + (int64_t)r * kRowBytes;
}

// Token row of position pos (< pos_end) of row (bi, si), or nullptr when the position does not count.
__device__ __forceinline__ const uint8_t* resolve_slot(const SparseDecodeParams& p, int64_t bi, int64_t si,
                                                       int64_t pos, int64_t pos_end, int64_t main_lim,
                                                       int64_t extra_lim, const uint8_t** scale_row) {
  const int idx = slot_index(p, bi, si, pos, pos_end, main_lim, extra_lim);
  return idx < 0 ? nullptr : token_row(p, pos >= p.topk, idx, scale_row);
}

// Q tile of kHeads head rows from h0 -> shared memory Qs (rows of kQPitch; heads beyond h_q are zero rows;
// scalar loads: any even / odd stride works), and the running max / sum / rescale factor of each row initialised
// (Ms, Ls, As) — the start of the SIMT and the 32-head mma kernels.
template <int kHeads, int kThreads>
__device__ __forceinline__ void load_q_tile(const SparseDecodeParams& p, __nv_bfloat16* Qs, float* Ms, float* Ls,
                                            float* As, int64_t bi, int64_t si, int h0, int tid) {
  const __nv_bfloat16* q = (const __nv_bfloat16*)p.q;
  for (int i = tid; i < kHeads * kDim; i += kThreads) {
    int r = i / kDim, d = i - r * kDim;
    int h = h0 + r;
    __nv_bfloat16 v = __float2bfloat16(0.f);
    if (h < p.h_q) v = q[bi * p.q_stride_b + si * p.q_stride_s + (int64_t)h * p.q_stride_h + d];
    Qs[r * kQPitch + d] = v;
  }
  if (tid < kHeads) { Ms[tid] = -INFINITY; Ls[tid] = 0.f; As[tid] = 1.f; }
}

// ---- final per-head-row arithmetic, shared by all kernels and the combine -------------------------
// attn_sink enters the denominator only: out = O / (l + exp(sink)) = (O / l) * sink_factor(sink, lse).
__device__ __forceinline__ float sink_factor(float sink, float lse) { return 1.f / (1.f + expf(sink - lse)); }
// lse as returned: a row with no valid slot ("lonely", lse = -inf inside) is reported as +inf.
__device__ __forceinline__ float lse_out(float lse) { return lse == -INFINITY ? INFINITY : lse; }
// From a block's running max m2 (base 2, scaled) and sum l of one head row: lse (natural log; -inf when
// empty) and the factor for O: 1/l (0 when empty), times the sink factor when with_sink (the block
// writes the final output, no split, and a sink is given).
struct RowFinal {
  float lse, inv;
};
__device__ __forceinline__ RowFinal finalize_row(float m2, float l, bool with_sink, float sink) {
  const bool empty = !(l > 0.f);
  RowFinal f;
  f.lse = empty ? -INFINITY : (m2 + log2f(l)) * 0.6931471805599453f;
  f.inv = empty ? 0.f : 1.f / l;
  if (!empty && with_sink) f.inv *= sink_factor(sink, f.lse);
  return f;
}

__global__ void __launch_bounds__(kThreads)
sparse_decode_kernel(const SparseDecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();
  __nv_bfloat16* Ks = (__nv_bfloat16*)smem;                       // kSmemK
  __nv_bfloat16* Qs = (__nv_bfloat16*)(smem + kSmemK);            // kSmemQ
  float* Ss = (float*)(smem + kSmemK + kSmemQ);                   // kSmemS
  float* Ms = Ss + kHeadTile * kSPitch;                           // kSmemStats
  float* Ls = Ms + kHeadTile;
  float* As = Ls + kHeadTile;
  int* Vs = (int*)(As + kHeadTile);

  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;             // bi * s_q + si
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int h0 = blockIdx.y * kHeadTile;
  const int split = blockIdx.z;
  const int64_t total = p.topk + p.extra_topk;
  const int64_t pos_begin = (int64_t)split * p.split_tokens;
  const int64_t pos_end = min(total, pos_begin + p.split_tokens);
  int64_t main_lim, extra_lim;
  slot_limits(p, bi, &main_lim, &extra_lim);

  load_q_tile<kHeadTile, kThreads>(p, Qs, Ms, Ls, As, bi, si, h0, tid);

  const float scale2 = (float)(p.softmax_scale * 1.4426950408889634);
  // PV ownership: head pr, dims pc*2 + 32*j (+0,+1), j < 16
  const int pr = tid >> 4, pc = tid & 15;
  float acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = 0.f;

  for (int64_t t0 = pos_begin; t0 < pos_end; t0 += kTokTile) {
    __syncthreads();  // previous tile fully consumed
    // ---- gather + dequantise: thread -> (token n, 64-value chunk c)
    {
      const int n = tid >> 3, c = tid & 7;
      const int64_t pos = t0 + n;
      const uint8_t* sp = nullptr;
      const uint8_t* tok = resolve_slot(p, bi, si, pos, pos_end, main_lim, extra_lim, &sp);
      __nv_bfloat16* dst = Ks + n * kKPitch + c * 64;
      if (c == 0) Vs[n] = tok != nullptr;
      if (tok == nullptr) {
        uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 8; ++k) ((uint4*)dst)[k] = z;
      } else if (c < 7) {
        const float s = ue8m0_to_float(sp[c]);
        const uint4* src = (const uint4*)(tok + c * 64);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          uint4 raw = __ldg(src + k);
          const uint8_t* b8 = (const uint8_t*)&raw;
          __align__(16) __nv_bfloat16 o[16];
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            __nv_fp8_e4m3 f; f.__x = b8[e];
            o[e] = __float2bfloat16((float)f * s);
          }
          ((uint4*)dst)[2 * k] = ((uint4*)o)[0];
          ((uint4*)dst)[2 * k + 1] = ((uint4*)o)[1];
        }
      } else {
        const uint4* src = (const uint4*)(tok + kNope);
#pragma unroll
        for (int k = 0; k < 8; ++k) ((uint4*)dst)[k] = __ldg(src + k);
      }
    }
    __syncthreads();
    // ---- scores: thread -> head r, tokens n0 and n0+16
    {
      const int r = tid & 15, n0 = tid >> 4, n1 = n0 + 16;
      const __nv_bfloat162* qr = (const __nv_bfloat162*)(Qs + r * kQPitch);
      const __nv_bfloat162* k0 = (const __nv_bfloat162*)(Ks + n0 * kKPitch);
      const __nv_bfloat162* k1 = (const __nv_bfloat162*)(Ks + n1 * kKPitch);
      float s0 = 0.f, s1 = 0.f;
#pragma unroll 8
      for (int d = 0; d < kDim / 2; ++d) {
        float2 qf = __bfloat1622float2(qr[d]);
        float2 a = __bfloat1622float2(k0[d]);
        float2 b = __bfloat1622float2(k1[d]);
        s0 = fmaf(qf.x, a.x, fmaf(qf.y, a.y, s0));
        s1 = fmaf(qf.x, b.x, fmaf(qf.y, b.y, s1));
      }
      Ss[r * kSPitch + n0] = Vs[n0] ? s0 * scale2 : -INFINITY;
      Ss[r * kSPitch + n1] = Vs[n1] ? s1 * scale2 : -INFINITY;
    }
    __syncthreads();
    // ---- online softmax, one thread per head
    if (tid < kHeadTile) {
      float* srow = Ss + tid * kSPitch;
      float mx = -INFINITY;
      for (int n = 0; n < kTokTile; ++n) mx = fmaxf(mx, srow[n]);
      const float m_old = Ms[tid];
      const float m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_old - m_use);
      float sum = 0.f;
      for (int n = 0; n < kTokTile; ++n) {
        float e = exp2f(srow[n] - m_use);
        srow[n] = e;
        sum += e;
      }
      Ls[tid] = Ls[tid] * alpha + sum;
      Ms[tid] = m_new;
      As[tid] = alpha;
    }
    __syncthreads();
    // ---- O = O * alpha + P V
    {
      const float alpha = As[pr];
#pragma unroll
      for (int j = 0; j < 32; ++j) acc[j] *= alpha;
      const float* prow = Ss + pr * kSPitch;
      for (int n = 0; n < kTokTile; ++n) {
        const float pw = prow[n];
        const __nv_bfloat162* vr = (const __nv_bfloat162*)(Ks + n * kKPitch) + pc;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          float2 v = __bfloat1622float2(vr[16 * j]);
          acc[2 * j] = fmaf(pw, v.x, acc[2 * j]);
          acc[2 * j + 1] = fmaf(pw, v.y, acc[2 * j + 1]);
        }
      }
    }
  }
  __syncthreads();

  // ---- epilogue
  const int h = h0 + pr;
  if (h >= p.h_q) return;
  const bool with_sink = p.num_splits == 1 && p.attn_sink != nullptr;
  const RowFinal f = finalize_row(Ms[pr], Ls[pr], with_sink, with_sink ? p.attn_sink[h] : 0.f);
  const float lse = f.lse, inv = f.inv;
  if (p.num_splits == 1) {
    __nv_bfloat16* o = (__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      ((__nv_bfloat162*)o)[pc + 16 * j] = __floats2bfloat162_rn(acc[2 * j] * inv, acc[2 * j + 1] * inv);
    }
    if (pc == 0) p.lse[(bi * p.h_q + h) * p.s_q + si] = lse_out(lse);
  } else {
    const int64_t prow = ((int64_t)split * p.b * p.s_q + row) * p.h_q + h;
    float* o = p.o_part + prow * kDim;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      ((float2*)o)[pc + 16 * j] = make_float2(acc[2 * j] * inv, acc[2 * j + 1] * inv);
    if (pc == 0) p.lse_part[prow] = lse;
  }
}

// Merge split partials: grid (b*s_q, h_q, kZ), 128 / kZ threads x 4 dims (block z: dims [512 z / kZ, +512 / kZ)),
// num_splits <= DSV4_SPARSE_DECODE_MAX_SPLITS (params.h: the lse values of splits k and k + 32 sit in one lane).
// Latency bound (a few KB per block), so what counts is the number of dependent global round trips:
// the first kChunk partial vectors and the split lse values (lane k holds splits k and k + 32) are
// loaded together; every warp reduces the lse values itself (shuffles: no smem, no barrier) and the
// weights reach the lanes by shuffles. One round trip for num_splits <= kChunk (the old kernel took
// four at 20 splits: 4.0 vs 1.8 us on the H100). kChunk 16 costs ~94 registers (sm_120a), which halves
// the blocks per SM, so few splits (large b: many combine blocks) use kChunk 4; 17-24 splits take kChunk 24
// (~127 registers): one round trip instead of 16 + the rest (H100: 3-3.5 % faster at 23 splits; one round
// of 32 for 25-34 splits, 154 registers, was 7 % slower than 16 + 16 + 2, so > 24 splits keep kChunk 16).
// kZ = 2 on small grids (kCombineSmallGrid): each head row's ~40 KB of partials (20 splits) stream into two SMs
// instead of one. b = 1, h_q 64, 20 splits: kChunk 24 alone 1.9 %, kZ = 2 alone 1.3 %, both 3.5-4 % (8.1-8.2 ->
// 7.8-7.9 us); h_q 16 / 32: 5-7 %.
constexpr int64_t kCombineSmallGrid = 128;   // rows x h_q up to which the combine uses kZ = 2 (512 was no better)
static_assert(DSV4_SPARSE_DECODE_MAX_SPLITS <= 64, "the combine kernel holds two split lse values per lane");
template <int kChunk, int kZ = 1>
__global__ void __launch_bounds__(128 / kZ)
sparse_decode_combine_kernel(const SparseDecodeParams p) {
  pdl_launch_dependents();   // the next decode call's split grid may get resident while this one runs
  pdl_wait();                // the split grid has completed and its partials are visible
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int64_t rows = p.b * p.s_q;
  const int ns = (int)p.num_splits;
  const int lane = threadIdx.x & 31;
  const int64_t kstride = rows * p.h_q;                     // split k of (row, h) at [k * kstride + row * h_q + h]
  const float* lp = p.lse_part + row * p.h_q + h;
  const int d0 = (int)blockIdx.z * (kDim / kZ) + threadIdx.x * 4;   // kZ blocks per head row, 512 / kZ dims each
  const float* op = p.o_part + (row * p.h_q + h) * kDim + d0;
  const float sink = p.attn_sink != nullptr ? p.attn_sink[h] : 0.f;
  float4 v[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    v[j] = j < ns ? *(const float4*)(op + j * kstride * kDim) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float l0 = lane < ns ? lp[lane * kstride] : -INFINITY;
  const float l1 = lane + 32 < ns ? lp[(lane + 32) * kstride] : -INFINITY;
  float mx = fmaxf(l0, l1);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = mx == -INFINITY ? 0.f : expf(l0 - mx) + expf(l1 - mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = mx == -INFINITY ? -INFINITY : mx + logf(sum);
  // weight of split k = lane k & 31 of w0 (k < 32) / w1; an empty split has lse_k = -inf -> w = 0 (its o is 0)
  const float w0 = lse == -INFINITY ? 0.f : expf(l0 - lse), w1 = lse == -INFINITY ? 0.f : expf(l1 - lse);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k0 = 0; k0 < ns; k0 += kChunk) {
    if (k0 > 0) {
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        v[j] = k0 + j < ns ? *(const float4*)(op + (k0 + j) * kstride * kDim) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int k = k0 + j;   // warp-uniform
      const float w = __shfl_sync(0xffffffffu, k < 32 ? w0 : w1, k & 31);
      o.x = fmaf(w, v[j].x, o.x); o.y = fmaf(w, v[j].y, o.y);
      o.z = fmaf(w, v[j].z, o.z); o.w = fmaf(w, v[j].w, o.w);
    }
  }
  if (lse != -INFINITY && p.attn_sink != nullptr) {
    const float f = sink_factor(sink, lse);
    o.x *= f; o.y *= f; o.z *= f; o.w *= f;
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
  uint2 u;
  u.x = *(uint32_t*)&lo;
  u.y = *(uint32_t*)&hi;
  *(uint2*)((__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim + d0) = u;
  if (threadIdx.x == 0 && blockIdx.z == 0) p.lse[(bi * p.h_q + h) * p.s_q + si] = lse_out(lse);
}

}  // namespace dsv4

// Sparse FP8 MLA decode, tensor-core version (mma.sync m16n8k16 bf16 + ldmatrix; SM80+ ISA only,
// shared by SM90 and SM120). Same contract and split-KV scheme as kernel.cuh's SIMT kernel.
//   block = 8 warps, kMmaHeads = 32 heads (2 m16 tiles) of one (row, split); token tile = 32.
//   gather/dequant: 256 threads = 32 tokens x 8 chunks of 64 values -> Ks (bf16, exact).
//   S = Q K^T: warp (mt = warp/4, wn = warp%4) computes S[mt*16 +16, wn*8 +8] over k = 512
//              (A = Q from smem, 32-bit fragment loads; B = K rows, 32-bit loads).
//   softmax:   one thread per head row (fp32, base 2), P -> smem bf16.
//   O += P V:  warp (mt, wn) owns O[mt*16 +16, wn*128 +128] in registers (16 n8 tiles, 64 fp32);
//              V fragments via ldmatrix.x4.trans from the same Ks rows.
#pragma once
#include "kernel.cuh"

namespace dsv4 {

constexpr int kMmaHeads = 32;
constexpr int kMmaThreads = 256;
constexpr int kPPitch = kTokTile + 8;   // bf16 per P row (80 B: conflict-free A loads)
constexpr int kMmaSmemK = kTokTile * kKPitch * 2;           // 33280 B
constexpr int kMmaSmemQ = kMmaHeads * kQPitch * 2;          // 33280 B
constexpr int kMmaSmemS = kMmaHeads * kSPitch * 4;          //  4224 B
constexpr int kMmaSmemP = kMmaHeads * kPPitch * 2;          //  2560 B
constexpr int kMmaSmemStats = 3 * kMmaHeads * 4 + kTokTile * 4;
constexpr int kMmaSmemBytes = kMmaSmemK + kMmaSmemQ + kMmaSmemS + kMmaSmemP + kMmaSmemStats;
static_assert(kMmaSmemBytes <= 101376, "SM120: at most 101376 B dynamic smem per block");

// ldmatrix x4 (and .trans) from a generic pointer to shared memory (ldsm_x4 / ldsm_x4_trans: common/device.cuh)
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* smem_ptr) {
  ldsm_x4(r, (uint32_t)__cvta_generic_to_shared(smem_ptr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* smem_ptr) {
  ldsm_x4_trans(r, (uint32_t)__cvta_generic_to_shared(smem_ptr));
}

__global__ void __launch_bounds__(kMmaThreads)
sparse_decode_mma_kernel(const SparseDecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();
  __nv_bfloat16* Ks = (__nv_bfloat16*)smem;
  __nv_bfloat16* Qs = (__nv_bfloat16*)(smem + kMmaSmemK);
  float* Ss = (float*)(smem + kMmaSmemK + kMmaSmemQ);
  __nv_bfloat16* Ps = (__nv_bfloat16*)(smem + kMmaSmemK + kMmaSmemQ + kMmaSmemS);
  float* Ms = (float*)(smem + kMmaSmemK + kMmaSmemQ + kMmaSmemS + kMmaSmemP);
  float* Ls = Ms + kMmaHeads;
  float* As = Ls + kMmaHeads;
  int* Vs = (int*)(As + kMmaHeads);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int mt = warp >> 2, wn = warp & 3;
  const int64_t row = blockIdx.x;
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int h0 = blockIdx.y * kMmaHeads;
  const int split = blockIdx.z;
  const int64_t total = p.topk + p.extra_topk;
  const int64_t pos_begin = (int64_t)split * p.split_tokens;
  const int64_t pos_end = min(total, pos_begin + p.split_tokens);
  int64_t main_lim, extra_lim;
  slot_limits(p, bi, &main_lim, &extra_lim);

  load_q_tile<kMmaHeads, kMmaThreads>(p, Qs, Ms, Ls, As, bi, si, h0, tid);

  const float scale2 = (float)(p.softmax_scale * 1.4426950408889634);
  float acc[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) { acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f; }

  // gather mapping: thread -> (token n, 64-value chunk c); the next tile's raw bytes are loaded
  // into registers while the current tile is computed (software pipelining, plain ld.global).
  const int gn = tid >> 3, gc = tid & 7;
  uint4 raw[8];
  float gscale = 0.f;
  bool gvalid = false;
  auto load_raw = [&](int64_t t0) {
    const int64_t pos = t0 + gn;
    const uint8_t* sp = nullptr;
    const uint8_t* tok = resolve_slot(p, bi, si, pos, pos_end, main_lim, extra_lim, &sp);
    gvalid = tok != nullptr;
    if (gvalid) {
      if (gc < 7) {
        gscale = ue8m0_to_float(sp[gc]);
        const uint4* src = (const uint4*)(tok + gc * 64);
#pragma unroll
        for (int k = 0; k < 4; ++k) raw[k] = __ldg(src + k);
      } else {
        const uint4* src = (const uint4*)(tok + kNope);
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[k] = __ldg(src + k);
      }
    }
  };
  if (pos_begin < pos_end) load_raw(pos_begin);

  for (int64_t t0 = pos_begin; t0 < pos_end; t0 += kTokTile) {
    __syncthreads();
    {  // dequantise the registers into Ks
      __nv_bfloat16* dst = Ks + gn * kKPitch + gc * 64;
      if (gc == 0) Vs[gn] = gvalid;
      if (!gvalid) {
        uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 8; ++k) ((uint4*)dst)[k] = z;
      } else if (gc < 7) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint8_t* b8 = (const uint8_t*)&raw[k];
          __align__(16) __nv_bfloat16 o[16];
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            __nv_fp8_e4m3 f; f.__x = b8[e];
            o[e] = __float2bfloat16((float)f * gscale);
          }
          ((uint4*)dst)[2 * k] = ((uint4*)o)[0];
          ((uint4*)dst)[2 * k + 1] = ((uint4*)o)[1];
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) ((uint4*)dst)[k] = raw[k];
      }
    }
    __syncthreads();
    if (t0 + kTokTile < pos_end) load_raw(t0 + kTokTile);
    {  // S tile [mt*16 + 16 heads, wn*8 + 8 tokens]
      float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
      const __nv_bfloat16* qa = Qs + (mt * 16 + g) * kQPitch + 2 * t4;
      const __nv_bfloat16* kb = Ks + (wn * 8 + g) * kKPitch + 2 * t4;
#pragma unroll 8
      for (int k0 = 0; k0 < kDim; k0 += 16) {
        uint32_t a[4], b[2];
        float* sacc = (k0 & 16) ? s2 : s;   // two independent mma chains
        a[0] = *(const uint32_t*)(qa + k0);
        a[1] = *(const uint32_t*)(qa + 8 * kQPitch + k0);
        a[2] = *(const uint32_t*)(qa + k0 + 8);
        a[3] = *(const uint32_t*)(qa + 8 * kQPitch + k0 + 8);
        b[0] = *(const uint32_t*)(kb + k0);
        b[1] = *(const uint32_t*)(kb + k0 + 8);
        mma_bf16_16816(sacc, a, b);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] += s2[i];
      const int r0 = mt * 16 + g, c0 = wn * 8 + 2 * t4;
      Ss[r0 * kSPitch + c0] = Vs[c0] ? s[0] * scale2 : -INFINITY;
      Ss[r0 * kSPitch + c0 + 1] = Vs[c0 + 1] ? s[1] * scale2 : -INFINITY;
      Ss[(r0 + 8) * kSPitch + c0] = Vs[c0] ? s[2] * scale2 : -INFINITY;
      Ss[(r0 + 8) * kSPitch + c0 + 1] = Vs[c0 + 1] ? s[3] * scale2 : -INFINITY;
    }
    __syncthreads();
    {  // online softmax: 8 threads per head row, 4 tokens each (fp32, base 2)
      const int r = tid >> 3, part = tid & 7;
      float* srow = Ss + r * kSPitch + part * 4;
      float v[4];
#pragma unroll
      for (int n = 0; n < 4; ++n) v[n] = srow[n];
      float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = Ms[r];
      const float m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_old - m_use);
      float sum = 0.f;
      __nv_bfloat16* prow = Ps + r * kPPitch + part * 4;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float e = exp2f(v[n] - m_use);   // l and lse from fp32 P; PV uses P rounded to bf16
        prow[n] = __float2bfloat16(e);
        sum += e;
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (part == 0) {
        Ls[r] = Ls[r] * alpha + sum;
        Ms[r] = m_new;
        As[r] = alpha;
      }
    }
    __syncthreads();
    {  // O[mt rows, wn*128 + 128 dims] = O * alpha + P V
      const float a_lo = As[mt * 16 + g], a_hi = As[mt * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        acc[j][0] *= a_lo; acc[j][1] *= a_lo; acc[j][2] *= a_hi; acc[j][3] *= a_hi;
      }
      const __nv_bfloat16* pa = Ps + (mt * 16 + g) * kPPitch + 2 * t4;
#pragma unroll
      for (int kk = 0; kk < kTokTile; kk += 16) {
        uint32_t a[4];
        a[0] = *(const uint32_t*)(pa + kk);
        a[1] = *(const uint32_t*)(pa + 8 * kPPitch + kk);
        a[2] = *(const uint32_t*)(pa + kk + 8);
        a[3] = *(const uint32_t*)(pa + 8 * kPPitch + kk + 8);
        // ldmatrix.x4.trans: lanes 0-15 -> rows kk+0..15 at dims n0, lanes 16-31 -> same rows at n0+8
        const __nv_bfloat16* vrow = Ks + (kk + (lane & 15)) * kKPitch + wn * 128 + (lane >> 4) * 8;
#pragma unroll
        for (int j = 0; j < 16; j += 2) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, vrow + j * 8);
          mma_bf16_16816(acc[j], a, bb);
          mma_bf16_16816(acc[j + 1], a, bb + 2);
        }
      }
    }
  }
  __syncthreads();

  // epilogue: rows r_lo = mt*16+g, r_hi = r_lo+8; dims wn*128 + j*8 + 2*t4 (+1)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = mt * 16 + g + 8 * half;
    const int h = h0 + r;
    if (h >= p.h_q) continue;
    const bool with_sink = p.num_splits == 1 && p.attn_sink != nullptr;
    const RowFinal f = finalize_row(Ms[r], Ls[r], with_sink, with_sink ? p.attn_sink[h] : 0.f);
    const float lse = f.lse, inv = f.inv;
    if (p.num_splits == 1) {
      __nv_bfloat16* o = (__nv_bfloat16*)p.out + (row * p.h_q + h) * kDim + wn * 128 + 2 * t4;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *(__nv_bfloat162*)(o + j * 8) = __floats2bfloat162_rn(acc[j][2 * half] * inv, acc[j][2 * half + 1] * inv);
      if (wn == 0 && t4 == 0) p.lse[(bi * p.h_q + h) * p.s_q + si] = lse_out(lse);
    } else {
      const int64_t prw = ((int64_t)split * p.b * p.s_q + row) * p.h_q + h;
      float* o = p.o_part + prw * kDim + wn * 128 + 2 * t4;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *(float2*)(o + j * 8) = make_float2(acc[j][2 * half] * inv, acc[j][2 * half + 1] * inv);
      if (wn == 0 && t4 == 0) p.lse_part[prw] = lse;
    }
  }
}

}  // namespace dsv4

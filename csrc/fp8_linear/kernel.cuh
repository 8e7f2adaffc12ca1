// Block-scaled FP8 linear at decode sizes: out[m, g, n] = sum_k x[m, g, k] * w[g, n, k] * scale[g, n / 128, k / 128]
// (+ bias[g, n]), M <= 64 tokens, x bf16, w e4m3, out bf16. One kernel launch, grid (N / 128 row tiles, K splits,
// groups), 256 threads (8 warps):
//
//  * Weights are the MMA's M side ("swap AB", m16n8k16 f16 x f16 -> fp32): warp w of a block streams weight rows
//    tile * 128 + 16 w + [0, 16) over the block's K range, tokens are the MMA's n = 8 side (MT token tiles).
//    Lane (g, c) loads 2 x 16 bytes of rows g and g + 8 per 128-K step (the rows' whole 128-byte line per warp
//    instruction pair), weights read once, straight into registers (ld.global.nc.L1::no_allocate.L2::256B, a ring
//    of kRing steps, kRing - 1 ahead), decoded to f16 exactly (cvt.rn.f16x2.e4m3x2, or integer ops: kIntCvt).
//  * x is never quantized: each block converts its K range of x to f16 in shared memory, once for its 128 rows,
//    with one power-of-two scale per (token, 128-K group) (exact, fragments.cuh), in pieces of kPiece steps
//    (double-buffered, one __syncthreads per piece; the next piece's bf16 staged by cp.async meanwhile), already in
//    the MMA's B-fragment order (one LDS.128 per lane, token tile and two MMAs).
//  * Per 128-K step the fp32 partial of the step is scaled once: acc += w_scale[row] * 2^-s[token] * partial.
//  * K splits (splits > 1, chosen on the host from the SM count): each block writes its fp32 partial of its
//    128 x M tile to the workspace; the block that brings the tile's counter to `splits` sums the partials in
//    split order (deterministic, bit-identical across runs) and resets the counter (no memset per call).
//  * PDL: the first weight steps (constant data) are issued before griddepcontrol.wait, so they overlap the
//    previous kernel's tail; x, the workspace and the counters are touched only after it.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "fp8_linear/params.h"
#include "fp8_linear/fragments.cuh"
#include "common/device.cuh"
#include "fp8_linear/epilogue.cuh"

namespace dsv4 {
namespace fp8lin {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileN = DSV4_FP8_LINEAR_TILE_N;   // rows per block: 16 per warp
constexpr int kStepK = 128;                      // K per step = one scale block
static_assert(kTileN == 16 * kWarps, "one m16 tile per warp");

// Ring depth kRing (weight steps in registers, kRing - 1 ahead: 16 registers per step) and x piece size kPiece
// (steps of x per shared-memory piece; 3 piece buffers of kPiece x MT x 2 KB: two f16, one raw bf16 staging), per
// token tiles:
//   MT 1-2: ring 3, piece 3 (2 steps = 4 KB in flight per warp, 64 KB per SM at 2 blocks; a ring of 4 took 122-128
//           registers and spilled with packed scales at 2 blocks per SM on sm_120a);
//   MT 3-4: ring 2, piece 2 (a ring of 3 spilled 4-36 B within the 128 registers of 2 blocks per SM; 2 blocks of
//           MT 3 with 3-step pieces would need 110 KB of shared memory: an SM120 SM has 100 KB);
//   MT 6-8: ring 3, piece 1 (1 block per SM, up to 255 registers: the ring keeps 32 KB per SM in flight, the pieces
//           stay within 48 KB; one __syncthreads per step, each step being >= 48 MMAs per warp).
template <int MT, int kMode>
struct Cfg {
  static constexpr int kRing = (MT <= 2 || MT >= 5) ? 3 : 2;
  static constexpr int kPiece = MT <= 2 ? 3 : MT <= 4 ? 2 : 1;
  // 2 x 256 threads per SM: <= 128 registers (and <= 50 KB of shared memory each on SM120). MT 4 with the packed
  // per-row scales (mode 2: two scale words per step) spilled 8-28 B within 128 (sm_120a, nvcc 13.0): 1 block.
  static constexpr int kMinBlocks = (MT <= 3 || (MT == 4 && kMode != 2)) ? 2 : 1;
  static constexpr int kPieceU4 = kPiece * MT * 4 * 32; // uint4 of one x piece (f16 fragments; = its raw bf16 chunks)
  // two f16 piece buffers, the raw bf16 staging of the next piece (cp.async), two pieces' 2^-s per token
  static constexpr int kSmemBytes = 3 * kPieceU4 * 16 + 2 * kPiece * MT * 8 * 4;
};

// ---- loads ------------------------------------------------------------------------------------------------------
// Weights: read once per call, so kept out of L1; the 256 B L2 prefetch hint fetches the next step's line of the
// row with this one (the same choice as fp4_moe's decode kernels, measured there: 1.5-2.5 % on the H100).
__device__ __forceinline__ uint4 ld_weights(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t u4(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ void mma_f16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One weight step of one lane: rows g (a[0], a[1]: bytes c*16 and 64 + c*16) and g + 8 (a[2], a[3]), and the raw
// scale word(s) of the step (float bits / a byte / the packed int32 word per row).
template <int kMode>
struct WStep {
  uint4 a[4];
  uint32_t s[kMode == 2 ? 2 : 1];
};

// A lane's two rows as one pointer each + the byte distance to row g + 8 (< 2^31: 8 rows apart), to save registers.
struct Rows {
  const uint8_t* w0;      // row g at the block's first K step, + c * 16
  const uint8_t* s0;      // scale base (bytes) of row g (mode 2) or of the tile's row block (modes 0 / 1)
  int dw, ds;             // bytes from row g to row g + 8 (weights, mode-2 scales)
};

template <int kMode>
__device__ __forceinline__ void load_step(WStep<kMode>& st, const Rows& r, const Fp8LinearParams& p, int i, int kb) {
  const uint8_t* w0 = r.w0 + (int64_t)i * kStepK;
  st.a[0] = ld_weights(w0);
  st.a[1] = ld_weights(w0 + 64);
  st.a[2] = ld_weights(w0 + r.dw);
  st.a[3] = ld_weights(w0 + r.dw + 64);
  if (kMode == 0) {
    st.s[0] = __ldg(reinterpret_cast<const uint32_t*>(r.s0) + (int64_t)kb * p.s_stride_k);
  } else if (kMode == 1) {
    st.s[0] = __ldg(r.s0 + (int64_t)kb * p.s_stride_k);
  } else {
    const uint8_t* s = r.s0 + (int64_t)(kb >> 2) * p.s_stride_k * 4;
    st.s[0] = __ldg(reinterpret_cast<const uint32_t*>(s));
    st.s[kMode == 2 ? 1 : 0] = __ldg(reinterpret_cast<const uint32_t*>(s + r.ds));
  }
}

template <int kMode>
__device__ __forceinline__ void step_scales(const WStep<kMode>& st, int kb, float& s0, float& s1) {
  if (kMode == 0) {
    s0 = s1 = __uint_as_float(st.s[0]);
  } else if (kMode == 1) {
    s0 = s1 = ue8m0_to_float(st.s[0]);
  } else {
    const int sh = 8 * (kb & 3);
    s0 = ue8m0_to_float(st.s[0] >> sh);
    s1 = ue8m0_to_float(st.s[kMode == 2 ? 1 : 0] >> sh);
  }
}

// ---- x -> f16 B fragments in shared memory ----------------------------------------------------------------------
// Piece layout: xs[step slot][token tile][piece i][lane] uint4 (lane-contiguous: conflict-free LDS.128), and
// xinv[step slot][token] the 2^-s of each token's group. One thread per 8-value chunk (unit u: chunk j = u % 16 of
// step slot (u / 16) % P of token u / 16P, P = kPiece): the 16 chunks of one (token, step) group are 16 consecutive threads
// (half a warp), which reduce their max |x| by shuffles. The raw bf16 chunks of the next piece are staged by
// cp.async into raw[u] while the current piece computes (each thread converts the units it copied, so its own
// cp.async.wait_all is the only wait needed): the x latency (L2) is paid once per block, not once per piece.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gsrc) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gsrc) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <int MT, int kMode>
__device__ __forceinline__ void stage_x_piece(const Fp8LinearParams& p, uint4* raw, int kb0, int nsub) {
  constexpr int R = Cfg<MT, kMode>::kPiece;
  constexpr int kUnits = MT * 8 * R * 16;
  const __nv_bfloat16* xg = reinterpret_cast<const __nv_bfloat16*>(p.x) + (int64_t)blockIdx.z * p.x_stride_g;
#pragma unroll 1
  for (int u = threadIdx.x; u < kUnits; u += kThreads) {
    const int j = u & 15, rest = u >> 4;
    const int slot = rest % R, m = rest / R;
    if (slot < nsub && m < p.M)
      cp_async16(raw + u, xg + (int64_t)m * p.x_stride_m + (int64_t)(kb0 + slot) * kStepK + 8 * j);
  }
  cp_async_commit();
}

template <int MT, int kMode, bool kIntCvt>
__device__ __forceinline__ void convert_x_piece(const Fp8LinearParams& p, const uint4* raw, uint4* xs, float* xinv,
                                                int nsub) {
  constexpr int R = Cfg<MT, kMode>::kPiece;
  constexpr int kUnits = MT * 8 * R * 16;
  const int lane = threadIdx.x & 31;
  const unsigned half_mask = 0xFFFFu << (lane & 16);
#pragma unroll 1
  for (int u = threadIdx.x; u < kUnits; u += kThreads) {
    const int j = u & 15, rest = u >> 4;
    const int slot = rest % R, m = rest / R;
    if (slot >= nsub) continue;   // (uniform over the 16-thread group)
    const XSlot d = x_chunk_slot(m, j);
    uint4* dst = xs + ((slot * MT + d.t) * 4 + d.piece) * 32 + d.lane;
    if (m >= p.M) {               // padding tokens: zeros (their MMA columns are never stored)
      *dst = make_uint4(0u, 0u, 0u, 0u);
      if (j == 0) xinv[slot * MT * 8 + m] = 0.f;
      continue;
    }
    const uint4 v = raw[u];
    uint32_t a = __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu), __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
    a = max(a & 0xFFFFu, a >> 16);
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) a = max(a, __shfl_xor_sync(half_mask, a, o, 16));
    const XScale sc = x_group_scale(a);
    uint32_t r0 = bf16x2_to_f16x2_scaled(v.x, sc), r1 = bf16x2_to_f16x2_scaled(v.y, sc);
    uint32_t r2 = bf16x2_to_f16x2_scaled(v.z, sc), r3 = bf16x2_to_f16x2_scaled(v.w, sc);
    if (kIntCvt) {   // pairs {x0, x2}, {x1, x3} per word pair, as the integer weight decode pairs its bytes
      const uint32_t t0 = __byte_perm(r0, r1, 0x5410u), t1 = __byte_perm(r0, r1, 0x7632u);
      const uint32_t t2 = __byte_perm(r2, r3, 0x5410u), t3 = __byte_perm(r2, r3, 0x7632u);
      r0 = t0, r1 = t1, r2 = t2, r3 = t3;
    }
    *dst = make_uint4(r0, r1, r2, r3);
    if (j == 0) xinv[slot * MT * 8 + m] = sc.inv;
  }
}

// ---- one 128-K step of one warp ---------------------------------------------------------------------------------
template <int MT, int kMode, bool kIntCvt>
__device__ __forceinline__ void compute_step(float (&acc)[MT][4], const WStep<kMode>& st, const uint4* xs_slot,
                                             const float* xinv_slot, int kb) {
  const int lane = threadIdx.x & 31, c = lane & 3;
  float blk[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) blk[t][e] = 0.f;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int h = s >> 2, sw = s & 3;
    const uint32_t wg = u4(st.a[h], sw), wh = u4(st.a[2 + h], sw);
    uint32_t a[4];
    if (kIntCvt) {
      a[0] = e4m3x2_lo_to_f16x2(wg);
      a[2] = e4m3x2_hi_to_f16x2(wg);
      a[1] = e4m3x2_lo_to_f16x2(wh);
      a[3] = e4m3x2_hi_to_f16x2(wh);
    } else {
      a[0] = e4m3x2_lo16_to_f16x2(wg);
      a[2] = e4m3x2_hi16_to_f16x2(wg);
      a[1] = e4m3x2_lo16_to_f16x2(wh);
      a[3] = e4m3x2_hi16_to_f16x2(wh);
    }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const uint4 b = xs_slot[(t * 4 + (s >> 1)) * 32 + lane];   // (the compiler loads it once per s pair)
      if (s & 1)
        mma_f16_16816(blk[t], a, b.z, b.w);
      else
        mma_f16_16816(blk[t], a, b.x, b.y);
    }
  }
  float s0, s1;
  step_scales<kMode>(st, kb, s0, s1);
  if (kIntCvt) {   // the integer decode carries 2^-8
    s0 *= 256.f;
    s1 *= 256.f;
  }
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const float2 xi = *reinterpret_cast<const float2*>(xinv_slot + 8 * t + 2 * c);
    acc[t][0] = fmaf(s0 * xi.x, blk[t][0], acc[t][0]);
    acc[t][1] = fmaf(s0 * xi.y, blk[t][1], acc[t][1]);
    acc[t][2] = fmaf(s1 * xi.x, blk[t][2], acc[t][2]);
    acc[t][3] = fmaf(s1 * xi.y, blk[t][3], acc[t][3]);
  }
}

// ---- the kernel -------------------------------------------------------------------------------------------------
template <int MT, int kMode, bool kIntCvt>
__global__ void __launch_bounds__(kThreads, Cfg<MT, kMode>::kMinBlocks) fp8_linear_kernel(Fp8LinearParams p) {
  constexpr int R = Cfg<MT, kMode>::kRing;
  extern __shared__ uint4 smem[];
  uint4* xs_base = smem;                                                      // [2][kPieceU4] + raw [kPieceU4]
  float* xinv_base = reinterpret_cast<float*>(smem + 3 * Cfg<MT, kMode>::kPieceU4);   // [2][kPiece][MT * 8]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y, grp = blockIdx.z;
  const int tiles = gridDim.x;
  const int64_t C = p.K / kStepK;
  const int q0 = (int)((int64_t)split * C / p.splits), q1 = (int)((int64_t)(split + 1) * C / p.splits);
  const int nsteps = q1 - q0;   // >= 1: splits <= K / 128 (checked at the C ABI)

  const int64_t row0 = (int64_t)tile * kTileN + warp * 16 + g, row1 = row0 + 8;
  const int64_t rr0 = row0 < p.N ? row0 : p.N - 1, rr1 = row1 < p.N ? row1 : p.N - 1;   // rows past N: clamped reads
  Rows rows;
  const uint8_t* wg = reinterpret_cast<const uint8_t*>(p.w) + (int64_t)grp * p.w_stride_g + (int64_t)q0 * kStepK + c * 16;
  rows.w0 = wg + rr0 * p.w_stride_n;
  rows.dw = (int)((rr1 - rr0) * p.w_stride_n);
  const int esz = kMode == 1 ? 1 : 4;
  const uint8_t* sg = reinterpret_cast<const uint8_t*>(p.scale) + (int64_t)grp * p.s_stride_g * esz;
  if (kMode == 2) {
    rows.s0 = sg + rr0 * p.s_stride_n * 4;
    rows.ds = (int)((rr1 - rr0) * p.s_stride_n * 4);
  } else {
    rows.s0 = sg + (int64_t)tile * p.s_stride_n * esz;
    rows.ds = 0;
  }

  WStep<kMode> ring[R];
#pragma unroll
  for (int i = 0; i < R - 1; ++i)
    if (i < nsteps) load_step<kMode>(ring[i], rows, p, i, q0 + i);
  pdl_wait();               // x, the workspace and the counters: from earlier kernels of the stream
  pdl_launch_dependents();  // (the next kernel's blocks only get resident once all of ours are)

  float acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;

  constexpr int P = Cfg<MT, kMode>::kPiece;
  const int npieces = (nsteps + P - 1) / P;
  uint4* raw = xs_base + 2 * Cfg<MT, kMode>::kPieceU4;
  stage_x_piece<MT, kMode>(p, raw, q0, min(P, nsteps));
#pragma unroll 1
  for (int i0 = 0; i0 < nsteps; i0 += R) {
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = i0 + s;
      const int pc = i / P, slot = i - pc * P;
      if (i < nsteps && slot == 0) {   // (block-uniform) next x piece: convert, publish, stage the one after
        cp_async_wait_all();
        convert_x_piece<MT, kMode, kIntCvt>(p, raw, xs_base + (pc & 1) * Cfg<MT, kMode>::kPieceU4,
                                            xinv_base + (pc & 1) * P * MT * 8, min(P, nsteps - i));
        __syncthreads();   // (double buffer: a thread writing piece pc + 2 has passed this barrier of piece pc + 1)
        if (pc + 1 < npieces)   // raw is free again: every thread converted its units of piece pc before the barrier
          stage_x_piece<MT, kMode>(p, raw, q0 + i + P, min(P, nsteps - i - P));
      }
      if (i + R - 1 < nsteps) load_step<kMode>(ring[(s + R - 1) % R], rows, p, i + R - 1, q0 + i + R - 1);
      if (i < nsteps)
        compute_step<MT, kMode, kIntCvt>(acc, ring[s], xs_base + (pc & 1) * Cfg<MT, kMode>::kPieceU4 + slot * MT * 4 * 32,
                                         xinv_base + (pc & 1) * P * MT * 8 + slot * MT * 8, q0 + i);
    }
  }

  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out) + (int64_t)grp * p.out_stride_g;
  const int M = (int)p.M;
  if (p.splits == 1) {
    const float b0 = row0 < p.N ? bias_at(p, row0) : 0.f, b1 = row1 < p.N ? bias_at(p, row1) : 0.f;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * t + 2 * c + (e & 1);
        const int64_t row = e < 2 ? row0 : row1;
        if (tok < M && row < p.N)
          out[(int64_t)tok * p.out_stride_m + row] = __float2bfloat16_rn(acc[t][e] + (e < 2 ? b0 : b1));
      }
    return;
  }
  // split-K: this block's fp32 partial [M][128] of the tile, then the tile's last block sums them in split order
  const int64_t tile_part = (int64_t)M * kTileN;
  float* part = p.ws + (((int64_t)grp * p.splits + split) * tiles + tile) * tile_part;
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * t + 2 * c + (e & 1);
      if (tok < M) part[(int64_t)tok * kTileN + warp * 16 + g + (e < 2 ? 0 : 8)] = acc[t][e];
    }
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int32_t* cnt = p.counters + (int64_t)grp * tiles + tile;
    const int done = atomicAdd(cnt, 1) + 1;
    last = done == (int)p.splits;
    if (last) *cnt = 0;   // every block of this tile has counted: ready for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  sum_split_partials(p, out, tile, tiles, M, tid, kThreads);
}

}  // namespace fp8lin
}  // namespace dsv4

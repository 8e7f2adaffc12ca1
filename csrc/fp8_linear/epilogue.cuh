// Pieces shared by the FP8 linear kernels (kernel.cuh: weights in a register ring; kernel_ring.cuh: weights in a
// shared-memory ring): the bias and the deterministic split-K sum of the tile's last block.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "fp8_linear/params.h"

namespace dsv4 {
namespace fp8lin {

__device__ __forceinline__ float bias_at(const Fp8LinearParams& p, int64_t row) {
  if (p.bias == nullptr) return 0.f;
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[(int64_t)blockIdx.z * p.bias_stride_g + row]);
}

// The last block of a 128-row tile: sums the splits' fp32 partials [M][128] of the tile in split order (float4 loads,
// all loads of a group of 4 splits before their adds: bit-identical results across runs), adds the bias, writes bf16.
__device__ __forceinline__ void sum_split_partials(const Fp8LinearParams& p, __nv_bfloat16* out, int tile, int tiles,
                                                   int M, int tid, int nthreads) {
  constexpr int kTN = DSV4_FP8_LINEAR_TILE_N;
  const int64_t tile_part = (int64_t)M * kTN;
  const float* tile0 = p.ws + ((int64_t)blockIdx.z * p.splits * tiles + tile) * tile_part;
  const int64_t split_stride = (int64_t)tiles * tile_part;
  const int S = (int)p.splits;
  for (int e = tid; e < M * (kTN / 4); e += nthreads) {   // 4 rows per thread and pass (float4 partials)
    const int tok = e / (kTN / 4), r = 4 * (e % (kTN / 4));
    const int64_t row = (int64_t)tile * kTN + r;
    if (row >= p.N) continue;
    const float4* src = reinterpret_cast<const float4*>(tile0 + (int64_t)tok * kTN + r);
    const int64_t sstride = split_stride / 4;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    int j = 0;
    for (; j + 4 <= S; j += 4) {   // loads first, then the adds in split order
      float4 v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = __ldcg(src + (int64_t)(j + q) * sstride);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        sum.x += v[q].x;
        sum.y += v[q].y;
        sum.z += v[q].z;
        sum.w += v[q].w;
      }
    }
    for (; j < S; ++j) {
      const float4 v = __ldcg(src + (int64_t)j * sstride);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    __nv_bfloat16* o = out + (int64_t)tok * p.out_stride_m + row;
    const float sv[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (row + q < p.N) o[q] = __float2bfloat16_rn(sv[q] + bias_at(p, row + q));
  }
}

}  // namespace fp8lin
}  // namespace dsv4

// run 52 call 8, variant v2 (not kept): Q of the warp-specialised kernel's S warps through shared memory. The
// function went before sparse_decode_ws_kernel in kernel_ws.cuh (with static_assert(kWsSWarps * 2048 <= kWsSmemP)),
// the call replaced m64_load_q in the S warps' branch; see docs/sparse_decode.md, run 52.

// Q A-fragments of an S warp (heads hl0 .. hl0 + 15, all 512 dims) through 2 KB of shared memory `sw`: whole
// 128-byte rows by 16-byte loads (8 lanes per row), written into sw (16-byte piece k of row r at k ^ (r & 7)) and read
// back as A-fragments by ldmatrix, 64 dims at a time. Why: the SM moves global data at a rate per 32-byte sector
// however full (H100 run 52), and the 4-byte fragment loads of m64_load_q fill half sectors: Q of a 64-head block
// took ~5.8 us to arrive at b = 128, 16-byte loads ~3.7 us. Every load is issued before the first store (the raw
// rows wait in qf: chunk c's 64 dims in qf[4 c .. 4 c + 3], which its ldmatrix results then replace). Rows need 16-byte
// alignment (strides multiples of 8 elements, 16-byte aligned base), else m64_load_q.
__device__ __forceinline__ void ws_load_q(const SparseDecodeParams& p, uint32_t (&qf)[kDim / 16][4], int64_t bi,
                                          int64_t si, int hl0, int h_end, int lane, unsigned char* sw) {
  if (((p.q_stride_b | p.q_stride_s | p.q_stride_h) & 7) != 0 || ((uintptr_t)p.q & 15) != 0) {
    m64_load_q<kDim / 16>(p, qf, bi, si, hl0 + (lane >> 2), h_end, 0, lane & 3);
    return;
  }
  const __nv_bfloat16* q = (const __nv_bfloat16*)p.q + bi * p.q_stride_b + si * p.q_stride_s;
  const int k = lane & 7;
#pragma unroll
  for (int c = 0; c < kDim / 64; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = hl0 + 4 * j + (lane >> 3);
      const uint4 v = h < h_end ? __ldg((const uint4*)(q + (int64_t)h * p.q_stride_h + 64 * c + 8 * k))
                                : make_uint4(0u, 0u, 0u, 0u);
      qf[4 * c + j][0] = v.x; qf[4 * c + j][1] = v.y; qf[4 * c + j][2] = v.z; qf[4 * c + j][3] = v.w;
    }
#pragma unroll
  for (int c = 0; c < kDim / 64; ++c) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = 4 * j + (lane >> 3);
      *(uint4*)(sw + r * 128 + ((k ^ (r & 7)) << 4)) = make_uint4(qf[4 * c + j][0], qf[4 * c + j][1], qf[4 * c + j][2], qf[4 * c + j][3]);
    }
    __syncwarp();
    // ldmatrix.x4 of k-step kk: lanes 0-15 address rows 0-15 at piece 2 kk, lanes 16-31 the same rows at 2 kk + 1
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ldmatrix_x4(qf[4 * c + kk], sw + (lane & 15) * 128 + (((2 * kk + (lane >> 4)) ^ (lane & 7)) << 4));
    __syncwarp();
  }
}

// call site:
#if DSV4_WS_Q_SMEM
    // through 2 KB of the P buffers per S warp: nothing else touches them before this warp writes P of tile 0
    ws_load_q(p, qf, bi, si, h0 + mq * 16, h_end, lane, (unsigned char*)Pb + mq * 2048);
#else
#ifdef DSV4_EXP_Q16
    {
      const __nv_bfloat16* qq = (const __nv_bfloat16*)p.q + bi * p.q_stride_b + si * p.q_stride_s;
      const int hl = h0 + mq * 16 + g;
#pragma unroll
      for (int G = 0; G < 16; ++G) {
        const uint4 lo = __ldg((const uint4*)(qq + (int64_t)hl * p.q_stride_h + 32 * G + 8 * t4));
        const uint4 hi = __ldg((const uint4*)(qq + (int64_t)(hl + 8) * p.q_stride_h + 32 * G + 8 * t4));
        qf[2 * G][0] = lo.x; qf[2 * G][1] = hi.x; qf[2 * G][2] = lo.y; qf[2 * G][3] = hi.y;
        qf[2 * G + 1][0] = lo.z; qf[2 * G + 1][1] = hi.z; qf[2 * G + 1][2] = lo.w; qf[2 * G + 1][3] = hi.w;
      }
    }
#else
    m64_load_q<kDim / 16>(p, qf, bi, si, h0 + mq * 16 + g, h_end, 0, t4);
#endif

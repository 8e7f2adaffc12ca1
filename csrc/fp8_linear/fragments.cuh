// Bit-level pieces of the FP8 linear kernel (kernel.cuh) that are plain functions of their inputs, host-callable
// so that tests/host/fp8_linear_check.cu checks them on the CPU (every e4m3 byte, every bf16 value, the K
// permutation of one step against a direct dot product):
//   * where one 8-value chunk of x lands in the shared-memory B fragments (x_chunk_slot),
//   * e4m3 -> f16 by integer ops (e4m3x2_lo_to_f16x2 / e4m3x2_hi_to_f16x2: value * 2^-8, exact),
//   * bf16 -> f16 with a power-of-two rescale per 128-K group (x_group_scale, bf16x2_to_f16x2_scaled).
//
// K order inside one 128-K step (the MMA m16n8k16 sees any permutation that A and B share): lane (g, c) of a
// warp holds bytes h * 64 + c * 16 + [0, 16) of each of its two rows (h = 0, 1: two 16-byte loads that together
// cover the rows' whole 128-byte line), MMA s = 4 h + sw (s = 0..7) takes word sw of half h: physical positions
// p = h * 64 + c * 16 + 4 sw + (0, 1, 2, 3). With the cvt decode, logical k (2c, 2c + 1) <- p + (0, 1) and
// (2c + 8, 2c + 9) <- p + (2, 3); with the integer decode (which pairs bytes 0 / 2 and 1 / 3 of a word) they
// are p + (0, 2) and p + (1, 3). The B operand (x) is stored in shared memory already in that order.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __CUDACC__
#include <cuda_fp8.h>
#define DSV4_HD __host__ __device__ __forceinline__
#else
#define DSV4_HD inline
#endif

namespace dsv4 {
namespace fp8lin {

// Shared-memory slot of x chunk j (values 8 j .. 8 j + 7 of one 128-K step, j = 0..15) of token m: token tile
// t = m / 8, piece i (MMAs 2i and 2i + 1), lane g * 4 + c with g = m % 8. Positions 8 j .. 8 j + 7 are
// h = j / 8, c = (j % 8) / 2, and within c's 16 values the half (j % 2), i.e. words sw = 2 (j % 2), + 1.
struct XSlot {
  int t, piece, lane;
};
DSV4_HD XSlot x_chunk_slot(int m, int j) {
  XSlot s;
  s.t = m >> 3;
  s.piece = 2 * (j >> 3) + (j & 1);
  s.lane = (m & 7) * 4 + ((j & 7) >> 1);
  return s;
}

// e4m3 -> f16 by integer ops (the kIntCvt kernels): f16 bits carrying e4m3 * 2^-8 (exponent field e, mantissa
// m << 7; e4m3 subnormals land on f16 subnormals, so the map is exact for every finite byte; the e4m3 NaN bytes
// 0x7f / 0xff read as +-480 * 2^-8). lo: bytes 0 and 2 of w -> {lo half, hi half}; hi: bytes 1 and 3.
DSV4_HD uint32_t e4m3x2_lo_to_f16x2(uint32_t w) {
  return ((w & 0x007F007Fu) << 7) | ((w & 0x00800080u) << 8);
}
DSV4_HD uint32_t e4m3x2_hi_to_f16x2(uint32_t w) {
  return ((w >> 1) & 0x3F803F80u) | (w & 0x80008000u);
}

// e4m3 pair -> f16x2 (byte 0 -> low half, byte 1 -> high half), exact: cvt.rn.f16x2.e4m3x2 on the device
// (sm_89+; one F2FP.F16.E4M3.UNPACK_B, which reads either half of a register: no shift, no repacking), cuda_fp8.h's
// conversion on the host. lo: bytes 0-1 of w, hi: bytes 2-3.
#ifdef __CUDACC__
DSV4_HD uint32_t e4m3x2_lo16_to_f16x2(uint32_t w) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(d) : "r"(w));
  return d;
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
#endif
}
DSV4_HD uint32_t e4m3x2_hi16_to_f16x2(uint32_t w) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(d) : "r"(w));
  return d;
#else
  return e4m3x2_lo16_to_f16x2(w >> 16);
#endif
}
#endif

// The power-of-two rescale of one 128-K group of x whose largest |x| has bf16 bits amax16 (sign cleared):
// f16 = x * 2^s with s = 141 - e (e = amax's biased bf16 exponent field), so that amax * 2^s is in [2^14, 2^15)
// (f16 max 65504). Done in bf16: y = x * 2^(s - 112) (one or two exact multiplies: f1, then f2 when 2^(s - 112)
// is below the normal bf16 range), whose bits << 3 are the f16 bits of x * 2^s (the exponent fields coincide
// since y's exponent <= 29, subnormals included). Exact for every |x| >= 2^(e - 155), i.e. all x within 2^28 of
// amax; smaller ones are rounded once (to the bf16 subnormal grid of y: error <= 2^-36 amax). inv = 2^-s as
// float (possibly subnormal), applied to the fp32 partial of the step. A non-finite group (e = 255) gets f16 NaN
// (nan_group).
struct XScale {
  uint32_t f1, f2;   // bf16x2 factors (f2 = 1.0 when one multiply suffices)
  float inv;
  bool two, nan_group;
};
DSV4_HD float float_from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
DSV4_HD XScale x_group_scale(uint32_t amax16) {
  XScale r;
  const int e = (int)(amax16 >> 7) & 0xFF;
  const int d = 29 - e;   // y = x * 2^d, s = d + 112
  r.nan_group = e == 255;
  r.two = d < -126;
  const int d1 = r.two ? d + 100 : d;
  r.f1 = (uint32_t)((d1 + 127) << 7) * 0x10001u;
  r.f2 = r.two ? (uint32_t)((-100 + 127) << 7) * 0x10001u : 0x3F803F80u;
  const int ie = -d - 112;   // in [-141, 113]
  r.inv = ie >= -126 ? float_from_bits((uint32_t)(ie + 127) << 23) : float_from_bits(1u << (ie + 149));
  return r;
}

// bf16 -> float / round-to-nearest-even float... helpers for the host model of mul.rn.bf16x2.
DSV4_HD uint32_t f16_from_scaled_bf16x2(uint32_t y) {
  // y: bf16x2 with exponents <= 29 -> f16x2 of the same value * 2^112
  return ((y & 0x7FFF7FFFu) << 3) | (y & 0x80008000u);
}

#ifdef __CUDA_ARCH__
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
#else
// Host model of mul.rn.bf16x2 by a power of two (what the kernel multiplies by): the exact product, rounded to
// nearest even on the bf16 grid (normal and subnormal alike).
inline uint32_t mul_bf16_pow2_host(uint32_t a16, uint32_t f16) {
  const uint32_t ua = a16 << 16, uf = f16 << 16;
  float fa, ff;
  memcpy(&fa, &ua, 4);
  memcpy(&ff, &uf, 4);
  const double p = (double)fa * (double)ff;
  const uint32_t sign = (a16 & 0x8000u);
  double mag = p < 0 ? -p : p;
  if (mag != mag) return 0x7FC0u;
  // bf16 grid spacing at mag: 2^(max(exp, -126) - 7)
  int ex;
  (void)frexp(mag, &ex);   // mag = f * 2^ex, f in [0.5, 1)
  int e = ex - 1;
  if (e < -126) e = -126;
  const double q = ldexp(1.0, e - 7);
  double n = mag / q;
  double fl = floor(n);
  double rem = n - fl;
  if (rem > 0.5 || (rem == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  const double v = fl * q;
  const float fv = (float)v;
  uint32_t bits;
  memcpy(&bits, &fv, 4);
  return sign | ((bits >> 16) & 0x7FFFu);
}
inline uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  return mul_bf16_pow2_host(a & 0xFFFFu, b & 0xFFFFu) | (mul_bf16_pow2_host(a >> 16, b >> 16) << 16);
}
#endif

DSV4_HD uint32_t bf16x2_to_f16x2_scaled(uint32_t x, const XScale& s) {
  if (s.nan_group) return 0x7E007E00u;
  uint32_t y = mul_bf16x2(x, s.f1);
  if (s.two) y = mul_bf16x2(y, s.f2);
  return f16_from_scaled_bf16x2(y);
}

// UE8M0 byte -> float scale 2^(b - 127) (b = 0: 2^-127, a float subnormal; b = 255: NaN, as e8m0 defines it).
DSV4_HD float ue8m0_to_float(uint32_t b) {
  b &= 0xFFu;
  return b == 0 ? float_from_bits(0x00400000u) : b == 255 ? float_from_bits(0x7FC00000u) : float_from_bits(b << 23);
}

}  // namespace fp8lin
}  // namespace dsv4

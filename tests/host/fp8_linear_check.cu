// Host-side check of the bit-level pieces of the FP8 linear kernel (csrc/fp8_linear/fragments.cuh), run on the CPU
// by tests/test_extension_build.py::test_fp8_linear_bit_tricks_on_host (nvcc, no GPU needed).
//  1. e4m3x2_lo_to_f16x2 / e4m3x2_hi_to_f16x2 (the integer decode) on every byte pair in both positions, the other
//     bytes junk: each half is exactly e4m3 * 2^-8 (f16, subnormals included) for every non-NaN byte.
//  2. x_group_scale + bf16x2_to_f16x2_scaled (with the host model of mul.rn.bf16x2): for group maxima of every bf16
//     exponent and every bf16 value v with |v| <= amax, the f16 result f is finite, f * inv == v exactly when |v| >=
//     amax * 2^-28, and |f * inv - v| <= 2^-36 amax otherwise; a non-finite amax gives NaN.
//  3. A model of one 128-K step of one warp (compute_step, both decodes, the shared-memory writer's chunk slots and
//     pair order): assembling the m16n8k16 A / B operands from the 32 lanes' registers exactly as the PTX ISA lays
//     them out must give sum_k w[n][k] * x_f16[m][k] over the step's 128 physical K positions.
// Prints "OK <checks>" and exits 0, or prints the first mismatch and exits 1.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "fp8_linear/fragments.cuh"

using namespace dsv4::fp8lin;

static double f16_value(uint32_t h) {
  h &= 0xFFFFu;
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp((double)m, -24);
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}
static double e4m3_value(uint32_t b) {
  b &= 0xFFu;
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = std::ldexp((double)m, -9);
  else v = std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
static double bf16_value(uint32_t b) {
  const uint32_t u = (b & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return (double)f;
}

static long checks = 0;

static int check_int_decode() {
  std::mt19937 rng(1);
  for (uint32_t p = 0; p < 65536u; ++p) {
    const uint32_t b0 = p & 0xFFu, b1 = p >> 8, junk = rng();
    // bytes b0, b1 in positions 0 / 2 (lo) and 1 / 3 (hi), junk elsewhere
    const uint32_t wlo = b0 | (b1 << 16) | (junk & 0xFF00FF00u);
    const uint32_t whi = (b0 << 8) | (b1 << 24) | (junk & 0x00FF00FFu);
    const uint32_t r[2] = {e4m3x2_lo_to_f16x2(wlo), e4m3x2_hi_to_f16x2(whi)};
    for (int k = 0; k < 2; ++k)
      for (int h = 0; h < 2; ++h) {
        const uint32_t b = h ? b1 : b0;
        const double want = e4m3_value(b), got = std::ldexp(f16_value(r[k] >> (16 * h)), 8);
        ++checks;
        if (std::isnan(want)) continue;   // (documented: read as +-480)
        if (got != want) {
          std::printf("FAIL int decode %s: byte 0x%02x -> %g, want %g\n", k ? "hi" : "lo", b, got, want);
          return 1;
        }
      }
  }
  return 0;
}

static int check_x_scale() {
  for (int e = 0; e < 256; ++e)
    for (int am = 0; am < 128; am += 37) {
      const uint32_t amax16 = ((uint32_t)e << 7) | (uint32_t)am;
      const XScale sc = x_group_scale(amax16);
      const double amax = bf16_value(amax16);
      if (e == 255) {
        ++checks;
        if (!std::isnan(f16_value(bf16x2_to_f16x2_scaled(0x3F80u, sc)))) {
          std::printf("FAIL non-finite group: amax bits 0x%04x not NaN\n", amax16);
          return 1;
        }
        continue;
      }
      for (uint32_t v = 0; v < 65536u; v += (e & 7) ? 7u : 1u) {   // every value for some groups, a stride for others
        if ((v & 0x7FFFu) > amax16) continue;
        const double xv = bf16_value(v);
        const uint32_t f = bf16x2_to_f16x2_scaled(v | (v << 16), sc);
        const double lo = f16_value(f) * (double)sc.inv, hi = f16_value(f >> 16) * (double)sc.inv;
        ++checks;
        if (!std::isfinite(f16_value(f)) || lo != hi) {
          std::printf("FAIL x scale: amax 0x%04x v 0x%04x -> f16 0x%08x\n", amax16, v, f);
          return 1;
        }
        const double err = std::fabs(lo - xv);
        const bool exact_zone = std::fabs(xv) >= std::ldexp(amax, -28);
        if ((exact_zone && err != 0.0) || err > std::ldexp(amax, -36)) {
          std::printf("FAIL x scale: amax %g (0x%04x) v %g (0x%04x) -> %g (err %g)\n", amax, amax16, xv, v, lo, err);
          return 1;
        }
      }
    }
  return 0;
}

// One step of one warp: weights w[16][128] bytes, x[8][128] bf16 of 8 tokens (one group max per token).
static int check_step(bool int_cvt, uint32_t seed) {
  std::mt19937 rng(seed);
  uint8_t w[16][128];
  uint16_t x[8][128];
  for (auto& r : w)
    for (auto& b : r) {
      b = (uint8_t)(rng() & 0xFFu);
      if ((b & 0x7Fu) == 0x7Fu) b ^= 1u;   // no NaN bytes
    }
  for (auto& r : x)
    for (auto& v : r) v = (uint16_t)(((rng() % 24u + 115u) << 7) | (rng() & 0x7Fu) | ((rng() & 1u) << 15));
  // the shared-memory writer: per token, one group scale; chunk j -> (tile 0, piece, lane); f16 words (pair order)
  uint32_t smem[4][32][4];   // [piece][lane][word]
  float inv[8];
  for (int m = 0; m < 8; ++m) {
    uint32_t amax = 0;
    for (int k = 0; k < 128; ++k) amax = std::max(amax, (uint32_t)(x[m][k] & 0x7FFFu));
    const XScale sc = x_group_scale(amax);
    inv[m] = sc.inv;
    for (int j = 0; j < 16; ++j) {
      uint32_t r[4];
      for (int q = 0; q < 4; ++q)
        r[q] = bf16x2_to_f16x2_scaled((uint32_t)x[m][8 * j + 2 * q] | ((uint32_t)x[m][8 * j + 2 * q + 1] << 16), sc);
      if (int_cvt) {   // {x0, x2}, {x1, x3}, {x4, x6}, {x5, x7}
        const uint32_t t0 = (r[0] & 0xFFFFu) | (r[1] << 16), t1 = (r[0] >> 16) | (r[1] & 0xFFFF0000u);
        const uint32_t t2 = (r[2] & 0xFFFFu) | (r[3] << 16), t3 = (r[2] >> 16) | (r[3] & 0xFFFF0000u);
        r[0] = t0, r[1] = t1, r[2] = t2, r[3] = t3;
      }
      const XSlot d = x_chunk_slot(m, j);
      if (d.t != 0) return 1;
      for (int q = 0; q < 4; ++q) smem[d.piece][d.lane][q] = r[q];
    }
  }
  // the warp's step: D[n][m] over the 8 MMAs, from the fragments
  double D[16][8] = {};
  for (int s = 0; s < 8; ++s) {
    const int h = s >> 2, sw = s & 3;
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, c = lane & 3;
      uint32_t wg, wh;   // word sw of the lane's 16-byte load of half h, rows g and g + 8
      std::memcpy(&wg, &w[g][h * 64 + c * 16 + 4 * sw], 4);
      std::memcpy(&wh, &w[g + 8][h * 64 + c * 16 + 4 * sw], 4);
      uint32_t a[4];
      if (int_cvt) {
        a[0] = e4m3x2_lo_to_f16x2(wg), a[2] = e4m3x2_hi_to_f16x2(wg);
        a[1] = e4m3x2_lo_to_f16x2(wh), a[3] = e4m3x2_hi_to_f16x2(wh);
      } else {
        a[0] = e4m3x2_lo16_to_f16x2(wg), a[2] = e4m3x2_hi16_to_f16x2(wg);
        a[1] = e4m3x2_lo16_to_f16x2(wh), a[3] = e4m3x2_hi16_to_f16x2(wh);
      }
      const uint32_t* bq = smem[s >> 1][lane];
      const uint32_t b0 = (s & 1) ? bq[2] : bq[0], b1 = (s & 1) ? bq[3] : bq[1];
      // PTX ISA m16n8k16 (.f16): a0 {A[g][2c], A[g][2c+1]}, a1 rows g + 8, a2 cols + 8, a3 both; b0 {B[2c][g],
      // B[2c+1][g]}, b1 rows + 8
      const double sc = int_cvt ? 256.0 : 1.0;
      A[g][2 * c] = f16_value(a[0]) * sc, A[g][2 * c + 1] = f16_value(a[0] >> 16) * sc;
      A[g + 8][2 * c] = f16_value(a[1]) * sc, A[g + 8][2 * c + 1] = f16_value(a[1] >> 16) * sc;
      A[g][2 * c + 8] = f16_value(a[2]) * sc, A[g][2 * c + 9] = f16_value(a[2] >> 16) * sc;
      A[g + 8][2 * c + 8] = f16_value(a[3]) * sc, A[g + 8][2 * c + 9] = f16_value(a[3] >> 16) * sc;
      B[2 * c][g] = f16_value(b0), B[2 * c + 1][g] = f16_value(b0 >> 16);
      B[2 * c + 8][g] = f16_value(b1), B[2 * c + 9][g] = f16_value(b1 >> 16);
    }
    for (int n = 0; n < 16; ++n)
      for (int m = 0; m < 8; ++m)
        for (int k = 0; k < 16; ++k) D[n][m] += A[n][k] * B[k][m];
  }
  for (int n = 0; n < 16; ++n)
    for (int m = 0; m < 8; ++m) {
      double want = 0.0, mag = 0.0;
      for (int k = 0; k < 128; ++k) {
        want += e4m3_value(w[n][k]) * bf16_value(x[m][k]);
        mag += std::fabs(e4m3_value(w[n][k]) * bf16_value(x[m][k]));
      }
      const double got = D[n][m] * (double)inv[m];
      ++checks;
      if (std::fabs(got - want) > 1e-12 * mag) {
        std::printf("FAIL step model (%s, seed %u): row %d token %d: %.17g, want %.17g\n", int_cvt ? "int" : "cvt",
                    seed, n, m, got, want);
        return 1;
      }
    }
  return 0;
}

int main() {
  if (check_int_decode() || check_x_scale()) return 1;
  for (uint32_t seed = 0; seed < 8; ++seed)
    if (check_step(false, seed) || check_step(true, seed)) return 1;
  std::printf("OK %ld\n", checks);
  return 0;
}

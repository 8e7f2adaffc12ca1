// Host-side check of the e2m1 -> bf16 decode of the cuda_decode kernels (csrc/fp4_moe/kernel.cuh), run on
// the CPU by tests/test_extension_build.py::test_fp4_moe_e2m1_decode_on_host (nvcc, no GPU needed).
//  1. e2m1_lo_to_bf16x2 / e2m1_hi_to_bf16x2 (the kernel's own functions) on every pair of bytes, with other
//     bytes of the word set to varying junk: each half must be exactly e2m1 * 2^-126 (as bf16, incl. the
//     subnormal 2^-127 for code 1) of the right nibble, for bytes 0 / 2 and (through w >> 8) 1 / 3.
//  2. A model of one lane-group step of compute_step_body (the K permutation): for the 4 lanes c of a
//     row / column pair, pairing A halves (weights) with B halves (x, selected with prmt as the kernel does)
//     must give exactly sum_k e2m1[k] * x[k] over the 128 values of the step.
//  3. The streaming kernels' item cursor (kernel_stream.cuh advance): stepping item gid by G items without a
//     division must visit (i / tiles, i % tiles) for i = gid + k G, for 1000 (tiles, G, gid) draws.
// Prints "OK <checks>" and exits 0, or prints the first mismatch and exits 1.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "fp4_moe/kernel.cuh"
#include "fp4_moe/kernel_stream.cuh"

using dsv4::fp4moe::e2m1_hi_to_bf16x2;
using dsv4::fp4moe::e2m1_lo_to_bf16x2;

static const double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

static double e2m1_value(uint32_t nibble) {
  const double m = kE2m1[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}
static double bf16_value(uint32_t bits16) {
  const uint32_t u = (bits16 & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return (double)f;
}
// Decoded half (e2m1 * 2^-126) back to the e2m1 value; the kernel multiplies by 2^126 * scale.
static double decoded(uint32_t bits16) { return std::ldexp(bf16_value(bits16), 126); }

// PTX prmt (default mode) on the host: byte i of the result is byte sel[4i..4i+2] of {b, a}; bit 3 of the
// selector nibble replicates that byte's sign (unused here, but modelled).
static uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t pool = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = (uint32_t)(pool >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
}

static int fail(const char* what, uint32_t w, uint32_t got, double want_lo, double want_hi) {
  std::printf("FAIL %s: w=0x%08x decoded 0x%08x = (%g, %g), want (%g, %g)\n", what, w, got, decoded(got),
              decoded(got >> 16), want_lo, want_hi);
  return 1;
}

int main() {
  long checks = 0;
  // 1. every (byte, byte) pair in both positions
  for (uint32_t p = 0; p < 65536u; ++p) {
    const uint32_t b0 = p & 0xFFu, b2 = p >> 8;
    const uint32_t j1 = (b0 * 37u + b2 * 11u + 5u) & 0xFFu, j3 = (~(b0 ^ (b2 << 1))) & 0xFFu;
    const uint32_t w02 = b0 | (j1 << 8) | (b2 << 16) | (j3 << 24);   // pair in bytes 0, 2
    const uint32_t w13 = j1 | (b0 << 8) | (j3 << 16) | (b2 << 24);   // pair in bytes 1, 3
    const double lo0 = e2m1_value(b0), lo2 = e2m1_value(b2), hi0 = e2m1_value(b0 >> 4), hi2 = e2m1_value(b2 >> 4);
    uint32_t d;
    d = e2m1_lo_to_bf16x2(w02);
    if (decoded(d) != lo0 || decoded(d >> 16) != lo2) return fail("lo, bytes 0/2", w02, d, lo0, lo2);
    d = e2m1_hi_to_bf16x2(w02);
    if (decoded(d) != hi0 || decoded(d >> 16) != hi2) return fail("hi, bytes 0/2", w02, d, hi0, hi2);
    d = e2m1_lo_to_bf16x2(w13 >> 8);
    if (decoded(d) != lo0 || decoded(d >> 16) != lo2) return fail("lo, bytes 1/3", w13, d, lo0, lo2);
    d = e2m1_hi_to_bf16x2(w13 >> 8);
    if (decoded(d) != hi0 || decoded(d >> 16) != hi2) return fail("hi, bytes 1/3", w13, d, hi0, hi2);
    checks += 8;
  }
  // 2. the K permutation of one step, random weights / x (x: bf16 in [-4, 4), so every sum is exact in double)
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    double got = 0.0, want = 0.0;
    for (int c = 0; c < 4; ++c) {   // lanes of one row-group / column-group pair
      uint8_t wbytes[16];
      uint16_t x[32];
      for (int i = 0; i < 16; ++i) wbytes[i] = (uint8_t)(rng() & 0xFFu);
      for (int i = 0; i < 32; ++i) {
        const float f = std::ldexp((float)((int)(rng() % 256u) - 128), -5 - (int)(rng() % 4u));
        uint32_t u;
        std::memcpy(&u, &f, 4);
        x[i] = (uint16_t)(u >> 16);   // exact: at most 8 significant bits
      }
      for (int k = 0; k < 32; ++k) want += e2m1_value(wbytes[k / 2] >> (4 * (k % 2))) * bf16_value(x[k]);
      uint32_t words[4], xr[16];
      std::memcpy(words, wbytes, 16);
      for (int i = 0; i < 16; ++i) xr[i] = (uint32_t)x[2 * i] | ((uint32_t)x[2 * i + 1] << 16);
      for (int s = 0; s < 8; ++s) {   // as compute_step_body: word s / 2, odd s on w >> 8, B from regs y / w
        uint32_t w = words[s >> 1];
        if (s & 1) w >>= 8;
        const uint32_t a0 = e2m1_lo_to_bf16x2(w), a2 = e2m1_hi_to_bf16x2(w);
        const uint32_t* xv = xr + 4 * (s >> 1);
        const uint32_t xa = (s & 1) ? xv[1] : xv[0], xb = (s & 1) ? xv[3] : xv[2];
        const uint32_t b0 = prmt(xa, xb, 0x5410u), b1 = prmt(xa, xb, 0x7632u);
        // m16n8k16: a[0] (k 2c, 2c+1) meets b[0], a[2] (k 2c+8, 2c+9) meets b[1], half by half
        got += decoded(a0) * bf16_value(b0) + decoded(a0 >> 16) * bf16_value(b0 >> 16) +
               decoded(a2) * bf16_value(b1) + decoded(a2 >> 16) * bf16_value(b1 >> 16);
      }
    }
    ++checks;
    if (got != want) {
      std::printf("FAIL permutation model, trial %d: %.17g vs %.17g\n", trial, got, want);
      return 1;
    }
  }
  // 3. the item cursor of the streaming kernels
  for (int trial = 0; trial < 1000; ++trial) {
    const int tiles = 1 + (int)(rng() % 300u), G = 1 + (int)(rng() % 2000u), gid = (int)(rng() % (uint32_t)G);
    dsv4::fp4moe::stream::ItemCursor ic = {gid / tiles, gid % tiles};
    for (int k = 0; k < 64; ++k) {
      const long i = gid + (long)k * G;
      if (ic.v != i / tiles || ic.tile != i % tiles) {
        std::printf("FAIL item cursor: tiles %d G %d gid %d k %d: (%d, %d) vs (%ld, %ld)\n", tiles, G, gid, k, ic.v,
                    ic.tile, i / tiles, i % tiles);
        return 1;
      }
      dsv4::fp4moe::stream::advance(ic, G / tiles, G % tiles, tiles);
    }
    ++checks;
  }
  std::printf("OK %ld\n", checks);
  return 0;
}

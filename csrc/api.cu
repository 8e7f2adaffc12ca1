// The one binding of the compiled library: a plain C ABI, loaded with ctypes
// (deepseek_v4_kernel/_ext.py), independent of the torch / Python version.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include "sparse_decode/params.h"
#include "fp4_moe/params.h"
#include "hc_prenorm/params.h"
#include "fp8_linear/params.h"

namespace dsv4 {
cudaError_t launch_sparse_decode(const SparseDecodeParams& p, cudaStream_t stream);
cudaError_t launch_fp4_moe_decode(const Fp4MoeDecodeParams& p, cudaStream_t stream);
cudaError_t launch_fp4_moe_stream(const Fp4MoeStreamParams& p, cudaStream_t stream);
cudaError_t launch_hc_prenorm(const HcPrenormParams& p, cudaStream_t stream);
cudaError_t launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream);
}

#ifndef DSV4_BUILD_ARCHS
#define DSV4_BUILD_ARCHS "unknown"
#endif

static thread_local char g_last_error[512] = "";

static int set_error(const char* op, cudaError_t e, const char* what) {
  snprintf(g_last_error, sizeof(g_last_error), "%s: %s (%s: %s)", op, what, cudaGetErrorName(e),
           cudaGetErrorString(e));
  return (int)e;
}

// Compiled with every other kernel of the library (same -gencode list), so whether the current device can
// load it says whether it can run the library's kernels.
__global__ void dsv4_device_probe_kernel() {}

// What every C entry shares: clear the last error, reject a null parameter block, run the entry's size
// check (`bad(p)` fills g_last_error and returns true for the sizes it rejects), launch, report a failed
// launch.
template <typename Params, typename Bad>
static int call_op(const char* op, const Params* p, void* stream, Bad bad,
                   cudaError_t (*launch)(const Params&, cudaStream_t)) {
  g_last_error[0] = 0;
  if (p == nullptr) {
    snprintf(g_last_error, sizeof(g_last_error), "%s: null params", op);
    return (int)cudaErrorInvalidValue;
  }
  if (bad(p)) return (int)cudaErrorInvalidValue;
  const cudaError_t e = launch(*p, (cudaStream_t)stream);
  if (e != cudaSuccess) return set_error(op, e, "kernel launch failed");
  return 0;
}

extern "C" {

const char* dsv4_last_error(void) { return g_last_error; }

// 0 when the current CUDA device can run this library's kernels; else the CUDA error, e.g.
// cudaErrorNoKernelImageForDevice for a GPU whose arch the library was not built for (sm_120a code runs on
// compute capability 12.0 only). Asked once per device by deepseek_v4_kernel/ops/_device.py, so that an
// op hands the call back instead of failing at launch.
int dsv4_device_supported(void) {
  g_last_error[0] = 0;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, dsv4_device_probe_kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();   // not sticky: clear it for the caller's next CUDA call
    return set_error("device check", e, "the current device cannot run this library's kernels (built for "
                     DSV4_BUILD_ARCHS ")");
  }
  return 0;
}

const char* dsv4_build_archs(void) { return DSV4_BUILD_ARCHS; }

int dsv4_abi_version(void) { return 1; }

int dsv4_sparse_decode_params_size(void) { return (int)sizeof(SparseDecodeParams); }

int dsv4_sparse_decode(const SparseDecodeParams* p, void* stream) {
  return call_op("sparse_decode", p, stream, [](const SparseDecodeParams* p) {
    if (p->b <= 0 || p->s_q <= 0 || p->h_q <= 0 || p->num_splits <= 0 || p->split_tokens <= 0 ||
        p->b * p->s_q > 2147483647LL || p->num_splits > DSV4_SPARSE_DECODE_MAX_SPLITS || p->impl < 0 || p->impl > 8 ||
        (p->plain_launch != 0 && p->plain_launch != 1)) {
      snprintf(g_last_error, sizeof(g_last_error),
               "sparse_decode: bad sizes b=%lld s_q=%lld h_q=%lld splits=%lld impl=%lld plain_launch=%lld (expected b, "
               "s_q, h_q >= 1, b*s_q < 2^31, 1 <= splits <= %d, 0 <= impl <= 8, plain_launch 0 or 1)",
               (long long)p->b, (long long)p->s_q, (long long)p->h_q, (long long)p->num_splits, (long long)p->impl,
               (long long)p->plain_launch, DSV4_SPARSE_DECODE_MAX_SPLITS);
      return true;
    }
    return false;
  }, dsv4::launch_sparse_decode);
}

int dsv4_fp4_moe_decode_params_size(void) { return (int)sizeof(Fp4MoeDecodeParams); }

int dsv4_fp4_moe_decode(const Fp4MoeDecodeParams* p, void* stream) {
  return call_op("fp4_moe_decode", p, stream, [](const Fp4MoeDecodeParams* p) {
    const long long slots = (long long)p->M * (long long)p->topk;
    if (p->M < 1 || p->topk < 1 || slots > DSV4_FP4_MOE_MAX_SLOTS || p->E < 1 || p->E > 2147483647LL ||
        p->hidden < 128 || p->hidden % 128 || p->inter < 128 || p->inter % 128 || p->w13_stride_n % 16 ||
        p->w2_stride_n % 16 || p->x_stride % 8 || ((uintptr_t)p->x | (uintptr_t)p->w13 | (uintptr_t)p->w2) % 16) {
      snprintf(g_last_error, sizeof(g_last_error),
               "fp4_moe_decode: bad sizes M=%lld topk=%lld E=%lld hidden=%lld I=%lld (expected 1 <= M*topk <= %d, "
               "hidden and I positive multiples of 128, 16-byte aligned x / w13 / w2 rows)",
               (long long)p->M, (long long)p->topk, (long long)p->E, (long long)p->hidden, (long long)p->inter,
               DSV4_FP4_MOE_MAX_SLOTS);
      return true;
    }
    return false;
  }, dsv4::launch_fp4_moe_decode);
}

// Variants the launcher has (fp4_moe.cu): 0-5, the diagnostics DIAG_LOADS | 0, 1, 3 and DIAG_COMPUTE | 0, 1 (uint8
// scales only); the shared-memory rings (2, 3, 5 and DIAG_LOADS | 3) copy 4-byte scale words, so uint8 scale rows
// must start 4-byte aligned.
static bool fp4_moe_stream_variant_ok(const Fp4MoeStreamParams* sp) {
  const Fp4MoeDecodeParams* p = &sp->d;
  const int64_t v = sp->variant & 15, diag = sp->variant & ~(int64_t)15;
  if (v < 0 || v >= DSV4_FP4_MOE_STREAM_VARIANTS) return false;
  if (diag == DSV4_FP4_MOE_DIAG_LOADS) {
    if (v != 0 && v != 1 && v != 3) return false;
  } else if (diag == DSV4_FP4_MOE_DIAG_COMPUTE) {
    if (v != 0 && v != 1) return false;
  } else if (diag != 0) {
    return false;
  }
  if (diag != 0 && (p->s13_f32 || p->s2_f32)) return false;
  const bool smem = v == 2 || v == 3 || v == 5;
  if (smem) {
    if (!p->s13_f32 && (((uintptr_t)p->s13 % 4) || p->s13_stride_e % 4 || p->s13_stride_n % 4)) return false;
    if (!p->s2_f32 && (((uintptr_t)p->s2 % 4) || p->s2_stride_e % 4 || p->s2_stride_n % 4)) return false;
    if (p->s13_f32 && ((uintptr_t)p->s13 % 4)) return false;
    if (p->s2_f32 && ((uintptr_t)p->s2 % 4)) return false;
  }
  return true;
}

int dsv4_fp4_moe_stream_params_size(void) { return (int)sizeof(Fp4MoeStreamParams); }

int dsv4_fp4_moe_stream(const Fp4MoeStreamParams* p, void* stream) {
  return call_op("fp4_moe_stream", p, stream, [](const Fp4MoeStreamParams* sp) {
    const Fp4MoeDecodeParams* p = &sp->d;
    const long long slots = (long long)p->M * (long long)p->topk;
    if (p->M < 1 || p->topk < 1 || slots > DSV4_FP4_MOE_STREAM_MAX_SLOTS || p->E < 1 ||
        p->E > DSV4_FP4_MOE_STREAM_MAX_EXPERTS || p->hidden < 128 || p->hidden % 128 || p->hidden > (1 << 20) ||
        p->inter < 128 || p->inter % 128 || p->inter > (1 << 20) || p->w13_stride_n % 16 || p->w2_stride_n % 16 ||
        p->x_stride % 8 || ((uintptr_t)p->x | (uintptr_t)p->w13 | (uintptr_t)p->w2 | (uintptr_t)p->y) % 16 ||
        p->h == nullptr || p->y == nullptr || p->counters == nullptr ||
        (sp->wpi1 != 1 && sp->wpi1 != 2 && sp->wpi1 != 4) || (sp->wpi2 != 1 && sp->wpi2 != 2 && sp->wpi2 != 4) ||
        !fp4_moe_stream_variant_ok(sp) || sp->blocks_per_sm < 0) {
      snprintf(g_last_error, sizeof(g_last_error),
               "fp4_moe_stream: bad arguments M=%lld topk=%lld E=%lld hidden=%lld I=%lld wpi=%lld/%lld variant=%lld "
               "blocks_per_sm=%lld (expected 1 <= M*topk <= %d, 1 <= E <= %d, hidden and I multiples of 128 in "
               "[128, 2^20], 16-byte aligned x / w13 / w2 rows and y, h / y / counters workspaces, wpi 1, 2 or 4, "
               "variant 0-5 (shared-memory ring 2, 3, 5: 4-byte aligned uint8 scale rows), a diagnostic (variant | 16: "
               "0, 1, 3; | 32: 0, 1) only with uint8 scales, blocks_per_sm >= 0)",
               (long long)p->M, (long long)p->topk, (long long)p->E, (long long)p->hidden, (long long)p->inter,
               (long long)sp->wpi1, (long long)sp->wpi2, (long long)sp->variant, (long long)sp->blocks_per_sm,
               DSV4_FP4_MOE_STREAM_MAX_SLOTS, DSV4_FP4_MOE_STREAM_MAX_EXPERTS);
      return true;
    }
    return false;
  }, dsv4::launch_fp4_moe_stream);
}

int dsv4_hc_prenorm_params_size(void) { return (int)sizeof(HcPrenormParams); }

int dsv4_hc_prenorm(const HcPrenormParams* p, void* stream) {
  return call_op("hc_prenorm", p, stream, [](const HcPrenormParams* p) {
    const long long m_tiles = (long long)((p->m + 63) / 64);
    if (p->m < 1 || m_tiles > 2147483647LL || p->n < 1 || p->n > DSV4_HC_PRENORM_MAX_N || p->K < 8 || p->K % 8 ||
        p->num_splits < 1 || p->sub_splits < 1 || p->sub_splits > DSV4_HC_PRENORM_MAX_SUB ||
        p->num_splits * p->sub_splits > 65535 || p->x_stride % 8 || p->fn_stride % 4 ||
        ((uintptr_t)p->x | (uintptr_t)p->fn) % 16 ||
        (p->sub_splits > 1 && p->atomic_sum == 0 &&
         ((p->ws == nullptr && p->xchg == nullptr) ||
          (p->counters == nullptr && p->small_rows == 0 && (p->mma_rows == 0 || p->mma_rows == 64))))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad sizes m=%lld n=%lld K=%lld splits=%lld sub_splits=%lld (expected m >= 1, "
               "1 <= n <= %d, K a positive multiple of 8, 1 <= sub_splits <= %d, splits * sub_splits <= 65535, "
               "16-byte aligned x / fn rows, a workspace (or, few-rows kernel, an exchange buffer) and counters (the "
               "64-row MMA kernel) when sub_splits > 1 without atomic_sum)",
               (long long)p->m, (long long)p->n, (long long)p->K, (long long)p->num_splits, (long long)p->sub_splits,
               DSV4_HC_PRENORM_MAX_N, DSV4_HC_PRENORM_MAX_SUB);
      return true;
    }
    const long long r = (long long)p->small_rows;
    if (r != 0 && (r < 0 || (r & (r - 1)) != 0 || r > DSV4_HC_PRENORM_SMALL_MAX_ROWS || (p->m + r - 1) / r > 65535 ||
                   p->K >= (1LL << 30) ||   // the kernel's K arithmetic is 32-bit
                   (p->sub_splits > 1 && (p->n != DSV4_HC_PRENORM_MAX_N || p->num_splits != 1 || (uintptr_t)p->ws % 16)))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad small_rows=%lld (expected 0, or a power of two <= %d with ceil(m / small_rows) <= 65535 "
               "(m=%lld) and K < 2^30 (K=%lld), and n = %d, one split and a 16-byte aligned workspace when sub_splits > 1 (n=%lld, "
               "splits=%lld, sub_splits=%lld))",
               r, DSV4_HC_PRENORM_SMALL_MAX_ROWS, (long long)p->m, (long long)p->K, DSV4_HC_PRENORM_MAX_N, (long long)p->n,
               (long long)p->num_splits, (long long)p->sub_splits);
      return true;
    }
    if (p->fn_groups != 0 && p->fn_groups != 1 &&
        ((p->fn_groups != 3 && p->fn_groups != 6) || (r != 2 && r != 4 && r != 8) || p->sub_splits != 1 ||
         p->xchg != nullptr || p->atomic_sum != 0 || (p->m + r - 1) / r * p->fn_groups > 65535)) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad fn_groups=%lld (expected 0 or 1, or 3 or 6 with small_rows 2, 4 or 8, sub_splits 1, no "
               "xchg, no atomic_sum and ceil(m / small_rows) * fn_groups <= 65535; got small_rows=%lld, sub_splits=%lld, "
               "atomic_sum=%lld, m=%lld)",
               (long long)p->fn_groups, r, (long long)p->sub_splits, (long long)p->atomic_sum, (long long)p->m);
      return true;
    }
    if (p->fn_row_kernel != 0 &&
        (p->fn_row_kernel != 1 || p->m > DSV4_HC_PRENORM_FNROW_MAX_M || p->num_splits != 1 || p->sub_splits != 1 ||
         r != 0 || p->xchg != nullptr || p->K >= (1LL << 30))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad fn_row_kernel=%lld (expected 0, or 1 with m <= %d, one split, sub_splits 1, "
               "small_rows 0, no xchg, K < 2^30; got m=%lld, splits=%lld, sub_splits=%lld, small_rows=%lld, K=%lld)",
               (long long)p->fn_row_kernel, DSV4_HC_PRENORM_FNROW_MAX_M, (long long)p->m, (long long)p->num_splits,
               (long long)p->sub_splits, r, (long long)p->K);
      return true;
    }
    if (p->xchg != nullptr && (r == 0 || p->sub_splits < 2 || p->m > DSV4_HC_PRENORM_XCHG_ROWS ||
                               (uintptr_t)p->xchg % 8)) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad xchg (an exchange buffer is taken only by the few-rows kernel with sub_splits > 1, "
               "m <= %d and 8-byte alignment; got small_rows=%lld, sub_splits=%lld, m=%lld, xchg %% 8 = %d)",
               DSV4_HC_PRENORM_XCHG_ROWS, r, (long long)p->sub_splits, (long long)p->m, (int)((uintptr_t)p->xchg % 8));
      return true;
    }
    // atomic_sum: P > 1 sub-slices of one split added into out [m, 24] by float4 atomics (kernel_small.cuh and
    // kernel.cuh kAtomic); the MMA kernel (small_rows 0) only as its kFast instance: kernel.cuh kRows = 64 rows at
    // least, K a multiple of kChunk = 32, out rows contiguous
    if (p->atomic_sum != 0 &&
        (p->atomic_sum != 1 || p->sub_splits < 2 || p->num_splits != 1 || p->n != DSV4_HC_PRENORM_MAX_N ||
         p->xchg != nullptr || p->fn_row_kernel != 0 || p->out_stride_n != 1 || p->out_stride_m % 4 != 0 ||
         (uintptr_t)p->out % 16 != 0 ||
         (r == 0 && (p->m < (p->mma_rows ? p->mma_rows : 64) || p->K % 32 != 0 ||
                     p->out_stride_m != DSV4_HC_PRENORM_MAX_N)))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad atomic_sum=%lld (expected 0, or 1 with sub_splits > 1, one split, n = %d, "
               "no xchg, no fn_row_kernel, out with unit n stride, m stride %% 4 == 0 and a 16-byte aligned "
               "base, and with small_rows 0 also m >= mma_rows (64 when 0), K %% 32 == 0 and out m stride 24; got "
               "sub_splits=%lld, splits=%lld, n=%lld, m=%lld, K=%lld, small_rows=%lld, out strides (m %lld, "
               "n %lld), out %% 16 = %d)",
               (long long)p->atomic_sum, DSV4_HC_PRENORM_MAX_N, (long long)p->sub_splits, (long long)p->num_splits,
               (long long)p->n, (long long)p->m, (long long)p->K, r, (long long)p->out_stride_m,
               (long long)p->out_stride_n, (int)((uintptr_t)p->out % 16));
      return true;
    }
    // mma_rows: the kFast MMA kernel with 16 / 32 x rows per block (kernel.cuh kR), with the atomic sum or
    // with no sub-slices; never silently another kernel
    const long long mr = (long long)p->mma_rows;
    const bool out_rows =
        p->out_stride_n == 1 && p->out_stride_m == DSV4_HC_PRENORM_MAX_N && (uintptr_t)p->out % 16 == 0;
    if (mr != 0 && mr != 64 &&
        ((mr != 16 && mr != 32) || r != 0 || p->fn_row_kernel != 0 || p->xchg != nullptr ||
         p->n != DSV4_HC_PRENORM_MAX_N || p->K % 32 != 0 || p->m < mr ||
         !(p->atomic_sum == 1 ||
           (p->sub_splits == 1 && out_rows && (p->num_splits == 1 || p->out_stride_s % 4 == 0)) ||
           (p->sub_splits > 1 && p->ws != nullptr && (uintptr_t)p->ws % 16 == 0)))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "hc_prenorm: bad mma_rows=%lld (expected 0 or 64, or 16 / 32 for the MMA kernel's fast instance: "
               "small_rows 0, no fn_row_kernel / xchg, n = %d, K %% 32 == 0, m >= mma_rows, and atomic_sum, or "
               "sub_splits 1 with out [S, m, 24] rows contiguous and 16-byte aligned (S stride %% 4 == 0), or "
               "sub_splits > 1 with a 16-byte aligned workspace; got m=%lld, "
               "n=%lld, K=%lld, small_rows=%lld, splits=%lld, sub_splits=%lld, atomic_sum=%lld, out strides (s %lld, "
               "m %lld, n %lld), out %% 16 = %d)",
               mr, DSV4_HC_PRENORM_MAX_N, (long long)p->m, (long long)p->n, (long long)p->K, r,
               (long long)p->num_splits, (long long)p->sub_splits, (long long)p->atomic_sum,
               (long long)p->out_stride_s, (long long)p->out_stride_m, (long long)p->out_stride_n,
               (int)((uintptr_t)p->out % 16));
      return true;
    }
    return false;
  }, dsv4::launch_hc_prenorm);
}

int dsv4_fp8_linear_params_size(void) { return (int)sizeof(Fp8LinearParams); }

int dsv4_fp8_linear(const Fp8LinearParams* p, void* stream) {
  return call_op("fp8_linear", p, stream, [](const Fp8LinearParams* p) {
    const long long steps = p->K / 128;
    const long long max_splits = steps < DSV4_FP8_LINEAR_MAX_SPLITS ? steps : DSV4_FP8_LINEAR_MAX_SPLITS;
    const long long tiles = (p->N + DSV4_FP8_LINEAR_TILE_N - 1) / DSV4_FP8_LINEAR_TILE_N;
    if (p->M < 1 || p->M > DSV4_FP8_LINEAR_MAX_M || p->N < 1 || tiles > 2147483647LL || p->K < 128 || p->K % 128 ||
        p->G < 1 || p->G > 65535 || p->splits < 1 || p->splits > max_splits || p->scale_mode < 0 ||
        p->scale_mode > 2 || (p->cvt_int != 0 && p->cvt_int != 1) ||
        (p->kernel != DSV4_FP8_LINEAR_KERNEL_RING && p->kernel != DSV4_FP8_LINEAR_KERNEL_REGS) ||
        (p->kernel == DSV4_FP8_LINEAR_KERNEL_RING && (p->xf == nullptr || (uintptr_t)p->xf % 16)) ||
        p->x_stride_m % 8 || p->x_stride_g % 8 ||
        p->w_stride_n % 16 || p->w_stride_g % 16 || p->w_stride_n < p->K || 8 * p->w_stride_n > 2147483647LL ||
        32 * p->s_stride_n > 2147483647LL || ((uintptr_t)p->x | (uintptr_t)p->w) % 16 || p->x == nullptr ||
        p->w == nullptr || p->scale == nullptr || p->out == nullptr ||
        (p->splits > 1 && (p->ws == nullptr || p->counters == nullptr))) {
      snprintf(g_last_error, sizeof(g_last_error),
               "fp8_linear: bad sizes M=%lld N=%lld K=%lld G=%lld splits=%lld scale_mode=%lld cvt_int=%lld kernel=%lld "
               "(expected "
               "1 <= M <= %d, N >= 1, K a positive multiple of 128, 1 <= G <= 65535, 1 <= splits <= min(K / 128, %d), "
               "scale_mode 0-2, cvt_int 0 or 1, kernel 0 (ring, with a 16-byte aligned xf buffer) or 1, 16-byte aligned "
               "x / w rows (x strides %% 8, w strides %% 16, w row "
               "stride >= K and < 2^28), non-null x / w / scale / out, a workspace and counters when splits > 1)",
               (long long)p->M, (long long)p->N, (long long)p->K, (long long)p->G, (long long)p->splits,
               (long long)p->scale_mode, (long long)p->cvt_int, (long long)p->kernel, DSV4_FP8_LINEAR_MAX_M,
               DSV4_FP8_LINEAR_MAX_SPLITS);
      return true;
    }
    return false;
  }, dsv4::launch_fp8_linear);
}

}  // extern "C"

// Launcher of the hc_prenorm GEMM kernel (see kernel.cuh).
#include <algorithm>
#include "hc_prenorm/kernel.cuh"
#include "hc_prenorm/kernel_small.cuh"

namespace dsv4 {

static PdlSwitch g_hc_pdl("DSV4_HC_PRENORM_PDL");   // "0": plain launches (same switch as the Triton path)

// the exchange sums each value as the reduce grid does (kXChains chains of every kXChains-th partial, then the
// chains in order), so both give the same bits: the two constants must stay equal
static_assert(hcs::kXChains == hcp::kRedWarps, "xchg_consume's chains must be the reduce grid's warps");

// the few-rows kernel's instances by rows per block R = small_rows: <x rows per lane, fn rows per lane, row
// groups, columns per lane and round>, with or without the in-launch sum of the sub-slices (kXchg) or their atomic
// sum (kAtomic)
template <bool kXchg, bool kAtomic = false>
static cudaError_t launch_small(const HcPrenormParams& q, dim3 grid, bool pdl, cudaStream_t stream) {
  using namespace hcs;
  const auto go = [&](void (*kernel)(HcPrenormParams)) {
    return launch_kernel(kernel, grid, kThreads, 0, pdl, stream, q);
  };
  if constexpr (!kXchg && !kAtomic) {
    // fn_groups 3 / 6 (api.cu: small_rows 2 / 4 / 8, plain stores): 8 / 4 fn rows per block, one round of loads per
    // 256-wide split (16 / 32 K lanes per slot); grid y = row blocks x fn_groups (the caller's grid)
    if (q.fn_groups == 3) {
      switch (q.small_rows) {
        case 2: return go(hc_prenorm_small_kernel<1, 1, 2, 4, false, false, 3>);
        case 4: return go(hc_prenorm_small_kernel<1, 2, 4, 4, false, false, 3>);
        case 8: return go(hc_prenorm_small_kernel<2, 2, 4, 4, false, false, 3>);
        default: return cudaErrorInvalidValue;   // api.cu refuses it by name first
      }
    }
    if (q.fn_groups == 6) {
      switch (q.small_rows) {
        case 2: return go(hc_prenorm_small_kernel<1, 1, 2, 2, false, false, 6>);
        case 4: return go(hc_prenorm_small_kernel<1, 2, 4, 2, false, false, 6>);
        case 8: return go(hc_prenorm_small_kernel<2, 2, 4, 2, false, false, 6>);
        default: return cudaErrorInvalidValue;
      }
    }
  }
  switch (q.small_rows) {
    case 1: return go(hc_prenorm_small_kernel<1, 3, 1, 2, kXchg, kAtomic>);
    case 2: return go(hc_prenorm_small_kernel<1, 3, 2, 4, kXchg, kAtomic>);
    case 4: return go(hc_prenorm_small_kernel<1, 3, 4, 4, kXchg, kAtomic>);
    case 8: return go(hc_prenorm_small_kernel<2, 3, 4, 4, kXchg, kAtomic>);
    case 16: return go(hc_prenorm_small_kernel<4, 3, 4, 4, kXchg, kAtomic>);
    default: return cudaErrorInvalidValue;   // api.cu refuses it by name first
  }
}

// the kFast MMA kernel (kernel.cuh) with mma_rows x rows per block (0: kRows = 64; api.cu checks the shapes), grid
// (row tiles, z) where z = the sub-slices (kAtomic), the caller's splits, or splits x sub-slices into the workspace.
// 16 / 32 rows: two blocks per SM (<= 128 registers, no spills on sm_120a); a 48-row instance (236 registers, one
// block per SM) won only at m = 96 with 64 splits, by 5 % (H100), and was not kept
template <bool kAtomic>
static cudaError_t launch_fast(const HcPrenormParams& q, unsigned z, bool pdl, cudaStream_t stream) {
  using namespace hcp;
  const int64_t rows = q.mma_rows ? q.mma_rows : kRows;
  const dim3 grid((unsigned)((q.m + rows - 1) / rows), z);
  switch (rows) {
    case 16: return launch_kernel(hc_prenorm_kernel<true, kAtomic, 16>, grid, kThreads, 0, pdl, stream, q);
    case 32: return launch_kernel(hc_prenorm_kernel<true, kAtomic, 32>, grid, kThreads, 0, pdl, stream, q);
    case kRows: return launch_kernel(hc_prenorm_kernel<true, kAtomic>, grid, kThreads, 0, pdl, stream, q);
    default: return cudaErrorInvalidValue;   // api.cu refuses it by name first
  }
}

cudaError_t launch_hc_prenorm(const HcPrenormParams& p, cudaStream_t stream) {
  using namespace hcp;
  bool pdl = false;
  cudaError_t e = pdl_enabled(g_hc_pdl, &pdl);
  if (e != cudaSuccess) return e;
  // P > 1 with n = 24 (both kernels' callers check it): the S P partials go to the workspace as out [S P, m, 24]
  // and sqrsum [S P, m], and hc_prenorm_reduce_kernel (PDL) sums them into the caller's out / sqrsum
  auto to_workspace = [&p]() {
    HcPrenormParams q = p;
    q.out = p.ws;
    q.out_stride_s = p.m * kN;
    q.out_stride_m = kN;
    q.out_stride_n = 1;
    q.sqrsum = p.ws + p.num_splits * p.sub_splits * p.m * kN;
    q.sq_stride_s = p.m;
    q.sq_stride_m = 1;
    return q;
  };
  auto reduce = [&]() {
    const int64_t units = p.num_splits * p.m * (kN / 4 + 1);   // float4s of out + sqrsum values
    return launch_kernel(hc_prenorm_reduce_kernel, dim3((unsigned)((units + 31) / 32)), 32 * kRedWarps, 0, pdl,
                         stream, p);
  };
  if (p.atomic_sum) {
    // P > 1 sub-slices of one split (api.cu checks the shapes): the zero kernel, then the GEMM grid adds every
    // sub-slice's sums into the caller's out / sqrsum (its S stride 0: one [m, 24] for all); see kernel_small.cuh
    const int64_t zeros = p.m * (p.n + 1);
    e = launch_kernel(hc_prenorm_zero_kernel,
                      dim3((unsigned)std::min<int64_t>((zeros + kZeroThreads - 1) / kZeroThreads, kZeroMaxBlocks)),
                      kZeroThreads, 0, pdl, stream, p);
    if (e != cudaSuccess) return e;
    HcPrenormParams q = p;
    q.out_stride_s = 0;
    q.sq_stride_s = 0;
    if (p.small_rows > 0) {   // the few-rows kernel sees the P sub-slices as P splits
      q.num_splits = p.sub_splits;
      q.sub_splits = 1;
      return launch_small<false, true>(
          q, dim3((unsigned)q.num_splits, (unsigned)((p.m + p.small_rows - 1) / p.small_rows)), pdl, stream);
    }
    return launch_fast<true>(q, (unsigned)p.sub_splits, pdl, stream);
  }
  if (p.fn_row_kernel) {   // m <= 2, one split (api.cu): one block per fn row over the whole K
    // <x rows, float4 columns per thread and round>: <= 64 registers for 1024 threads, no spills (sm_120a / sm_90a).
    // (m = 3 / 4 instances with two rounds were slower than the exchange: 4.2 / 4.7 against 3.7 us, H100)
    const dim3 grid((unsigned)p.n);
    return p.m == 1 ? launch_kernel(hcs::hc_prenorm_fnrow_kernel<1, 4>, grid, hcs::kRowThreads, 0, pdl, stream, p)
                    : launch_kernel(hcs::hc_prenorm_fnrow_kernel<2, 4>, grid, hcs::kRowThreads, 0, pdl, stream, p);
  }
  if (p.small_rows > 0) {
    // the few-rows kernel (kernel_small.cuh), R = small_rows x rows per block (instances: launch_small), two
    // blocks per SM (<= 128 registers). A 256-wide split
    // (SGLang's 64 splits of K = 16384) is one round of loads up to R = 2, two rounds from R = 4 (one round
    // there needs > 128 registers, one block per SM: H100, 3 % faster at m = 16, 11-44 % slower at
    // m = 32-64). H100: the 16-row block as 8 x 3 / 4 x 6 / 2 x 3 per lane, or a 32-row block, was
    // 10-90 % slower at m = 16-64; H100: 8 x 3 x 2 row groups the same as 4 x 3 x 4 or up to 4 % slower.
    // P > 1 (one caller split, api.cu): the kernel sees the P sub-slices as P splits of the workspace.
    // With an exchange buffer (p.xchg) the sub-slices' partials are summed in the launch (kernel_small.cuh,
    // xchg_consume) and written to the caller's out / sqrsum: no workspace, no reduce grid.
    const bool xchg = p.sub_splits > 1 && p.xchg != nullptr;
    HcPrenormParams q = p;
    if (p.sub_splits > 1) {
      if (!xchg) q = to_workspace();
      q.num_splits = p.sub_splits;
      q.sub_splits = 1;
    }
    const int64_t groups = p.fn_groups > 1 ? p.fn_groups : 1;   // api.cu: 3 / 6 only without sub-slices
    const dim3 grid((unsigned)q.num_splits, (unsigned)((p.m + p.small_rows - 1) / p.small_rows * groups));
    e = xchg ? launch_small<true>(q, grid, pdl, stream) : launch_small<false>(q, grid, pdl, stream);
    if (e != cudaSuccess || p.sub_splits == 1 || xchg) return e;
    return reduce();
  }
  // x rows per block: mma_rows 16 / 32 only with the kFast shape (api.cu checks it, so nothing below falls back
  // to the general kernel with them)
  const bool few_rows = p.mma_rows != 0 && p.mma_rows != kRows;
  // the kFast kernel's conditions (kernel.cuh): at least one whole tile of rows, whole chunks, 24 fn rows;
  // P = 1: out row-contiguous with 16-byte aligned rows (its S stride matters only when S > 1)
  const bool fast_shape = p.m >= (few_rows ? p.mma_rows : kRows) && p.K % kChunk == 0 && p.n == kN;
  if (p.sub_splits > 1 && fast_shape && ((uintptr_t)p.ws & 15) == 0) {
    // P > 1: the kFast kernel stores the S * P partials into the workspace as its out [S * P, m, 24] and
    // sqrsum [S * P, m], the reduce grid (PDL) sums them into the caller's out / sqrsum
    e = launch_fast<false>(to_workspace(), (unsigned)(p.num_splits * p.sub_splits), pdl, stream);
    if (e != cudaSuccess) return e;
    return reduce();
  }
  // P = 1 (with 16 / 32 rows always: api.cu checks their out rows)
  const bool fast = p.sub_splits == 1 && fast_shape && p.out_stride_n == 1 && p.out_stride_m == kN &&
                    (p.num_splits == 1 || p.out_stride_s % 4 == 0) && ((uintptr_t)p.out & 15) == 0;
  if (fast) return launch_fast<false>(p, (unsigned)p.num_splits, pdl, stream);
  const dim3 grid((unsigned)((p.m + kRows - 1) / kRows), (unsigned)(p.num_splits * p.sub_splits));
  return launch_kernel(hc_prenorm_kernel<false>, grid, kThreads, 0, pdl, stream, p);
}

}  // namespace dsv4

// Weight sources of the streaming kernels (kernel_stream.cuh, template arguments kSrc and kDiag):
//
//   kSrcRegs     the register ring of kernel.cuh: each warp keeps kSt - 1 steps of ld.global.nc in flight in
//                registers (variants 0, 1, 4);
//   kSrcSmem     a shared-memory ring per warp filled by cp.async (16-byte .cg copies of the weights with the L2::256B
//                prefetch hint, 4-byte .ca copies of the scale words): kSt stages of kStageBytes each, kSt - 1 in
//                flight, freed from the register file, so the ring is deeper for the same registers (variants 2, 3,
//                5). Every lane copies exactly the bytes it later reads (its 4 rows x 16 B, and the 4-byte word holding
//                its scale), so a lane only waits for its own copies (cp.async.wait_group) and no warp barrier is
//                needed; the stage is read back with LDS.128 in the register layout that load_weights gives, so the
//                decode and the MMA code are the same;
//   kDiagLoads   bench-only diagnostic (either source): the same weight and B-operand stream, the decode and MMA
//                replaced by an XOR fold into one register (stored in the epilogue, so nothing is optimised away):
//                the memory-side ceiling of that load scheme;
//   kDiagCompute bench-only diagnostic (register source): decode + MMA (and the B-operand loads) on weights loaded
//                once into the ring registers and reused every step (made opaque to the compiler each step, so the
//                decode is not hoisted): the compute-side ceiling of the same instruction stream.
// The diagnostics give wrong results by design; the C ABI takes them only with uint8 scales, the bench names them
// cuda_stream_diag_*.
#pragma once
#include "fp4_moe/kernel.cuh"

namespace dsv4 {
namespace fp4moe {
namespace stream {

constexpr int kSrcRegs = 0, kSrcSmem = 1;
constexpr int kDiagLoads = 1, kDiagCompute = 2;
// One warp step of the shared-memory ring: weights [kRows][32 lanes] x 16 B, then scale words [kRows][32 lanes] x 4 B.
constexpr int kStageWBytes = kRows * 32 * 16;
constexpr int kStageBytes = kStageWBytes + kRows * 32 * 4;   // 2560
// Dynamic shared memory of a block for a ring of kSt stages per warp (0 for the register sources).
__host__ __device__ constexpr int ring_smem_bytes(int src, int st) {
  return src == kSrcSmem ? kWarps * st * kStageBytes : 0;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
#if DSV4_FP4_MOE_W_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#elif DSV4_FP4_MOE_W_PREFETCH == 128
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// cp.async form of load_weights: step q of this lane's rows into `stage`. uint8 scales: the aligned word holding
// the lane's byte (the scale row offset + 4 q is a multiple of 4: the C ABI checks the pointer and strides).
template <bool kScaleF32>
__device__ __forceinline__ void copy_weights(uint8_t* stage, const Rows& r, const void* scales, int q, int lane,
                                             int c) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    cp_async16(smem_u32(stage + (i * 32 + lane) * 16), r.w[i] + (int64_t)q * kStepBytes + c * 16);
    const int64_t idx = r.s[i] + q * (kStepK / kGroup);
    const void* src = kScaleF32 ? static_cast<const void*>(reinterpret_cast<const uint32_t*>(scales) + idx + c)
                                : static_cast<const void*>(reinterpret_cast<const uint8_t*>(scales) + idx);
    cp_async4(smem_u32(stage + kStageWBytes + (i * 32 + lane) * 4), src);
  }
}

// The stage back into registers, as load_weights leaves them.
template <bool kScaleF32>
__device__ __forceinline__ void read_stage(WeightStep& st, const uint8_t* stage, int lane, int c) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    st.w[i] = *reinterpret_cast<const uint4*>(stage + (i * 32 + lane) * 16);
    if (kScaleF32)
      st.e[i] = (*reinterpret_cast<const uint32_t*>(stage + kStageWBytes + (i * 32 + lane) * 4) >> 23) & 0xFFu;
    else
      st.e[i] = stage[kStageWBytes + (i * 32 + lane) * 4 + c];
  }
}

// kDiagLoads: the step's weights folded into one register; the B operand refilled as compute_step does.
__device__ __forceinline__ void diag_fold_step(uint32_t& fold, const WeightStep& st, OperandStep& op,
                                               const __nv_bfloat16* next) {
  uint32_t f = fold;
#pragma unroll
  for (int i = 0; i < kRows; ++i) f ^= st.w[i].x ^ st.w[i].y ^ st.w[i].z ^ st.w[i].w ^ st.e[i];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f ^= op.b[j].x ^ op.b[j].w;
    ld_cg16_if(op.b[j], next != nullptr ? next + 8 * j : nullptr);
  }
  fold = f;
}

// kDiagCompute: the compiler must not know that the ring registers keep their values from step to step.
__device__ __forceinline__ void make_opaque(WeightStep& st) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    asm volatile("" : "+r"(st.w[i].x), "+r"(st.w[i].y), "+r"(st.w[i].z), "+r"(st.w[i].w), "+r"(st.e[i]));
}

}  // namespace stream
}  // namespace fp4moe
}  // namespace dsv4

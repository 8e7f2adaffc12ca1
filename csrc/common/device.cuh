// Device and launch helpers shared by every kernel of the extension (sparse_decode, fp4_moe).
// SM90 / SM120 common ISA only: mma.sync, griddepcontrol (PDL); no wgmma, no clusters.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>

namespace dsv4 {

// Programmatic dependent launch (PDL, sm_90+; both no-ops for a normal launch). Every kernel of the
// extension is launched with programmatic stream serialization when the device has it, so it may
// become resident while the previous kernel of the stream drains; pdl_wait() blocks until that kernel
// has completed and its writes are visible, so it comes before the first read of anything the
// previous kernels wrote (and before the first global write).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// lets the next kernel of the stream (if PDL-launched) be scheduled now; it still waits in pdl_wait()
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// D += A B, m16n8k16, bf16 operands, fp32 accumulators (register layouts: PTX ISA "mma.m16n8k16").
__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ldmatrix x4 (and .trans) from a 32-bit shared-memory address (register layouts: PTX ISA "ldmatrix").
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Host: launch with programmatic stream serialization when `pdl` (the device has PDL and it is not
// switched off), else a plain launch. Under graph capture the attribute becomes a programmatic edge.
template <typename Params>
static inline cudaError_t launch_kernel(void (*kernel)(Params), dim3 grid, int threads, int smem, bool pdl,
                                        cudaStream_t stream, const Params& p) {
  if (!pdl) {
    kernel<<<grid, threads, smem, stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// Host: whether this op launches with PDL on the current device: compute capability >= 9 and the op's
// switch-off variable (e.g. DSV4_FP4_MOE_PDL=0) not set. Asked once per device and op (a bit per device
// index), so the launch path makes no device query after the first call (graph-capture safe).
struct PdlSwitch {
  const char* env;
  std::atomic<unsigned long long> checked{0};
  std::atomic<unsigned long long> ok{0};
  explicit PdlSwitch(const char* e) : env(e) {}
};
// An environment switch set to off: 0 / false / no / off in any case (deepseek_v4_kernel/switches.py, the one parser;
// the Python side refuses any other non-empty value, naming the variable, before a launch reads it here).
static inline bool switch_off(const char* v) {
  if (v == nullptr) return false;
  while (*v == ' ' || *v == '\t') ++v;
  char w[8] = {0};
  int n = 0;
  for (; v[n] != 0 && v[n] != ' ' && v[n] != '\t'; ++n) {
    if (n == 7) return false;
    w[n] = (v[n] >= 'A' && v[n] <= 'Z') ? char(v[n] - 'A' + 'a') : v[n];
  }
  return !strcmp(w, "0") || !strcmp(w, "false") || !strcmp(w, "no") || !strcmp(w, "off");
}

static inline cudaError_t pdl_enabled(PdlSwitch& sw, bool* pdl) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  if (!(sw.checked.load(std::memory_order_acquire) & bit)) {
    int major = 0;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    const char* v = getenv(sw.env);
    if (major >= 9 && !switch_off(v)) sw.ok.fetch_or(bit, std::memory_order_release);
    sw.checked.fetch_or(bit, std::memory_order_release);
  }
  *pdl = (sw.ok.load(std::memory_order_acquire) & bit) != 0;
  return cudaSuccess;
}

}  // namespace dsv4

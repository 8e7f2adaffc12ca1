# run 54: an instrumented copy of csrc/ (as of 9be6050) in DST_DIR/csrc: a clock64 phase trace of kernel_ws.cuh per
# block (S warps 0 and 3, P V warp 0) and a globaltimer block timeline (-DWS_TRACE=1, read by h100_run54_ws_trace.py),
# and timing-only ablations (outputs wrong): -DABL_NOISSUE=1 (no row copies after tile 1), -DABL_NODEQ=1 (no
# dequantisation after tile 0), -DABL_NOPV=1 (no P V mma loop), -DABL_NOS=1 (no S mma loop). With no switch the
# build's SASS is identical to the head's (sm_90a, cuobjdump). Usage, repo root:
#   python3 THIS build/r54 && nvcc -shared ... -I build/r54/csrc -DWS_TRACE=1 build/r54/csrc/{api.cu,...} -o trace.so
# (the sm_90a-only command of build/r54/build.sh: scripts/build_ext.sh with DSV4_CSRC=build/r54/csrc and
# DSV4_NVCC_FLAGS="-DABL_NODEQ=1" does the same for both archs).
import os, re, shutil, sys
dst = sys.argv[1]
shutil.rmtree(os.path.join(dst, "csrc"), ignore_errors=True)
shutil.copytree("csrc", os.path.join(dst, "csrc"))
path = os.path.join(dst, "csrc/sparse_decode/kernel_ws.cuh")
s = open(path).read()
def rep(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)
rep('__device__ __forceinline__ void named_bar_sync(int id, int threads) {', r'''#ifndef WS_TRACE
#define WS_TRACE 0
#endif
#ifndef ABL_NOISSUE
#define ABL_NOISSUE 0
#endif
#ifndef ABL_NODEQ
#define ABL_NODEQ 0
#endif
#ifndef ABL_NOPV
#define ABL_NOPV 0
#endif
#ifndef ABL_NOS
#define ABL_NOS 0
#endif
__device__ long long dsv4_ws_trace[32 * 4096];
__device__ __forceinline__ long long gtime() { long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define WS_TR(pt, v) do { if (WS_TRACE && blockIdx.x < 4096 && blockIdx.z == 0) dsv4_ws_trace[(pt) * 4096 + blockIdx.x] = (v); } while (0)
#define CLK() (WS_TRACE ? clock64() : 0ll)
__device__ __forceinline__ void named_bar_sync(int id, int threads) {''')
# block entry
rep('''  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  unsigned char* ring = smem;''', '''  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  if (threadIdx.x == 0) { WS_TR(20, gtime()); WS_TR(21, clock64()); }
  unsigned char* ring = smem;''')
# S warps
rep('''    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = (int)(it & 1);
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
''', '''    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    long long c0, c1, c2, c3, sk = 0, ss = 0, sx = 0, sf = 0;
    const bool trs = lane == 0 && (sw == 0 || sw == kWsSWarps - 1);
    const int tb = sw == 0 ? 0 : 8;
    if (trs) WS_TR(tb + 0, clock64());
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = (int)(it & 1);
      c0 = CLK();
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
      c1 = CLK();
''')
rep('''#pragma unroll
      for (int ks = 0; ks < kSKSteps; ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];''', '''#pragma unroll
      for (int ks = 0; ks < (ABL_NOS ? 0 : kSKSteps); ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];''')
rep('''      if constexpr (MT < 4) {
        // partials''', '''      c2 = CLK();
      if constexpr (MT < 4) {
        // partials''')
rep('''          named_bar_arrive(kWsBarSxFull, 32 * kWsSWarps);
          continue;''', '''          named_bar_arrive(kWsBarSxFull, 32 * kWsSWarps);
          c3 = CLK();
          sk += c1 - c0; ss += c2 - c1; sx += c3 - c2;
          continue;''')
rep('''        if (it + 1 < ntiles) named_bar_arrive(kWsBarSxFree, 32 * kWsSWarps);
      }
''', '''        if (it + 1 < ntiles) named_bar_arrive(kWsBarSxFree, 32 * kWsSWarps);
      }
      c3 = CLK();
''')
rep('''      named_bar_arrive(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it in buffer buf
    }
''', '''      named_bar_arrive(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it in buffer buf
      const long long c4 = CLK();
      sk += c1 - c0; ss += c2 - c1; sx += c3 - c2; sf += c4 - c3;
    }
    if (trs) { WS_TR(tb + 1, sk); WS_TR(tb + 2, ss); WS_TR(tb + 3, sx); WS_TR(tb + 4, sf); WS_TR(tb + 5, clock64()); }
''')
# PV warps
rep('''  auto stage_next = [&](int64_t t) {
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    dequant((int)(t & 1), ring);
    named_bar_sync(kWsBarPv, kWsPvThreads);    // the staging area is free
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
    if (t + 1 < ntiles) issue(pos_begin + (t + 1) * kM64Tok, Ix[(int)((t + 1) & 1) * kM64Tok + gn]);
    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
  };''', '''  long long tw = 0, tb1 = 0, td = 0, tb2 = 0, ti = 0, tq = 0, tp = 0;
  auto stage_next = [&](int64_t t) {
    const long long d0 = CLK();
    cp_async_wait<0>();
    const long long d1 = CLK();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    const long long d2 = CLK();
    if (!ABL_NODEQ) dequant((int)(t & 1), ring);
    const long long d3 = CLK();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // the staging area is free
    const long long d4 = CLK();
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
    if (t + 1 < ntiles && !ABL_NOISSUE) issue(pos_begin + (t + 1) * kM64Tok, Ix[(int)((t + 1) & 1) * kM64Tok + gn]);
    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
    const long long d5 = CLK();
    tw += d1 - d0; tb1 += d2 - d1; td += d3 - d2; tb2 += d4 - d3; ti += d5 - d4;
  };''')
rep('''  if (ntiles > 1) stage_next(1);

  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    named_bar_sync(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it
''', '''  if (ntiles > 1) stage_next(1);
  if (tid == 0) { WS_TR(22, gtime()); WS_TR(16, clock64()); }
  tw = tb1 = td = tb2 = ti = 0;

  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    const long long e0 = CLK();
    named_bar_sync(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it
    const long long e1 = CLK();
''')
rep('''#pragma unroll
    for (int kk = 0; kk < kM64Tok; kk += 16) {
      uint32_t pa[4][4];''', '''#pragma unroll
    for (int kk = 0; kk < (ABL_NOPV ? 0 : kM64Tok); kk += 16) {
      uint32_t pa[4][4];''')
rep('''    if (it + 2 < ntiles) stage_next(it + 2);
  }
  cp_async_wait<0>();
''', '''    const long long e2 = CLK();
    tq += e1 - e0; tp += e2 - e1;
    if (it + 2 < ntiles) stage_next(it + 2);
  }
  cp_async_wait<0>();
  if (tid == 0) { WS_TR(17, tq); WS_TR(18, tp); WS_TR(19, tw); WS_TR(24, tb1); WS_TR(25, td); WS_TR(26, tb2);
                  WS_TR(27, ti); WS_TR(28, clock64()); WS_TR(29, ntiles); WS_TR(23, gtime()); }
''')
rep('''  m64_store_rows<MT, true>(p, acc, final_of, row, bi, si, split, h0, h_end, warp, g, t4, smem);
}''', '''  m64_store_rows<MT, true>(p, acc, final_of, row, bi, si, split, h0, h_end, warp, g, t4, smem);
  if (tid == 0) { WS_TR(30, gtime()); }
}''')
open(path, "w").write(s)
api = os.path.join(dst, "csrc/sparse_decode/sparse_decode.cu")
a = open(api).read()
a += '''
namespace dsv4 { cudaError_t ws_trace_read(void* h, long long n) { return cudaMemcpyFromSymbol(h, dsv4_ws_trace, n); } }
extern "C" __attribute__((visibility("default"))) int dsv4_ws_trace_read(void* h, long long n) {
  return (int)dsv4::ws_trace_read(h, n); }
'''
open(api, "w").write(a)
print("ok")

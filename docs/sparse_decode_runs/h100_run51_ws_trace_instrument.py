# run 51: inserts clock64 trace points into a copy of csrc/sparse_decode/kernel_ws.cuh (asserted anchors), for
# docs/sparse_decode_runs/h100_run50_ws_trace.py. Usage: python3 THIS SRC_KERNEL_WS DST_KERNEL_WS, then append to the
# copy's sparse_decode.cu: namespace dsv4 { cudaError_t ws_trace_read(void* h, long long n) { return
# cudaMemcpyFromSymbol(h, dsv4_ws_trace, n); } } extern "C" __attribute__((visibility("default"))) int
# dsv4_ws_trace_read(void* h, long long n) { return (int)dsv4::ws_trace_read(h, n); }  and build it with
# DSV4_CSRC=<copy>/csrc scripts/build_ext.sh OUT.so; run the trace script with DSV4_KERNEL_LIB=OUT.so.
import sys, re
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
def rep(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)
rep('__device__ __forceinline__ void named_bar_sync(int id, int threads) {',
'''__device__ long long dsv4_ws_trace[16 * 4096];
#define WS_TR(pt, v) do { if (blockIdx.x < 4096 && blockIdx.z == 0) dsv4_ws_trace[(pt) * 4096 + blockIdx.x] = (v); } while (0)
__device__ __forceinline__ void named_bar_sync(int id, int threads) {''')
# S warps
rep('''    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
''', '''    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    long long c0, c1, c2, c3, sk = 0, ss = 0, sf = 0;
    if (lane == 0 && mq == 0) WS_TR(0, clock64());
''')
s = re.sub(r'(\n      const int buf = \(int\)\(it & 1\);\n|\n      const int buf = it & 1;\n)(      named_bar_sync\(kWsBarKReady \+ buf, kWsThreads\);[^\n]*\n)',
           r'\1      c0 = clock64();\n\2      c1 = clock64();\n', s, count=1)
# end of the S mma loop: the line before the exchange (pair) or before "float mx_lo" (base)
if 'named_bar_sync(kWsBarXch + pr, 64);' in s:
    rep('      named_bar_sync(kWsBarXch + pr, 64);', '      c2 = clock64();\n      named_bar_sync(kWsBarXch + pr, 64);')
elif '      m64_softmax_tile(sacc, ' in s:   # the softmax as a shared function (1bc2448 and later)
    rep('      m64_softmax_tile(sacc, ', '      c2 = clock64();\n      m64_softmax_tile(sacc, ')
else:
    rep('      float mx_lo = -INFINITY, mx_hi = -INFINITY;\n', '      c2 = clock64();\n      float mx_lo = -INFINITY, mx_hi = -INFINITY;\n')
rep('''      named_bar_arrive(kWsBarPReady + buf, kWsThreads);   // P, alpha of tile it in buffer buf
    }
''', '''      named_bar_arrive(kWsBarPReady + buf, kWsThreads);   // P, alpha of tile it in buffer buf
      c3 = clock64();
      sk += c1 - c0; ss += c2 - c1; sf += c3 - c2;
    }
    if (lane == 0 && mq == 0) { WS_TR(1, sk); WS_TR(2, ss); WS_TR(3, sf); WS_TR(4, clock64()); }
''')
# PV warps
rep('''  auto stage_next = [&](int64_t t) {
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
''', '''  long long d0, d1, d2, d3, tw = 0, td = 0, ti = 0, tp = 0, tq = 0;
  auto stage_next = [&](int64_t t) {
    d0 = clock64();
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    d1 = clock64();
''')
rep('''    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
''', '''    d2 = clock64();
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
''')
rep('''    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
''', '''    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
    d3 = clock64();
    tw += d1 - d0; td += d2 - d1; ti += d3 - d2;
''')
s = re.sub(r'(\n  for \(int(?:64_t)? it = 0; it < (?:\(int\))?ntiles; \+\+it\) \{\n    const int buf = [^\n]*\n(?:#if DSV4_WS_DEFER == 2\n[^\n]*\n#endif\n)?)(    named_bar_sync\(kWsBarPReady \+ buf, kWsThreads\);[^\n]*\n)',
           r'\n  long long e0, e1, e2;\n  if (tid == 0) WS_TR(5, clock64());\1    e0 = clock64();\n\2    e1 = clock64();\n', s, count=1)
assert 'e0 = clock64()' in s and 'c0 = clock64()' in s
rep('''    if (it + 2 < ntiles) stage_next(it + 2);
  }
''', '''    e2 = clock64();
    tq += e1 - e0; tp += e2 - e1;
    if (it + 2 < ntiles) stage_next(it + 2);
  }
  if (tid == 0) { WS_TR(6, tq); WS_TR(7, tp); WS_TR(8, tw); WS_TR(9, td); WS_TR(10, ti); WS_TR(11, clock64()); WS_TR(12, ntiles); }
''')
open(dst, 'w').write(s)

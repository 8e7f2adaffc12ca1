#!/usr/bin/env python
"""Latency anatomy of the sparse decode kernels (a diagnostic, not a benchmark).

  build OUT.so [--rev REV] [--ablate LIST] [--no-cycles] [--src DIR]
        copy csrc/ (the working tree, or git revision REV) to build/trace_src/ (or DIR: builds in parallel), insert %globaltimer / clock64
        trace points into the kernels "auto" launches (the warp-specialised blocks, kernel_ws.cuh: every 16 / 32 /
        64-head variant, the deep-gather one included), the 8-warp mma64 kernel and the split combine, and build OUT.so
        (sm_90a + sm_120a); no GPU needed. The points go in at source anchors, each asserted, so a kernel edit that
        moves one fails loudly (tests/test_extension_build.py checks them on the CPU).
        --ablate noissue,nodeq,nopv,nos: timing-only variants of the warp-specialised blocks (the H100 ablations):
        no row copies after the prologue's tiles / no dequantisation after them / no P V mma loop / no S mma loop.
        THEIR OUTPUTS ARE WRONG; `run` says so on every shape's line. --no-cycles: only the block timeline (%globaltimer at
        entry, loop start, loop end, exit), no per-tile clock64 counters: those take registers, and the 64-head
        block's S warps have none to spare (a traced build runs slower; `run` prints its graph time per call, to set
        against an untraced library's).
  run   with DSV4_KERNEL_LIB=OUT.so (a traced build) or any build: per shape (bench inputs: KV rows from HBM, q and
        indices hot, benchmarks/bench_sparse_decode.py), the CUDA-graph time per call, the kernel durations from the
        profiler and, for a traced build, what the blocks of the kernel that ran recorded in the last call of one
        replay of a CUDA graph of 8 calls (medians over blocks; the profiler's durations include PDL residency):
        - warp-specialised: block timeline (prologue, loop, epilogue, us) and cycles per tile of S warp 0 (softmax),
          the last S warp, and P V warp 0 (wait for P, P V, wait for copies, barriers, dequantisation, copy issue);
        - 8-warp mma64: block timeline and cycles per tile of warp 0 (a softmax warp) and warp 4 for barrier C,
          copies + S + barrier A, softmax + wait + barrier B, P V + dequantisation;
        - split launches: the combine grid's entry, end of its pdl_wait and end.
        The trace buffer is poisoned before each traced replay: a launch whose kernel has no trace points says so
        instead of printing numbers.
        SHAPES="b,h_q,extra;..." picks the shapes (s_q 1), IMPL the kernel (default auto), NO_HALF_HEADS=1 keeps 64
        heads per block at every grid size.
Used for docs/sparse_decode.md (H100 on the 8-warp kernel; the warp-specialised points are the H100, which lived in
a one-off instrumented copy earlier).
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NBLK = 4096       # blocks traced per point
WS0 = 16          # first point of the warp-specialised kernels
NPT = WS0 + 31    # trace points: 0-12 mma64, 13-15 combine, WS0 + 0..30 warp-specialised (WS_* below)
ABLATIONS = ("noissue", "nodeq", "nopv", "nos")

# warp-specialised points (offsets from WS0): S warp 0 / the last S warp (base 0 / 8: start clock, cycles waiting for
# the K/V buffer, in the S mma loop, in the partials exchange, in the softmax + arrive, end clock), the P V warp 0
# per-tile cycles, the block timeline (%globaltimer)
WS_S0, WS_S3 = 0, 8
WS_PV_START, WS_PV_WAITP, WS_PV_PV, WS_PV_CPWAIT = 16, 17, 18, 19
WS_ENTRY_GT, WS_LOOP_GT, WS_LOOPEND_GT = 20, 22, 23
WS_PV_BAR1, WS_PV_DEQ, WS_PV_BAR2, WS_PV_ISSUE, WS_PV_END, WS_NTILES, WS_END_GT = 24, 25, 26, 27, 28, 29, 30


def _sub(path, pat, rep):
    s = open(path).read()
    if not re.search(pat, s, flags=re.M):
        raise SystemExit(f"trace anchor not found in {path}: {pat}")
    open(path, "w").write(re.sub(pat, rep, s, count=1, flags=re.M))


def _rep(path, old, new):
    s = open(path).read()
    if s.count(old) != 1:
        raise SystemExit(f"trace anchor found {s.count(old)} times (expected once) in {path}:\n{old}")
    open(path, "w").write(s.replace(old, new))


def _instrument_common(dst, ablate, cycles):
    k = os.path.join(dst, "sparse_decode/kernel.cuh")
    flags = ",".join(ablate) or "none"
    _sub(k, r"^namespace dsv4 \{", r"""\g<0>
#define DSV4_TRACE_CYCLES %d
#define ABL_NOISSUE %d
#define ABL_NODEQ %d
#define ABL_NOPV %d
#define ABL_NOS %d
#define DSV4_TRACE_INFO "traced build: ablations %s, per-tile cycles %s"
__device__ long long dsv4_trace[%d * %d];
__device__ __forceinline__ long long gtime() { long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ int trace_blk() { return (int)(blockIdx.z * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x); }
#define TR(pt, v) do { int _b = trace_blk(); if (_b < %d) dsv4_trace[(pt) * %d + _b] = (long long)(v); } while (0)
#define CLK() (DSV4_TRACE_CYCLES ? (long long)clock64() : 0ll)
""" % (int(cycles), *(int(a in ablate) for a in ABLATIONS), flags, "on" if cycles else "off", NPT, NBLK, NBLK, NBLK))
    # combine kernel: 13 entry, 14 after pdl_wait, 15 end
    _sub(k, r"^  pdl_launch_dependents\(\);   // the next decode", r"  if (threadIdx.x == 0) TR(13, gtime());\n\g<0>")
    _sub(k, r"^  const int64_t row = blockIdx.x;\n  const int h = blockIdx.y;", r"  if (threadIdx.x == 0) TR(14, gtime());\n\g<0>")
    _sub(k, r"^(  if \(threadIdx\.x == 0 && blockIdx\.z == 0\) p\.lse\[\(bi \* p\.h_q \+ h\) \* p\.s_q \+ si\] = "
         r"lse_out\(lse\);\n)\}", r"\1  if (threadIdx.x == 0) TR(15, gtime());\n}")
    _sub(os.path.join(dst, "api.cu"), r'^extern "C" \{\n',
         'namespace dsv4 { cudaError_t trace_read(void* h, long long n); cudaError_t trace_poison(); '
         'const char* trace_info(); }\nextern "C" {\n'
         'int dsv4_trace_read(void* h, long long n) { return (int)dsv4::trace_read(h, n); }\n'
         'int dsv4_trace_poison() { return (int)dsv4::trace_poison(); }\n'
         'const char* dsv4_trace_info() { return dsv4::trace_info(); }\n')
    _sub(os.path.join(dst, "sparse_decode/sparse_decode.cu"), r"^\}  // namespace dsv4",
         "cudaError_t trace_read(void* h, long long n) { return cudaMemcpyFromSymbol(h, dsv4_trace, n); }\n"
         "cudaError_t trace_poison() {   // every point -1: a point no block wrote stays -1\n"
         "  void* a = nullptr;\n  cudaError_t e = cudaGetSymbolAddress(&a, dsv4_trace);\n"
         "  return e != cudaSuccess ? e : cudaMemset(a, 0xff, sizeof(dsv4_trace));\n}\n"
         "const char* trace_info() { return DSV4_TRACE_INFO; }\n}  // namespace dsv4")


def _instrument_mma64(dst):
    m = os.path.join(dst, "sparse_decode/kernel_mma64.cuh")
    _sub(m, r"^  float\* Lf = Sx \+ kM64Heads;", r"\g<0>\n  if (threadIdx.x == 0) TR(0, gtime());\n"
         r"  long long c_s = 0, c_a = 0, c_b = 0, c_pv = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;")
    _sub(m, r"^  if \(ntiles > 0\) issue\(pos_begin.*$", r"\g<0>\n  if (threadIdx.x == 0) TR(1, gtime());")
    _sub(m, r"^    dequant_chunk\(warp, 0\);", r"\g<0>\n    if (threadIdx.x == 0) TR(2, gtime());")
    # per tile: c_s = barrier C, c_a = copies of tile i+1 issued + phase 1 (S) + barrier A,
    # c_b = phase 2 (softmax) + wait for the copies + barrier B, c_pv = PV + dequantisation of tile i+1
    _sub(m, r"^    const bool has_next = it \+ 1 < ntiles;", r"\g<0>\n    c0 = CLK(); if (it > 0) c_pv += c0 - c3;")
    _sub(m, r"^    __syncthreads\(\);      // C:.*$", r"\g<0>\n    c1 = CLK(); c_s += c1 - c0;")
    _sub(m, r"^    __syncthreads\(\);      // A:.*$", r"\g<0>\n    c2 = CLK(); c_a += c2 - c1;")
    _sub(m, r"^    __syncthreads\(\);      // B:.*$", r"\g<0>\n    c3 = CLK(); c_b += c3 - c2;")
    _sub(m, r"^  // ---- epilogue:", "  if (ntiles > 0) c_pv += CLK() - c3;\n  if (threadIdx.x == 0) TR(3, gtime());\n"
         "  if (threadIdx.x == 0) { TR(5, c_s); TR(6, c_a); TR(7, c_b); TR(8, c_pv); }\n"
         "  if (threadIdx.x == 128) { TR(9, c_s); TR(10, c_a); TR(11, c_b); TR(12, c_pv); }\n\\g<0>")
    s = open(m).read()
    j = s.rindex("}\n", 0, s.rindex("}  // namespace dsv4"))
    open(m, "w").write(s[:j] + "  if (threadIdx.x == 0) TR(4, gtime());\n" + s[j:])


def _instrument_ws(dst):
    w = os.path.join(dst, "sparse_decode/kernel_ws.cuh")
    W = lambda off: f"{WS0} + {off}"   # noqa: E731
    # block entry
    _rep(w, """  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  unsigned char* ring = smem;""", f"""  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  if (threadIdx.x == 0) TR({W(WS_ENTRY_GT)}, gtime());
  unsigned char* ring = smem;""")
    # S warps: per tile, the wait for the K/V buffer, the mma loop, the partials exchange (16 / 32 heads), the softmax
    _rep(w, """    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = (int)(it & 1);
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
""", f"""    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    long long c0 = 0, c1 = 0, c2 = 0, c3 = 0, sk = 0, ss = 0, sxc = 0, sf = 0;  // sxc: the exchange (sx is a pointer there)
    const bool trs = lane == 0 && (sw == 0 || sw == kWsSWarps - 1);
    const int tb = {WS0} + (sw == 0 ? {WS_S0} : {WS_S3});
    if (trs) TR(tb + 0, CLK());
    for (int64_t it = 0; it < ntiles; ++it) {{
      const int buf = (int)(it & 1);
      c0 = CLK();
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
      c1 = CLK();
""")
    _rep(w, """      for (int ks = 0; ks < kSKSteps; ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];""", """      for (int ks = 0; ks < (ABL_NOS ? 0 : kSKSteps); ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];""")
    _rep(w, """      if constexpr (MT < 4) {
        // partials""", """      c2 = CLK();
      if constexpr (MT < 4) {
        // partials""")
    _rep(w, """          named_bar_arrive(kWsBarSxFull, 32 * kWsSWarps);
          continue;""", """          named_bar_arrive(kWsBarSxFull, 32 * kWsSWarps);
          c3 = CLK();
          sk += c1 - c0; ss += c2 - c1; sxc += c3 - c2;
          continue;""")
    _rep(w, """        if (it + 1 < ntiles) named_bar_arrive(kWsBarSxFree, 32 * kWsSWarps);
      }
""", """        if (it + 1 < ntiles) named_bar_arrive(kWsBarSxFree, 32 * kWsSWarps);
      }
      c3 = CLK();
""")
    _rep(w, """      named_bar_arrive(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it in buffer buf
    }
""", """      named_bar_arrive(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it in buffer buf
      const long long c4 = CLK();
      sk += c1 - c0; ss += c2 - c1; sxc += c3 - c2; sf += c4 - c3;
    }
    if (trs) { TR(tb + 1, sk); TR(tb + 2, ss); TR(tb + 3, sxc); TR(tb + 4, sf); TR(tb + 5, CLK()); }
""")
    # P V warps: the staging of a tile (two-buffer blocks: stage_next; deep: at the top of the loop)
    _rep(w, """  auto stage_next = [&](int64_t t) {
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    dequant((int)(t & 1), ring);
    named_bar_sync(kWsBarPv, kWsPvThreads);    // the staging area is free
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
    if (t + 1 < ntiles) issue(pos_begin + (t + 1) * kM64Tok, Ix[(int)((t + 1) & 1) * kM64Tok + gn]);
    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
  };""", """  long long tw = 0, tb1 = 0, td = 0, tb2 = 0, ti = 0, tq = 0, tp = 0;
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
  };""")
    # the loop: counters from here (the prologue's tiles 0 / 1 not counted)
    _rep(w, """  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    if constexpr (kDeep) {""", f"""  if (tid == 0) {{ TR({W(WS_LOOP_GT)}, gtime()); TR({W(WS_PV_START)}, CLK()); }}
  tw = tb1 = td = tb2 = ti = 0;
  for (int64_t it = 0; it < ntiles; ++it) {{
    const int buf = (int)(it & 1);
    if constexpr (kDeep) {{""")
    _rep(w, """      cp_async_wait<1>();
      named_bar_sync(kWsBarPv, kWsPvThreads);    // tile it's rows and tile it + 2's slot indices visible to all
      dequant(0, rg);
      named_bar_sync(kWsBarPv, kWsPvThreads);    // staging area rg free
      named_bar_arrive(kWsBarKReady + buf, kWsThreads);
      if (it + 2 < ntiles) {""", """      const long long d0 = CLK();
      cp_async_wait<1>();
      const long long d1 = CLK();
      named_bar_sync(kWsBarPv, kWsPvThreads);    // tile it's rows and tile it + 2's slot indices visible to all
      const long long d2 = CLK();
      if (!ABL_NODEQ) dequant(0, rg);
      const long long d3 = CLK();
      named_bar_sync(kWsBarPv, kWsPvThreads);    // staging area rg free
      const long long d4 = CLK();
      named_bar_arrive(kWsBarKReady + buf, kWsThreads);
      if (it + 2 < ntiles && !ABL_NOISSUE) {""")
    _rep(w, """      if (it + 4 < ntiles) index_async(it + 4);
      cp_async_commit();
    }
""", """      if (it + 4 < ntiles) index_async(it + 4);
      cp_async_commit();
      const long long d5 = CLK();
      tw += d1 - d0; tb1 += d2 - d1; td += d3 - d2; tb2 += d4 - d3; ti += d5 - d4;
    }
""")
    _rep(w, """    named_bar_sync(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it
""", """    const long long e0 = CLK();
    named_bar_sync(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it
    const long long e1 = CLK();
""")
    _rep(w, """    for (int kk = 0; kk < kM64Tok; kk += 16) {
      uint32_t pa[4][4];""", """    for (int kk = 0; kk < (ABL_NOPV ? 0 : kM64Tok); kk += 16) {
      uint32_t pa[4][4];""")
    _rep(w, """    if (!kDeep && it + 2 < ntiles) stage_next(it + 2);
  }
  cp_async_wait<0>();
""", f"""    const long long e2 = CLK();
    tq += e1 - e0; tp += e2 - e1;
    if (!kDeep && it + 2 < ntiles) stage_next(it + 2);
  }}
  cp_async_wait<0>();
  if (tid == 0) {{
    TR({W(WS_PV_WAITP)}, tq); TR({W(WS_PV_PV)}, tp); TR({W(WS_PV_CPWAIT)}, tw); TR({W(WS_PV_BAR1)}, tb1);
    TR({W(WS_PV_DEQ)}, td); TR({W(WS_PV_BAR2)}, tb2); TR({W(WS_PV_ISSUE)}, ti); TR({W(WS_PV_END)}, CLK());
    TR({W(WS_NTILES)}, ntiles); TR({W(WS_LOOPEND_GT)}, gtime());
  }}
""")
    _rep(w, """  m64_store_rows<MT, true>(p, acc, final_of, row, bi, si, split, h0, h_end, warp, g, t4, smem);
}""", f"""  m64_store_rows<MT, true>(p, acc, final_of, row, bi, si, split, h0, h_end, warp, g, t4, smem);
  if (tid == 0) TR({W(WS_END_GT)}, gtime());
}}""")


def instrument(dst, ablate=(), cycles=True):
    """Insert the trace points into the csrc/ copy at dst (asserted anchors)."""
    bad = [a for a in ablate if a not in ABLATIONS]
    if bad:
        raise SystemExit(f"--ablate: unknown {bad}; expected a comma-separated subset of {','.join(ABLATIONS)}")
    _instrument_common(dst, ablate, cycles)
    _instrument_mma64(dst)
    _instrument_ws(dst)


def copy_csrc(dst, rev=None):
    shutil.rmtree(dst, ignore_errors=True)
    if rev:  # the whole csrc/ tree of that revision (fp4_moe/ and common/ are part of the library)
        os.makedirs(dst)
        tar = subprocess.check_output(["git", "-C", ROOT, "archive", rev, "csrc"])
        subprocess.run(["tar", "-x", "-C", dst, "--strip-components=1"], input=tar, check=True)
    else:
        shutil.copytree(os.path.join(ROOT, "csrc"), dst)


def build(out, rev=None, ablate=(), cycles=True, src=None):
    dst = src or os.path.join(ROOT, "build", "trace_src")
    copy_csrc(dst, rev)
    instrument(dst, ablate, cycles)
    env = dict(os.environ, DSV4_CSRC=dst, DSV4_KERNEL_EXTRA_ARCHS=os.environ.get("DSV4_KERNEL_EXTRA_ARCHS", "90a"))
    subprocess.check_call(["bash", os.path.join(ROOT, "scripts", "build_ext.sh"), out], env=env)
    print("built", out)


def _report_ws(T, nb):
    import statistics
    med = statistics.median
    W = lambda off: WS0 + off   # noqa: E731
    written = [i for i in range(nb) if T(W(WS_END_GT), i) >= 0]
    nt = med(T(W(WS_NTILES), i) for i in written) or 1
    span = lambda a, c: med((T(W(c), i) - T(W(a), i)) / 1e3 for i in written)   # noqa: E731
    per = lambda off: med(T(W(off), i) for i in written) / nt                   # noqa: E731
    t_first = min(T(W(WS_ENTRY_GT), i) for i in written)
    lines = [f"   {len(written)} blocks, {nt:.0f} tiles each (median) | block us: prologue {span(WS_ENTRY_GT, WS_LOOP_GT):.2f} "
             f"loop {span(WS_LOOP_GT, WS_LOOPEND_GT):.2f} epilogue {span(WS_LOOPEND_GT, WS_END_GT):.2f} total "
             f"{span(WS_ENTRY_GT, WS_END_GT):.2f}; last block ends {(max(T(W(WS_END_GT), i) for i in written) - t_first) / 1e3:.2f}"
             f" after the first entry"]
    if per(WS_PV_END) or per(WS_S0 + 2):   # per-tile counters built in (not --no-cycles)
        for nm, b in (("S warp 0 (softmax)", WS_S0), ("last S warp", WS_S3)):
            lines.append(f"   {nm} cycles/tile: wait K/V {per(b + 1):.0f} S mma {per(b + 2):.0f} partials "
                         f"{per(b + 3):.0f} softmax+arrive {per(b + 4):.0f}")
        loop = med(T(W(WS_PV_END), i) - T(W(WS_PV_START), i) for i in written) / nt
        lines.append(f"   P V warp 0 cycles/tile: wait P {per(WS_PV_WAITP):.0f} P V {per(WS_PV_PV):.0f} wait copies "
                     f"{per(WS_PV_CPWAIT):.0f} bar {per(WS_PV_BAR1):.0f} dequant {per(WS_PV_DEQ):.0f} bar "
                     f"{per(WS_PV_BAR2):.0f} issue {per(WS_PV_ISSUE):.0f}; loop {loop:.0f}")
    return lines, t_first


def _report_mma64(T, nb, ntiles):
    import statistics
    med = statistics.median
    written = [i for i in range(nb) if T(4, i) >= 0]
    t0 = min(T(0, i) for i in written)   # us from the first block's entry
    rel = lambda pt: [(T(pt, i) - t0) / 1000 for i in written]   # noqa: E731
    cyc = lambda pt: med(T(pt, i) for i in written) / max(1, ntiles)   # noqa: E731
    line = [f"   {len(written)} blocks, {ntiles} tiles each: entry spread {max(rel(0)):.2f}"]
    for pt, nm in [(1, "index arrived"), (2, "tile 0 dequantised"), (3, "loop end"), (4, "end")]:
        line.append(f"| {nm} {med(rel(pt)):.2f} (max {max(rel(pt)):.2f})")
    lines = [" ".join(line)]
    if cyc(5) or cyc(6):
        lines.append(f"   cycles/tile warp 0: C {cyc(5):.0f} issue+S+A {cyc(6):.0f} ph2+wait+B {cyc(7):.0f} "
                     f"PV+dq {cyc(8):.0f}; warp 4: C {cyc(9):.0f} issue+S+A {cyc(10):.0f} ph2+wait+B {cyc(11):.0f} "
                     f"PV+dq {cyc(12):.0f}")
    return lines, t0


def run():
    import ctypes
    import statistics
    import torch
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_sparse_decode as B
    import deepseek_v4_kernel.ops.sparse_decode as sd
    from deepseek_v4_kernel import _ext
    from torch.profiler import ProfilerActivity, profile
    lib = _ext.load()
    if os.environ.get("NO_HALF_HEADS"):     # mma64 keeps 64 heads per block at every grid size
        _launch = sd.mma64_launch
        sd.mma64_launch = lambda b, s_q, h_q, T, sms, hpb=None: _launch(b, s_q, h_q, T, sms, hpb or 64)
    traced = hasattr(lib, "dsv4_trace_read")
    tag = os.environ.get("TAG", os.path.basename(_ext.lib_path()))
    info = "untraced build"
    if traced:
        lib.dsv4_trace_info.restype = ctypes.c_char_p
        info = lib.dsv4_trace_info().decode()
    ablated = traced and "ablations none" not in info
    print(f"[{tag}] {info}" + (" -- ABLATION BUILD: timings only, its outputs are wrong" if ablated else ""), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = B.DecodeInputs(gen)
    shapes = [(1, 64, 512), (1, 16, 512), (1, 64, 2048), (8, 64, 512), (32, 64, 512), (128, 64, 512)]
    if os.environ.get("SHAPES"):
        shapes = [tuple(int(x) for x in s.split(",")) for s in os.environ["SHAPES"].split(";")]
    med = statistics.median
    impl = os.environ.get("IMPL") or None
    num_sms = sd._sm_count(torch.device("cuda"))
    for (b, h, extra) in shapes:
        sets = inputs.sets(b, h, 1, extra)
        fn = lambda a: sd.sparse_decode(**a, impl=impl)   # noqa: E731
        t, _ = B.time_fn(fn, sets, 40)
        kernel, hpb, splits, stoks = sd.launch_plan(b, 1, h, 128 + extra, num_sms, impl)   # the op's launch
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(sets[0])
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for i in range(8):
                fn(sets[i % len(sets)])
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type.name == "CUDA" and "sparse_decode" in e.name]
        mains = [e.time_range.elapsed_us() for e in ev if "combine" not in e.name]
        combs = [e.time_range.elapsed_us() for e in ev if "combine" in e.name]
        # with PDL a kernel's recorded duration includes its early residency (waiting in pdl_wait)
        print(f"[{tag}] b={b} h_q={h} extra={extra}: {kernel}, {hpb} heads x {splits} splits | graph {t:.2f} us/call | "
              f"profiler: main {med(mains):.2f} combine {med(combs) if combs else 0:.2f} us"
              + (" | ABLATED" if ablated else ""), flush=True)
        if not traced:
            continue
        # one replay of the graph above: the points hold its last call's values, a call as a decode step makes it
        # (an eager call would put the host's launch gap between the split grid and the combine)
        torch.cuda.synchronize()
        if lib.dsv4_trace_poison() != 0:
            raise SystemExit("dsv4_trace_poison failed")
        g.replay()
        torch.cuda.synchronize()
        buf = (ctypes.c_longlong * (NPT * NBLK))()
        if lib.dsv4_trace_read(buf, ctypes.sizeof(buf)) != 0:
            raise SystemExit("dsv4_trace_read failed")
        nb = min(NBLK, b * -(-h // hpb) * splits)
        T = lambda pt, i: buf[pt * NBLK + i]   # noqa: E731
        ntiles = stoks // 32 if splits > 1 else -(-(128 + extra) // 32)
        t0 = None
        if any(T(WS0 + WS_END_GT, i) >= 0 for i in range(nb)):
            lines, t0 = _report_ws(T, nb)
        elif any(T(4, i) >= 0 for i in range(nb)):
            lines, t0 = _report_mma64(T, nb, ntiles)
        else:
            lines = [f"   no trace point written: {kernel} is not an instrumented kernel (the warp-specialised and "
                     f"8-warp mma64 kernels are)"]
        if splits > 1 and t0 is not None:
            nc = min(NBLK, b * h)
            ok = [i for i in range(nc) if T(15, i) >= 0]
            if ok:
                rel = lambda pt: [(T(pt, i) - t0) / 1000 for i in ok]   # noqa: E731
                lines.append(f"   combine (z = 0: {len(ok)} blocks), us from the split grid's first entry: entry "
                             f"{min(rel(13)):.2f}..{max(rel(13)):.2f}, after wait {med(rel(14)):.2f}, end "
                             f"{med(rel(15)):.2f} (max {max(rel(15)):.2f})")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "build":
        a = sys.argv[3:]
        rev = a[a.index("--rev") + 1] if "--rev" in a else None
        abl = tuple(x for x in a[a.index("--ablate") + 1].split(",") if x) if "--ablate" in a else ()
        src = os.path.abspath(a[a.index("--src") + 1]) if "--src" in a else None
        build(os.path.abspath(sys.argv[2]), rev, abl, "--no-cycles" not in a, src)
    elif len(sys.argv) >= 2 and sys.argv[1] == "run":
        run()
    else:
        raise SystemExit(__doc__)

#!/usr/bin/env python
"""Latency anatomy of the mma64 sparse decode kernel (a diagnostic, not a benchmark).

  build OUT.so [--rev REV]   copy csrc/ (the working tree, or git revision REV) to build/trace_src/, insert
                             %globaltimer / clock64 trace points into the mma64 and combine kernels and
                             build OUT.so (sm_90a + sm_120a); no GPU needed. The points are inserted at
                             source anchors, each asserted, so a kernel edit that moves one fails loudly.
  run                        with DSV4_KERNEL_LIB=OUT.so (a traced build) or any build: per shape, the
                             CUDA-graph time per call, kernel durations from the profiler and, for a
                             traced build, per-phase times of the blocks (median over blocks, us from the
                             first block's entry): slot index arrived, tile 0 dequantised, loop end, end;
                             clock64 cycles per tile of warp 0 (a softmax warp) and warp 4 (idle in the
                             softmax) for: barrier C, copies of tile i+1 issued + S + barrier A, softmax +
                             wait for the copies + barrier B, PV + dequantisation of tile i+1; the
                             combine grid's entry,
                             end of its pdl_wait and end.
Used for docs/sparse_decode.md (runs 20-23 with the earlier pipeline, run 25 on). SHAPES="b,h_q,extra;..." picks the shapes, IMPL the kernel,
NO_HALF_HEADS=1 keeps 64 heads per mma64 block at every grid size.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPT = 16          # trace points
NBLK = 4096       # blocks traced per point


def _sub(path, pat, rep):
    s = open(path).read()
    if not re.search(pat, s, flags=re.M):
        raise SystemExit(f"trace anchor not found in {path}: {pat}")
    open(path, "w").write(re.sub(pat, rep, s, count=1, flags=re.M))


def build(out, rev=None):
    dst = os.path.join(ROOT, "build", "trace_src")
    shutil.rmtree(dst, ignore_errors=True)
    if rev:  # the whole csrc/ tree of that revision (fp4_moe/ and common/ are part of the library)
        os.makedirs(dst)
        tar = subprocess.check_output(["git", "-C", ROOT, "archive", rev, "csrc"])
        subprocess.run(["tar", "-x", "-C", dst, "--strip-components=1"], input=tar, check=True)
    else:
        shutil.copytree(os.path.join(ROOT, "csrc"), dst)
    k = os.path.join(dst, "sparse_decode/kernel.cuh")
    _sub(k, r"^namespace dsv4 \{", r"""\g<0>
__device__ unsigned long long dsv4_trace[%d * %d];
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ int trace_blk() { return (int)(blockIdx.z * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x); }
#define TR(pt, v) do { int _b = trace_blk(); if (_b < %d) dsv4_trace[(pt) * %d + _b] = (v); } while (0)
""" % (NPT, NBLK, NBLK, NBLK))
    # combine kernel: 13 entry, 14 after pdl_wait, 15 end
    _sub(k, r"^  pdl_launch_dependents\(\);   // the next decode", r"  if (threadIdx.x == 0) TR(13, gtime());\n\g<0>")
    _sub(k, r"^  const int64_t row = blockIdx.x;\n  const int h = blockIdx.y;", r"  if (threadIdx.x == 0) TR(14, gtime());\n\g<0>")
    _sub(k, r"^(  if \(threadIdx\.x == 0 && blockIdx\.z == 0\) p\.lse\[\(bi \* p\.h_q \+ h\) \* p\.s_q \+ si\] = "
         r"lse_out\(lse\);\n)\}", r"\1  if (threadIdx.x == 0) TR(15, gtime());\n}")
    m = os.path.join(dst, "sparse_decode/kernel_mma64.cuh")
    _sub(m, r"^  float\* Lf = Sx \+ kM64Heads;", r"\g<0>\n  if (threadIdx.x == 0) TR(0, gtime());\n"
         r"  long long c_s = 0, c_a = 0, c_b = 0, c_pv = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;")
    _sub(m, r"^  if \(ntiles > 0\) issue\(pos_begin.*$", r"\g<0>\n  if (threadIdx.x == 0) TR(1, gtime());")
    _sub(m, r"^    dequant_chunk\(warp, 0\);", r"\g<0>\n    if (threadIdx.x == 0) TR(2, gtime());")
    # per tile: c_s = barrier C, c_a = copies of tile i+1 issued + phase 1 (S) + barrier A,
    # c_b = phase 2 (softmax) + wait for the copies + barrier B, c_pv = PV + dequantisation of tile i+1
    _sub(m, r"^    const bool has_next = it \+ 1 < ntiles;", r"\g<0>\n    c0 = clock64(); if (it > 0) c_pv += c0 - c3;")
    _sub(m, r"^    __syncthreads\(\);      // C:.*$", r"\g<0>\n    c1 = clock64(); c_s += c1 - c0;")
    _sub(m, r"^    __syncthreads\(\);      // A:.*$", r"\g<0>\n    c2 = clock64(); c_a += c2 - c1;")
    _sub(m, r"^    __syncthreads\(\);      // B:.*$", r"\g<0>\n    c3 = clock64(); c_b += c3 - c2;")
    _sub(m, r"^  // ---- epilogue:", "  if (ntiles > 0) c_pv += clock64() - c3;\n  if (threadIdx.x == 0) TR(3, gtime());\n"
         "  if (threadIdx.x == 0) { TR(5, c_s); TR(6, c_a); TR(7, c_b); TR(8, c_pv); }\n"
         "  if (threadIdx.x == 128) { TR(9, c_s); TR(10, c_a); TR(11, c_b); TR(12, c_pv); }\n\\g<0>")
    s = open(m).read()
    j = s.rindex("}\n", 0, s.rindex("}  // namespace dsv4"))
    open(m, "w").write(s[:j] + "  if (threadIdx.x == 0) TR(4, gtime());\n" + s[j:])
    _sub(os.path.join(dst, "api.cu"), r'^extern "C" \{\n',
         'namespace dsv4 { cudaError_t trace_read(void* h, long long n); }\nextern "C" {\n'
         'int dsv4_trace_read(void* h, long long n) { return (int)dsv4::trace_read(h, n); }\n')
    _sub(os.path.join(dst, "sparse_decode/sparse_decode.cu"), r"^\}  // namespace dsv4",
         "cudaError_t trace_read(void* h, long long n) { return cudaMemcpyFromSymbol(h, dsv4_trace, n); }\n}  // namespace dsv4")
    env = dict(os.environ, DSV4_CSRC=dst, DSV4_KERNEL_EXTRA_ARCHS="90a")
    subprocess.check_call(["bash", os.path.join(ROOT, "scripts", "build_ext.sh"), out], env=env)
    print("built", out)


def run():
    import ctypes
    import statistics
    import torch
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
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
    gen = torch.Generator(device="cuda").manual_seed(0)
    main_cache = B.make_cache(65536, 256, gen, pad=576)
    extra_cache = B.make_cache(262144, 64, gen)
    shapes = [(1, 64, 512), (1, 16, 512), (1, 64, 2048), (8, 64, 512), (32, 64, 512), (128, 64, 512)]
    if os.environ.get("SHAPES"):
        shapes = [tuple(int(x) for x in s.split(",")) for s in os.environ["SHAPES"].split(";")]
    med = statistics.median
    for (b, h, extra) in shapes:
        sets = [dict(q=torch.randn(b, 1, h, 512, device="cuda", generator=gen).bfloat16(), k_cache=main_cache,
                     indices=torch.randint(0, 65536, (b, 1, 128), device="cuda", generator=gen, dtype=torch.int32),
                     topk_length=torch.full((b,), 128, dtype=torch.int32, device="cuda"), extra_k_cache=extra_cache,
                     extra_indices=torch.randint(0, 262144, (b, 1, extra), device="cuda", generator=gen, dtype=torch.int32),
                     extra_topk_length=torch.full((b,), extra, dtype=torch.int32, device="cuda"),
                     attn_sink=torch.randn(h, device="cuda", generator=gen)) for _ in range(4)]
        fn = lambda a: sd.sparse_decode(**a, impl=os.environ.get("IMPL"))
        t, _ = B.time_fn(fn, sets, 40)
        impl = os.environ.get("IMPL") or "auto"
        hpb, splits, stoks = sd.mma64_launch(b, 1, h, 128 + extra, sd._sm_count(torch.device("cuda")),
                                             {"mma64h32": 32, "mma64h16": 16}.get(impl))
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(sets[0])
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for i in range(8):
                fn(sets[i % 4])
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
        print(f"[{tag}] b={b} h_q={h} extra={extra} splits={splits}: graph {t:.2f} us/call | profiler: main "
              f"{med(mains):.2f} combine {med(combs) if combs else 0:.2f} us", flush=True)
        if not traced:
            continue
        buf = (ctypes.c_ulonglong * (NPT * NBLK))()
        fn(sets[0])
        torch.cuda.synchronize()
        if lib.dsv4_trace_read(buf, ctypes.sizeof(buf)) != 0:
            raise SystemExit("dsv4_trace_read failed")
        nb = min(NBLK, b * -(-h // hpb) * splits)
        T = lambda pt, i: buf[pt * NBLK + i]
        t0 = min(T(0, i) for i in range(nb))
        rel = lambda pt, n=nb: [(T(pt, i) - t0) / 1000 for i in range(n)]
        ntiles = stoks // 32 if splits > 1 else -(-(128 + extra) // 32)
        cyc = lambda pt: med([T(pt, i) for i in range(nb)]) / max(1, ntiles)
        line = [f"   {nb} blocks, {ntiles} tiles each: entry spread {max(rel(0)):.2f}"]
        for pt, nm in [(1, "index arrived"), (2, "tile 0 dequantised"), (3, "loop end"), (4, "end")]:
            line.append(f"| {nm} {med(rel(pt)):.2f} (max {max(rel(pt)):.2f})")
        line.append(f"| cycles/tile warp 0: C {cyc(5):.0f} issue+S+A {cyc(6):.0f} ph2+wait+B {cyc(7):.0f} PV+dq {cyc(8):.0f};"
                    f" warp 4: C {cyc(9):.0f} issue+S+A {cyc(10):.0f} ph2+wait+B {cyc(11):.0f} PV+dq {cyc(12):.0f}")
        if splits > 1:
            nc = min(NBLK, b * h)
            line.append(f"| combine (z = 0: {b * h} blocks): entry {min(rel(13, nc)):.2f}..{max(rel(13, nc)):.2f} "
                        f"after wait {med(rel(14, nc)):.2f} end {med(rel(15, nc)):.2f} (max {max(rel(15, nc)):.2f})")
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "build":
        rev = sys.argv[sys.argv.index("--rev") + 1] if "--rev" in sys.argv else None
        build(os.path.abspath(sys.argv[2]), rev)
    elif len(sys.argv) >= 2 and sys.argv[1] == "run":
        run()
    else:
        raise SystemExit(__doc__)

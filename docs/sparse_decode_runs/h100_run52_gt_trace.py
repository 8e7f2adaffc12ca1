# run 52: where a call's time goes between the blocks' own work and the kernel's span (globaltimer per block)
import ctypes, os, sys, statistics
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
from deepseek_v4_kernel import _ext
lib = _ext.load()
gen = torch.Generator(device="cuda").manual_seed(0)
main_cache = B.make_cache(65536, 256, gen, pad=576)
extra_cache = B.make_cache(262144, 64, gen)
N = 4096
def read():
    buf = (ctypes.c_longlong * (16 * N))()
    assert lib.dsv4_gt_read(ctypes.byref(buf), ctypes.c_longlong(16 * N * 8)) == 0
    return [[buf[p * N + k] for k in range(N)] for p in range(16)]
def report(tag, tr, nb, per_call_us):
    T = [tr[i][:nb] for i in range(16)]
    C = [tr[i][:nb] for i in range(8, 12)]
    t0 = min(T[0]); q = lambda xs: (statistics.median(xs), max(xs))
    us = lambda a, b: [(T[b][k] - T[a][k]) / 1e3 for k in range(nb)]
    freq = statistics.median([(C[2][k] - C[1][k]) / max(1, T[3][k] - T[2][k]) for k in range(nb)])
    ends = sorted((T[4][k] - t0) / 1e3 for k in range(nb))
    starts = sorted((T[0][k] - t0) / 1e3 for k in range(nb))
    print(f"  {tag}: per call {per_call_us:.1f} us; span first entry -> last end {ends[-1]:.1f} us; clock {freq:.2f} GHz; "
          f"SMs {len(set(tr[13][:nb]))}")
    print(f"    entry skew: median {statistics.median(starts):.2f} max {starts[-1]:.2f} us; end: min {ends[0]:.1f} "
          f"median {statistics.median(ends):.1f} p90 {ends[int(0.9 * nb)]:.1f} max {ends[-1]:.1f} us")
    for name, a, b in [("pdl_wait", 0, 1), ("prologue (Q, tiles 0-1 staged)", 1, 2), ("tile loop", 2, 3),
                       ("epilogue", 3, 4), ("block total", 0, 4)]:
        m, x = q(us(a, b)); print(f"    {name:32s} median {m:6.2f} max {x:6.2f} us")
    print("    from pdl_wait, median us: " + "; ".join(f"{n} {statistics.median(us(1, k)):.2f}" for n, k in [
        ("S: Q in registers", 5), ("S: K(0) ready", 6), ("S: P(0) written", 7), ("PV: rows(0) issued", 12),
        ("PV: tile 0 staged", 14), ("PV: tile 1 staged", 2)]))
    print(f"    epilogue: E barrier {statistics.median(us(3, 15)):.2f} stores {statistics.median(us(15, 4)):.2f} us")
for (b, h, s_q, extra) in [(128, 64, 1, 512), (128, 64, 1, 2048), (32, 64, 1, 512), (256, 128, 1, 512)]:
    a = dict(q=torch.randn(b, s_q, h, 512, device="cuda", generator=gen).bfloat16(), k_cache=main_cache,
             indices=torch.randint(0, 65536, (b, s_q, 128), device="cuda", generator=gen, dtype=torch.int32),
             topk_length=torch.full((b,), 128, dtype=torch.int32, device="cuda"), extra_k_cache=extra_cache,
             extra_indices=torch.randint(0, 262144, (b, s_q, extra), device="cuda", generator=gen, dtype=torch.int32),
             extra_topk_length=torch.full((b,), extra, dtype=torch.int32, device="cuda"),
             attn_sink=torch.randn(h, device="cuda", generator=gen))
    nb = min(N, b * s_q * ((h + 63) // 64))
    print(f"b={b} h={h} s_q={s_q} extra={extra} blocks={nb}")
    for _ in range(3):
        sd.sparse_decode(**a, impl="mma64ws")
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record(); sd.sparse_decode(**a, impl="mma64ws"); en.record(); torch.cuda.synchronize()
    report("one call after a sync", read(), nb, st.elapsed_time(en) * 1e3)
    st.record()
    for _ in range(20):
        sd.sparse_decode(**a, impl="mma64ws")
    en.record(); torch.cuda.synchronize()
    report("last of 20 back-to-back", read(), nb, st.elapsed_time(en) * 1e3 / 20)

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
for (b, h, extra) in [(128, 64, 512), (128, 64, 2048), (32, 64, 512)]:
    a = dict(q=torch.randn(b, 1, h, 512, device="cuda", generator=gen).bfloat16(), k_cache=main_cache,
             indices=torch.randint(0, 65536, (b, 1, 128), device="cuda", generator=gen, dtype=torch.int32),
             topk_length=torch.full((b,), 128, dtype=torch.int32, device="cuda"), extra_k_cache=extra_cache,
             extra_indices=torch.randint(0, 262144, (b, 1, extra), device="cuda", generator=gen, dtype=torch.int32),
             extra_topk_length=torch.full((b,), extra, dtype=torch.int32, device="cuda"),
             attn_sink=torch.randn(h, device="cuda", generator=gen))
    for _ in range(3):
        sd.sparse_decode(**a, impl="mma64ws")
    torch.cuda.synchronize()
    buf = (ctypes.c_longlong * (16 * 4096))()
    assert lib.dsv4_ws_trace_read(ctypes.byref(buf), ctypes.c_longlong(16 * 4096 * 8)) == 0
    tr = [[buf[p * 4096 + k] for k in range(4096)] for p in range(16)]
    nb = b
    med = lambda p: statistics.median(tr[p][:nb])
    nt = med(12)
    print(f"b={b} h={h} extra={extra} tiles={nt}")
    print(f"  S warp: total {statistics.median([tr[4][k]-tr[0][k] for k in range(nb)]):.0f} cyc; per tile waitK {med(1)/nt:.0f} S {med(2)/nt:.0f} softmax {med(3)/nt:.0f}")
    print(f"  PV warp: total {statistics.median([tr[11][k]-tr[5][k] for k in range(nb)]):.0f} cyc (loop); per tile waitP {med(6)/nt:.0f} PV {med(7)/nt:.0f} cpwait+bar {med(8)/nt:.0f} dequant+bar {med(9)/nt:.0f} issue {med(10)/nt:.0f}")

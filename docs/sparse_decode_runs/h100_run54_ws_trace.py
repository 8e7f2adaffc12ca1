# run 54: per-phase clock64 trace + block timeline of kernel_ws.cuh; DSV4_KERNEL_LIB=<a WS_TRACE=1 build of
# h100_run54_ws_instrument.py's copy> DSV4_KERNEL_FORCE=1 python3 THIS (repo root). Cycles per tile are medians over blocks.
import ctypes, os, sys, statistics
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
from deepseek_v4_kernel import _ext
lib = _ext.load()
gen = torch.Generator(device="cuda").manual_seed(0)
inp = B.DecodeInputs(gen)
N = 4096
for (b, h, extra, impl) in [(128, 16, 512, "mma64wsh16"), (128, 32, 512, "mma64wsh32"), (128, 64, 512, "mma64ws"),
                            (128, 16, 2048, "mma64wsh16"), (32, 16, 512, "mma64wsh16")]:
    sets = inp.sets(b, h, 1, extra)
    for i in range(12):
        sd.sparse_decode(**sets[i % len(sets)], impl=impl)
    torch.cuda.synchronize()
    buf = (ctypes.c_longlong * (32 * N))()
    assert lib.dsv4_ws_trace_read(ctypes.byref(buf), ctypes.c_longlong(32 * N * 8)) == 0
    T = [[buf[p * N + k] for k in range(b)] for p in range(32)]
    med = lambda xs: statistics.median(xs)
    nt = med(T[29])
    per = lambda p: med(T[p]) / nt
    span = lambda a, c: med([(T[c][k] - T[a][k]) / 1e3 for k in range(b)])
    print(f"b={b} h={h} extra={extra} {impl} tiles={nt}")
    print(f"  block (us, median): prologue {span(20, 22):.2f} loop {span(22, 23):.2f} epilogue {span(23, 30):.2f} "
          f"total {span(20, 30):.2f}; call span {(max(T[30]) - min(T[20])) / 1e3:.2f}")
    print(f"  S warp 0 per tile: waitK {per(1):.0f} mma {per(2):.0f} partials {per(3):.0f} softmax+arrive {per(4):.0f}")
    print(f"  S warp 3 per tile: waitK {per(9):.0f} mma {per(10):.0f} partials/free {per(11):.0f} softmax {per(12):.0f}")
    print(f"  PV warp 0 per tile: waitP {per(17):.0f} PV {per(18):.0f} cpwait {per(19):.0f} bar1 {per(24):.0f} "
          f"dequant {per(25):.0f} bar2 {per(26):.0f} issue {per(27):.0f}; loop cycles/tile "
          f"{med([(T[28][k] - T[16][k]) for k in range(b)]) / nt:.0f}")
    del sets

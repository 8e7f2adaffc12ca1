# run 57 call 6: one shape, one kernel, a few calls (for Nsight Compute: --launch-skip 2 --launch-count 1).
# argv: impl [b h_q s_q extra]
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
impl = sys.argv[1]
# the f8 kernel (impl 9) exists only in libraries built from h100_run57_fp8_in_place.diff's tree
sd.HEAD_TILE.setdefault("mma64f8", 64)
sd.IMPL_CODE.setdefault("mma64f8", 9)
b, h, s_q, extra = (int(x) for x in (sys.argv[2:6] if len(sys.argv) > 5 else (128, 64, 1, 512)))
a = B.DecodeInputs(torch.Generator(device="cuda").manual_seed(0)).sets(b, h, s_q, extra)[0]
for _ in range(4):
    sd.sparse_decode(**a, impl=impl)
torch.cuda.synchronize()
print("done", impl, b, h, s_q, extra)

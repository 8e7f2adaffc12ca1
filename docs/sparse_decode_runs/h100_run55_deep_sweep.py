# run 55: the 16-head two-buffer block (mma64wsh16) against the deep-gather one (mma64wsh16deep) at the launch shapes
# the rule picks for 16-head blocks, 1-20 tiles per block (bench_sparse_decode's method: cold decode-step inputs, CUDA
# graphs, median of 15). argv: impl. Run per impl in alternating processes, two rounds, min per row.
import os, sys, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
impl = sys.argv[1]
SHAPES = [(1, 16, 512), (8, 16, 512), (16, 16, 512), (20, 16, 512), (32, 16, 512), (20, 16, 1024), (40, 16, 512),
          (24, 16, 1024), (32, 16, 1024), (64, 16, 512), (128, 16, 512), (4, 16, 2048), (8, 16, 2048), (12, 16, 2048),
          (16, 8, 512), (64, 8, 512)]
gen = torch.Generator(device="cuda").manual_seed(0)
inp = B.DecodeInputs(gen)
sms = torch.cuda.get_device_properties(0).multi_processor_count
res = {}
for (b, h, extra) in SHAPES:
    _, splits, st = sd.mma64_launch(b, 1, h, 128 + extra, sms, 16)
    sets = inp.sets(b, h, 1, extra)
    t, mode = B.time_fn(lambda a: sd.sparse_decode(**a, impl=impl), sets, 15)
    res[f"{b}/{h}/{extra}"] = t
    print(f"{impl:15s} b={b:4d} h={h:3d} extra={extra:5d} splits={splits:2d} tiles={-(-st // 32):2d} {t:8.2f} us ({mode})",
          flush=True)
    del sets
print("JSON", json.dumps({impl: res}))

# run 56: time a few shapes with the library in DSV4_KERNEL_LIB (bench_sparse_decode's method: decode-step inputs,
# CUDA graphs, median of 15); one line per shape. argv: tag [set]. Run per library in alternating processes, two
# rounds (min per row), as run 54's h100_run54_time_shapes.py.
import os, sys, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
tag = sys.argv[1]
SETS = {
    "narrow": [(128, 64, 1, 512), (128, 64, 1, 2048), (128, 128, 2, 512), (32, 64, 1, 512), (64, 64, 1, 512),
               (128, 16, 1, 512), (128, 32, 1, 512), (8, 64, 1, 512), (16, 64, 1, 2048)],
    "wide": [(b, h, 1, e) for (b, h, e) in [
        (1, 64, 512), (1, 64, 2048), (8, 64, 2048), (32, 64, 2048), (256, 64, 512), (1024, 64, 512),
        (4, 8, 512), (16, 8, 512), (64, 8, 512), (64, 8, 2048), (256, 8, 512),
        (4, 16, 2048), (16, 16, 512), (64, 16, 512), (128, 16, 2048), (512, 16, 512),
        (4, 32, 512), (16, 32, 2048), (64, 32, 512), (128, 32, 2048), (512, 32, 512)]],
    # run 58: split launches (b <= 32), where the partials' bytes count
    "small": [(1, 64, 1, 512), (1, 64, 1, 2048), (1, 64, 2, 512), (1, 128, 1, 512), (1, 128, 1, 2048),
              (1, 128, 2, 2048), (1, 16, 1, 512), (4, 64, 1, 512), (8, 64, 1, 512), (8, 64, 1, 2048),
              (8, 64, 2, 512), (8, 128, 1, 512), (8, 16, 1, 512), (16, 64, 1, 512), (32, 64, 1, 512)],
}
shapes = SETS[sys.argv[2] if len(sys.argv) > 2 else "narrow"]
gen = torch.Generator(device="cuda").manual_seed(0)
inp = B.DecodeInputs(gen)
res = {}
for (b, h, s_q, extra) in shapes:
    sets = inp.sets(b, h, s_q, extra)
    fn = lambda a: sd.sparse_decode(**a)
    t, mode = B.time_fn(fn, sets, 15)
    res[f"{b}/{h}/{s_q}/{extra}"] = t
    print(f"{tag:8s} b={b:5d} h={h:3d} s_q={s_q} extra={extra:5d} {t:9.2f} us ({mode})", flush=True)
    del sets
print("JSON", json.dumps({tag: res}))

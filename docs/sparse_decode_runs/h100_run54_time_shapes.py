# run 54: time a few shapes with the library in DSV4_KERNEL_LIB (bench_sparse_decode's method: cold decode-step
# inputs, CUDA graphs, median of 15); one line per shape. argv: tag; R54_WIDE=1: 27 shapes with impl auto.
# The A/Bs ran it per library in alternating processes, two rounds (min per row).
import os, sys, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
tag = sys.argv[1]
SHAPES = [(128, 16, 512, "mma64wsh16"), (128, 32, 512, "mma64wsh32"), (128, 64, 512, "mma64ws"),
          (128, 16, 2048, "mma64wsh16"), (32, 16, 512, "auto"), (64, 8, 512, "auto")]
if os.environ.get("R54_WIDE"):
    SHAPES = [(b, h, e, "auto") for (b, h, e) in [
        (1, 64, 512), (1, 64, 2048), (8, 64, 512), (8, 64, 2048), (32, 64, 512), (128, 64, 512),
        (1, 8, 512), (4, 8, 512), (16, 8, 512), (64, 8, 512), (64, 8, 2048), (256, 8, 512),
        (1, 16, 512), (4, 16, 2048), (16, 16, 512), (64, 16, 512), (128, 16, 512), (128, 16, 2048), (512, 16, 512),
        (1, 32, 512), (4, 32, 512), (16, 32, 2048), (64, 32, 512), (128, 32, 512), (128, 32, 2048), (512, 32, 512),
        (128, 128, 512)]]
if len(sys.argv) > 2:
    SHAPES = SHAPES[:int(sys.argv[2])]
gen = torch.Generator(device="cuda").manual_seed(0)
inp = B.DecodeInputs(gen)
res = {}
for (b, h, extra, impl) in SHAPES:
    sets = inp.sets(b, h, 1, extra)
    fn = lambda a: sd.sparse_decode(**a, impl=impl)
    t, mode = B.time_fn(fn, sets, 15)
    res[f"{b}/{h}/{extra}/{impl}"] = t
    print(f"{tag:8s} b={b:4d} h={h:3d} extra={extra:5d} {impl:11s} {t:8.2f} us ({mode})", flush=True)
    del sets
print("JSON", json.dumps({tag: res}))

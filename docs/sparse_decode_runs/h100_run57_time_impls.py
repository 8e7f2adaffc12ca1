# run 57: time 64-head launch shapes with each named kernel (bench_sparse_decode's method: decode-step inputs, CUDA
# graphs, median of 15), the kernels alternating per shape, `rounds` rounds, min per row; one library
# (DSV4_KERNEL_LIB). argv: impl,impl,... [rounds] [set]
import os, sys, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
impls = sys.argv[1].split(",")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
SETS = {
    "narrow": [(128, 64, 1, 512), (128, 64, 1, 2048), (128, 128, 2, 512), (256, 64, 1, 512), (32, 64, 1, 512),
               (64, 64, 1, 512), (8, 64, 1, 512), (16, 64, 1, 2048), (1, 64, 1, 512), (1024, 64, 1, 512)],
    "mini": [(128, 64, 1, 512), (128, 64, 1, 2048), (32, 64, 1, 512), (1, 64, 1, 512)],
}
shapes = SETS[sys.argv[3] if len(sys.argv) > 3 else "narrow"]
gen = torch.Generator(device="cuda").manual_seed(0)
inp = B.DecodeInputs(gen)
res = {}
for (b, h, s_q, extra) in shapes:
    sets = inp.sets(b, h, s_q, extra)
    key = f"{b}/{h}/{s_q}/{extra}"
    for r in range(rounds):
        for impl in impls:
            fn = lambda a, impl=impl: sd.sparse_decode(**a, impl=impl)
            t, mode = B.time_fn(fn, sets, 15)
            res.setdefault(key, {}).setdefault(impl, []).append(t)
    row = res[key]
    base = min(row[impls[0]])
    print(f"b={b:5d} h={h:3d} s_q={s_q} extra={extra:5d} " +
          "  ".join(f"{i} {min(v):8.2f} ({min(v) / base:.3f})" for i, v in row.items()), flush=True)
    del sets
print("JSON", json.dumps(res))

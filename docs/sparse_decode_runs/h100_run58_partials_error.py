# run 58: output error against the float64 reference of the library in DSV4_KERNEL_LIB, per shape, for the launch
# auto picks (split: the partials' precision counts) and the same shape forced unsplit (one bf16 rounding of fp32
# sums). Inputs as tests/test_sparse_decode.py's _case (random rows, sink, 5 % -1 slots). argv: tag. Prints one line
# per shape and a JSON line.
import os, sys, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import torch
import deepseek_v4_kernel.ops.sparse_decode as sd
from deepseek_v4_kernel.reference.sparse_decode import sparse_decode_ref
from test_sparse_decode import _case, _to_cuda
tag = sys.argv[1]
SHAPES = [(1, 64, 1, 512), (8, 64, 1, 512), (1, 64, 1, 2048), (1, 128, 2, 2048), (4, 16, 1, 512), (2, 32, 2, 512)]
launch = sd.mma64_launch
res = {}
for (b, h, s_q, extra) in SHAPES:
    a = _case(b, s_q, h, 128, n_main=3000, extra_topk=extra, n_extra=6000, sink=True, neg_frac=0.05, seed=58)
    ref_o, _ = sparse_decode_ref(**a)
    ac = _to_cuda(a)
    for mode in ("auto", "unsplit"):
        if mode == "unsplit":
            sd.mma64_launch = lambda b_, s_, h_, T, n, hpb=None: (launch(b_, s_, h_, T, n, hpb)[0], 1, -(-T // 32) * 32)
        else:
            sd.mma64_launch = launch
        hpb, splits, _ = sd.mma64_launch(b, s_q, h, 128 + extra, sd._sm_count(torch.device("cuda")))
        out, _ = sd.sparse_decode(**ac)
        torch.cuda.synchronize()
        o = out.double().cpu()
        err = (o - ref_o).abs()
        ulp = torch.exp2(torch.floor(torch.log2(ref_o.abs().clamp_min(1e-30))) - 7)   # bf16 ulp of the reference
        u = (err / ulp).flatten()
        r = dict(splits=splits, hpb=hpb, max_abs=err.max().item(), ref_absmax=ref_o.abs().max().item(),
                 ref_absmed=ref_o.abs().median().item(), ulp_max=u.max().item(),
                 ulp_p999=u.kthvalue(int(0.999 * u.numel())).values.item(), ulp_mean=u.mean().item(),
                 rtol_needed_at_atol_1e5=((err - 1e-5) / ref_o.abs()).clamp_min(0).max().item())
        res[f"{b}/{h}/{s_q}/{extra}/{mode}"] = r
        print(f"{tag:6s} b={b} h={h} s_q={s_q} extra={extra} {mode:8s} splits={splits:2d} hpb={hpb} "
              f"max|err| {r['max_abs']:.2e} (|ref| max {r['ref_absmax']:.2e} med {r['ref_absmed']:.2e}) "
              f"bf16 ulps: max {r['ulp_max']:.2f} p99.9 {r['ulp_p999']:.2f} mean {r['ulp_mean']:.3f} "
              f"rtol@atol1e-5 {r['rtol_needed_at_atol_1e5']:.2e}", flush=True)
sd.mma64_launch = launch
print("JSON", json.dumps({tag: res}))

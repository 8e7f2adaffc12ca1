"""Repeated-call stress of the mHC pre-norm GEMM's cross-program hand-offs (GPU; not a test).

Why: the Triton kernel's sub-slices hand their fp32 partials to reducer programs through counters in a persistent
per-stream buffer (the last arrival, or R waiting reducers), the fn hi / lo planes of ``presplit`` live in a persistent
workspace written by a kernel launched just before the GEMM (PDL), and the compiled kernels share the counters. A
mistake in any of these shows only across calls (stale partials, a counter left non-zero, a plane read before it is
written), rarely, and only as wrong numbers. So every call here runs on fresh random inputs after every workspace of
the op was filled with NaN, is checked against float64, and is repeated on the same inputs (after poisoning again) to
compare bits; after each call every counter must be back at zero. Cases run in a random order each round, so the
kernels that share the counters follow each other in every order. Some rounds replay each case from a CUDA graph.

Usage (GPU): python3 tools/stress_hc_prenorm.py [--rounds 200] [--budget S] [--seed 0] [--graph-every 10]
       [--only LABEL] [--json out.json]
Under DISABLE_MMA_V3=1 the Triton kernels build mma.sync (SM120's instruction class) on an H100.
Exit status 1 if any call failed."""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from deepseek_v4_kernel.ops import hc_prenorm as hp  # noqa: E402
from deepseek_v4_kernel.reference.hc_prenorm import hc_prenorm_abs_scale, hc_prenorm_gemm_ref  # noqa: E402

K, N = 16384, 24
_MMA = {"fma": False}
# (label, m, num_splits, impl, _config): the Triton configs of test_gpu_cuda_graph_replay_and_determinism, the tile
# table's buckets (waiting reducers R > 1 at m 4..1024; presplit from 2048 with mma.sync, above it with wgmma) forced
# to the Triton kernel, and the compiled kernels that share the counters
CASES = [
    ("triton cfg5 m512 p32 r16 presplit", 512, None, "triton",
     {**_MMA, "num_stages": 4, "block_m": 64, "p": 32, "r": 16, "presplit": True}),
    ("triton m64 p128 r32", 64, None, "triton", {**_MMA, "num_stages": 2, "block_m": 64, "p": 128, "r": 32}),
    ("triton m8 fma p128 r8", 8, None, "triton", {"fma": True, "num_stages": 1, "block_m": 8, "p": 128, "r": 8,
                                                  "num_warps": 8}),
] + [(f"triton table m{m}", m, None, "triton", None) for m in (4, 8, 16, 32, 64, 128, 512, 1024, 2048, 4096)] + [
    ("triton table m512 S4", 512, 4, "triton", None),
    ("cuda m512", 512, None, "cuda", None),
    ("cuda m64", 64, None, "cuda", None),
    ("cuda m12", 12, None, "cuda", None),
    ("cuda m33", 33, None, "cuda", None),
    ("auto m8192", 8192, None, "auto", None),
]


def reference(x, fn, S):
    """float64 out [S, m, n], sqrsum [S, m] (the project's reference) and the tests' bound's scale A
    (tests/test_hc_prenorm.py _check: |err| <= 2^-13 A with bf16x2)."""
    ro, rs = hc_prenorm_gemm_ref(x, fn, S)
    Sn = 1 if S is None else S
    return ro.reshape(Sn, *ro.shape[-2:]), rs.reshape(Sn, -1), hc_prenorm_abs_scale(x, fn, S)


def poison_workspaces():
    for bufs in hp.api._WORKSPACES.values():
        for t in bufs:
            t.fill_(float("nan"))


def counters_nonzero():
    return sum(int(c.count_nonzero()) for c in hp.api._COUNTERS.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--graph-every", type=int, default=10, help="every n-th round replays each case from a graph")
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script under TRITON_INTERPRET=1")
    ap.add_argument("--k", type=int, default=K, help="K (DeepSeek-V4: 16384)")
    ap.add_argument("--only", default="", help="substring of the case labels to run")
    ap.add_argument("--budget", type=float, default=0.0, help="stop after the round that passes this many seconds")
    a = ap.parse_args()
    import triton
    dev = torch.device(a.device)
    on_gpu = dev.type == "cuda"
    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name(dev) if on_gpu else 'cpu'}, K {a.k}, "
          f"DISABLE_MMA_V3={os.environ.get('DISABLE_MMA_V3', '')}, DSV4_HC_PRENORM_ATOMIC="
          f"{os.environ.get('DSV4_HC_PRENORM_ATOMIC', '')}", flush=True)
    cases = [c for c in CASES if a.only in c[0]]
    rng = random.Random(a.seed)
    gen = torch.Generator(device=dev)
    stats = {c[0]: dict(calls=0, wrong=0, nan=0, bits=0, counters=0, worst=0.0, first_fail=None) for c in cases}
    t0 = time.time()
    for rnd in range(a.rounds):
        order = list(enumerate(cases))
        rng.shuffle(order)
        graph = on_gpu and a.graph_every > 0 and rnd % a.graph_every == a.graph_every - 1
        for ci, (label, m, S, impl, cfg) in order:
            st = stats[label]
            gen.manual_seed(a.seed * 100003 + rnd * 101 + ci)
            x = torch.randn(m, a.k, device=dev, generator=gen).bfloat16()
            fn = torch.randn(N, a.k, device=dev, generator=gen) * 0.05
            Sn = 1 if S is None else S
            out = torch.empty(Sn, m, N, device=dev)
            sq = torch.empty(Sn, m, device=dev)

            def call():
                hp.hc_prenorm_gemm(x, fn, out, sq, S, impl=impl, _config=cfg)

            results = []
            g = None
            for rep in range(2):
                poison_workspaces()
                out.fill_(float("nan"))
                sq.fill_(float("nan"))
                if graph and rep == 1:
                    if g is None:
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            call()  # warm-up on the capture stream: its own counters / workspaces
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g, stream=s):
                                call()
                        torch.cuda.current_stream().wait_stream(s)
                        poison_workspaces()
                        out.fill_(float("nan"))
                        sq.fill_(float("nan"))
                    g.replay()
                else:
                    call()
                if on_gpu:
                    torch.cuda.synchronize()
                results.append((out.clone(), sq.clone(), hp.api.last_launch))
                nz = counters_nonzero()
                if nz:
                    st["counters"] += 1
                    for c in hp.api._COUNTERS.values():
                        c.zero_()
            ro, rs, scl = reference(x, fn, S)
            for o, q, launch in results:
                st["calls"] += 1
                bad_nan = bool(torch.isnan(o).any() or torch.isnan(q).any())
                # as fractions of the tests' bounds: out 2^-13 A (bf16x2), sqrsum rtol 2e-5
                err = ((o.double() - ro).abs() / (2.0 ** -13 * scl + 1e-30)).max().item()
                errq = ((q.double() - rs).abs() / (2e-5 * rs.abs() + 1e-30)).max().item()
                worst = max(err, errq)
                st["worst"] = max(st["worst"], worst if worst == worst else float("inf"))
                wrong = bad_nan or not worst <= 1.0
                st["nan"] += bad_nan
                st["wrong"] += wrong
                if wrong and st["first_fail"] is None:
                    st["first_fail"] = dict(round=rnd, graph=graph, nan=bad_nan, err=err, errq=errq,
                                            launch=str(launch)[:200])
            atomic = any("atomic" in str(r[2]) for r in results)
            if not atomic and not (torch.equal(results[0][0], results[1][0]) and
                                   torch.equal(results[0][1], results[1][1])):
                st["bits"] += 1
                if st["first_fail"] is None:
                    st["first_fail"] = dict(round=rnd, graph=graph, bits=True, launch=str(results[0][2])[:200])
        if a.budget and time.time() - t0 > a.budget:
            print(f"budget reached after {rnd + 1} rounds", flush=True)
            break
        if rnd % 20 == 19:
            bad = sum(s["wrong"] + s["bits"] + s["counters"] for s in stats.values())
            print(f"round {rnd + 1}: {time.time() - t0:.0f} s, failures so far {bad}", flush=True)
    print(f"\n{'case':40s} {'calls':>6s} {'wrong':>6s} {'nan':>5s} {'bits':>5s} {'cnt!=0':>6s} {'worst/bound':>11s}")
    for label, st in stats.items():
        print(f"{label:40s} {st['calls']:6d} {st['wrong']:6d} {st['nan']:5d} {st['bits']:5d} {st['counters']:6d} "
              f"{st['worst']:11.2e}" + (f"  first: {st['first_fail']}" if st["first_fail"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(stats, f, indent=1)
    failed = sum(s["wrong"] + s["bits"] + s["counters"] for s in stats.values())
    print(f"total failures: {failed} ({time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

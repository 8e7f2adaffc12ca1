"""Benchmark: the block-scaled FP8 linear at decode sizes (ours) vs SGLang's and DeepGEMM's kernels, on
DeepSeek-V4-Flash's dense FP8 projections (deepseek_v4_kernel/ops/fp8_linear/shapes.py) at TP 1 (--tp N: that rank's
shards), M = 1, 2, 4, 8, 16, 32, 64 tokens.

Competitors (same run, same GPU; each on its own weight / scale forms, activation quantization included where the
competitor needs it, as SGLang runs it):
  triton       SGLang's Triton block-FP8 GEMM (fp8_utils.triton_w8a8_block_fp8_linear: per-token-group quant of x to
               e4m3 + _w8a8_block_fp8_matmul, `--fp8-gemm-backend triton`, SGLang's SM120 fallback), natively and,
               in a child process, with DISABLE_MMA_V3=1 (mma.sync: SM120's instruction class). Not for wo_a (SGLang
               has no Triton grouped path).
  deepgemm     DeepGEMM's native sm90 kernel (deep_gemm.fp8_gemm_nt; wo_a: deep_gemm.fp8_einsum "bhr,hdr->bhd"),
               with SGLang's activation quant (sglang_per_token_group_quant_fp8, column-major TMA-aligned scales)
               included; deepgemm_gemm: the GEMM alone on pre-quantized x.
  cublas_bf16  wo_a only: torch.bmm on the dequantized bf16 weight (what SGLang on SM120 runs: it dequantizes wo_a
               to bf16 at load).
Ours runs mma.sync (f16 x f16, SM120's class) everywhere: "ours" the ring kernel (kernel="ring", the default),
"ours_int" the same with the integer e4m3 decode (A/B), "ours_regs" the first kernel (kernel="regs": weights straight
to a register ring), each with its own split rule; --sweep-splits times the ring kernel at 1-32 splits.
Timing: CUDA-graph replays over rotated weight sets (4 x L2 of weights per pass, so no call finds its weights in
L2), median, µs per call. Floor: (weight + scale + x + out bytes) / the copy rate measured in this run (read + write
of 1 GiB); "% floor" = floor / ours.

usage: python benchmarks/bench_fp8_linear.py [--out DIR] [--tp N] [--ms 1,2,4,8,16,32,64] [--shapes wq_a,wo_b]
                                            [--sweep-splits] [--no-mma-sync-child] [--budget-s S]
                                            [--child-timeout S]
M = 1, 16, 64 go first for every shape, then the other sizes; past --budget-s only ours is timed.
Writes DIR/bench_fp8_linear.json and .png (default benchmarks/results/).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from deepseek_v4_kernel.bench.timing import l2_bytes, rotation_count, time_rotated  # noqa: E402
from deepseek_v4_kernel.ops.fp8_linear import fp8_grouped_linear, fp8_linear, pick_splits  # noqa: E402
from deepseek_v4_kernel.ops.fp8_linear.shapes import model_shapes  # noqa: E402
from bench_common import copy_bw  # noqa: E402

MS = (1, 2, 4, 8, 16, 32, 64)


def _why(e):
    t = str(e).strip().splitlines()
    return f"{type(e).__name__}: {t[0][:160] if t else ''}"


# ----------------------------------------------------------------------------- inputs
def rand_e4m3(shape, g):
    b = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=g)
    b[(b & 0x7F) == 0x7F] = 0x3C   # no NaN codes
    return b.view(torch.float8_e4m3fn)


def weight_sets(sh, count, g):
    """`count` independent (weight, fp32 scale) sets of shape sh (scales: powers of two 2^-12..2^-6 times 1.0-1.5)."""
    lead = (sh.groups,) if sh.groups else ()
    out = []
    for _ in range(count):
        w = rand_e4m3((*lead, sh.N, sh.K), g)
        s = torch.exp2(torch.randint(-12, -6, (*lead, -(-sh.N // 128), sh.K // 128), device="cuda",
                                     generator=g).float()) * (1 + torch.rand(*lead, -(-sh.N // 128), sh.K // 128,
                                                                          device="cuda", generator=g) * 0.5)
        out.append((w, s))
    return out


def bytes_of(sh, M):
    G = sh.groups or 1
    return sh.weight_bytes + G * (-(-sh.N // 128)) * (sh.K // 128) * 4 + G * M * sh.K * 2 + G * M * sh.N * 2


# ----------------------------------------------------------------------------- competitors
def load_sglang_triton():
    """SGLang's Triton block-FP8 linear (quant + GEMM), by the first import path that works."""
    errs = []
    for mod in ("sglang.srt.layers.quantization.fp8_utils",):
        try:
            m = __import__(mod, fromlist=["triton_w8a8_block_fp8_linear"])
            return m.triton_w8a8_block_fp8_linear, None
        except Exception as e:  # noqa: BLE001
            errs.append(f"{mod}: {_why(e)}")
    return None, "; ".join(errs)


def load_sglang_quant():
    errs = []
    for mod in ("sglang.kernels.ops.quantization.fp8_kernel", "sglang.srt.layers.quantization.fp8_kernel"):
        try:
            m = __import__(mod, fromlist=["sglang_per_token_group_quant_fp8"])
            return m.sglang_per_token_group_quant_fp8, None
        except Exception as e:  # noqa: BLE001
            errs.append(f"{mod}: {_why(e)}")
    return None, "; ".join(errs)


def load_deep_gemm():
    try:
        import deep_gemm
        return deep_gemm, None
    except Exception as e:  # noqa: BLE001
        return None, _why(e)


# ----------------------------------------------------------------------------- one shape
def time_shape(sh, M, sets, x, comp, only_triton=False, sweep=False, deadline=None):
    row = {"shape": sh.name, "N": sh.N, "K": sh.K, "G": sh.groups or 1, "M": M}
    late = deadline is not None and time.time() > deadline
    if late:
        row["note"] = "past the bench's time budget: competitors and sweeps not timed"
    grouped = sh.groups is not None
    xs = x if not grouped else x.view(M, sh.groups, sh.K)

    def timed(name, make):
        try:
            us, how = time_rotated([make(w, s) for w, s in sets])
            row[name] = us
            if how != "graph":
                row[name + "_how"] = how
        except Exception as e:  # noqa: BLE001
            row[name] = None
            row[name + "_error"] = _why(e)
        torch.cuda.synchronize()

    if not only_triton:
        outs = torch.empty(M, *( (sh.groups,) if grouped else ()), sh.N, dtype=torch.bfloat16, device="cuda")
        op = fp8_grouped_linear if grouped else fp8_linear
        timed("ours", lambda w, s: (lambda: op(xs, w, s, out=outs, kernel="ring")))
        timed("ours_regs", lambda w, s: (lambda: op(xs, w, s, out=outs, kernel="regs")))
        if not late:
            timed("ours_int", lambda w, s: (lambda: op(xs, w, s, out=outs, decode="int", kernel="ring")))
        props = torch.cuda.get_device_properties(0)
        row["splits"] = pick_splits(M, sh.N, sh.K, sh.groups or 1, props.multi_processor_count)
        row["splits_regs"] = pick_splits(M, sh.N, sh.K, sh.groups or 1, props.multi_processor_count, kernel="regs")
        if late:
            return row
        if sweep and M in (1, 16, 64):
            best = {}
            for sp in (1, 2, 4, 8, 16, 32):
                if sp > sh.K // 128:
                    continue
                f = (lambda w, s, sp=sp: (lambda: op(xs, w, s, out=outs, splits=sp, kernel="ring")))
                timed(f"ours_splits{sp}", f)
                best[sp] = row.get(f"ours_splits{sp}")
            row["splits_sweep"] = {str(k): v for k, v in best.items()}
        dg, quant = comp.get("deep_gemm"), comp.get("quant")
        if dg is not None and quant is not None:
            if grouped:
                G = sh.groups

                def dg_call(w, s, pre=False):
                    out = torch.empty(M, G, sh.N, dtype=torch.bfloat16, device="cuda")
                    q0 = quant(xs.reshape(M * G, sh.K).contiguous(), 128, column_major_scales=False)

                    def call():
                        q, qs = q0 if pre else quant(xs.reshape(M * G, sh.K).contiguous(), 128,
                                                     column_major_scales=False)
                        dg.fp8_einsum("bhr,hdr->bhd", (q.view(M, G, sh.K), qs.view(M, G, -1)), (w, s), out,
                                      recipe=(1, 128, 128))
                    return call
            else:
                def dg_call(w, s, pre=False):
                    out = torch.empty(M, sh.N, dtype=torch.bfloat16, device="cuda")
                    q0 = quant(xs, 128, column_major_scales=True, scale_tma_aligned=True)

                    def call():
                        q, qs = q0 if pre else quant(xs, 128, column_major_scales=True, scale_tma_aligned=True)
                        dg.fp8_gemm_nt((q, qs), (w, s), out)
                    return call
            timed("deepgemm", lambda w, s: dg_call(w, s))
            timed("deepgemm_gemm", lambda w, s: dg_call(w, s, pre=True))
        if grouped:   # SGLang on SM120: wo_a dequantized to bf16 at load, torch.bmm per call
            def bf16_call(w, s):
                from deepseek_v4_kernel.reference.fp8_linear import dequantize
                wb = dequantize(w, s).to(torch.bfloat16)
                out = torch.empty(M, sh.groups, sh.N, dtype=torch.bfloat16, device="cuda")
                return lambda: torch.bmm(xs.transpose(0, 1), wb.transpose(1, 2), out=out.transpose(0, 1))
            sets_bf16 = sets[: max(2, len(sets) // 2)]   # twice the bytes per set
            try:
                us, _ = time_rotated([bf16_call(w, s) for w, s in sets_bf16])
                row["cublas_bf16"] = us
            except Exception as e:  # noqa: BLE001
                row["cublas_bf16"], row["cublas_bf16_error"] = None, _why(e)
    tri = comp.get("triton")
    if tri is not None and not grouped and not (only_triton and late):
        timed("triton", lambda w, s: (lambda: tri(xs, w, [128, 128], s)))
    return row


def run(args, only_triton=False):
    torch.manual_seed(0)
    g = torch.Generator(device="cuda").manual_seed(0)
    comp, notes = {}, {}
    tri, why = load_sglang_triton()
    if tri is None:
        notes["triton"] = why
        print("SGLang Triton block-FP8: not timed:", why)
    comp["triton"] = tri
    if not only_triton:
        quant, why = load_sglang_quant()
        if quant is None:
            notes["quant"] = why
            print("SGLang per-token-group quant: not found:", why)
        comp["quant"] = quant
        dg, why = load_deep_gemm()
        if dg is None:
            notes["deep_gemm"] = why
            print("DeepGEMM: not timed:", why)
        comp["deep_gemm"] = dg
    shapes = [s for s in model_shapes(args.tp) if not args.shapes or s.name in args.shapes.split(",")]
    l2 = l2_bytes()
    rows = []
    first = [m for m in args.ms if m in (1, 16, 64)]   # pass 1: the sizes the targets name, every shape
    passes = [first, [m for m in args.ms if m not in first]] if first else [args.ms]
    deadline = time.time() + args.budget_s if args.budget_s else None
    for ms in passes:
        for sh in shapes:
            if not ms:
                continue
            n = rotation_count(sh.weight_bytes, l2, lo=2, hi=64)
            sets = weight_sets(sh, n, g)
            for M in ms:
                x = (torch.randn(M, (sh.groups or 1) * sh.K, device="cuda", generator=g)).bfloat16()
                t0 = time.time()
                row = time_shape(sh, M, sets, x, comp, only_triton, args.sweep_splits, deadline)
                row["tp"] = args.tp
                rows.append(row)
                if not only_triton:
                    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                          f"({time.time() - t0:.1f} s)", flush=True)
                    if args.partial:
                        json.dump({"rows": rows, "notes": notes, "partial": True}, open(args.partial, "w"))
            del sets
            torch.cuda.empty_cache()
    rows.sort(key=lambda r: ([s.name for s in shapes].index(r["shape"]), r["M"]))
    return rows, notes


def mma_sync_child(args):
    """SGLang's Triton kernel built as mma.sync (DISABLE_MMA_V3=1), in a child process (the switch is read when
    Triton compiles); returns {(shape, M): µs}."""
    out = os.path.join(args.out, "bench_fp8_linear_mma_sync.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--triton-only", "--tp", str(args.tp), "--ms",
           ",".join(map(str, args.ms)), "--out", args.out, "--budget-s", str(max(5, args.child_timeout - 15))] + \
        (["--shapes", args.shapes] if args.shapes else [])
    env = dict(os.environ, DISABLE_MMA_V3="1")
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {}, f"child timed out after {args.child_timeout} s"
    if r.returncode != 0 or not os.path.exists(out):
        print("mma.sync child failed:", r.returncode, r.stderr[-600:])
        return {}, f"child rc {r.returncode}: {r.stderr.strip().splitlines()[-1][:200] if r.stderr.strip() else ''}"
    data = json.load(open(out))
    os.remove(out)
    return {(d["shape"], d["M"]): d.get("triton") for d in data["rows"]}, data.get("notes", {}).get("triton")


def summarize(rows, bw):
    print(f"\ncopy rate {bw / 1e12:.2f} TB/s; µs per call; x = competitor time / ours")
    hdr = (f"{'shape':15s} {'N':>6s} {'K':>5s} {'G':>2s} {'M':>3s} {'ours':>7s} {'%floor':>6s} {'int':>7s} "
           f"{'regs':>7s} {'x':>5s} {'triton':>7s} {'x':>5s} {'tri.mma':>7s} {'x':>5s} {'DG+q':>7s} {'x':>5s} "
           f"{'DG':>7s} {'bf16':>7s} {'S':>3s}")
    print(hdr)

    def f(v):
        return f"{v:7.1f}" if isinstance(v, float) else f"{'-':>7s}"

    def x(a, b):
        return f"{a / b:5.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else f"{'-':>5s}"
    for r in rows:
        print(f"{r['shape']:15s} {r['N']:6d} {r['K']:5d} {r['G']:2d} {r['M']:3d} {f(r.get('ours'))} "
              f"{r.get('pct_floor', 0):6.1f} {f(r.get('ours_int'))} {f(r.get('ours_regs'))} "
              f"{x(r.get('ours_regs'), r.get('ours'))} {f(r.get('triton'))} {x(r.get('triton'), r.get('ours'))} "
              f"{f(r.get('triton_mma_sync'))} {x(r.get('triton_mma_sync'), r.get('ours'))} {f(r.get('deepgemm'))} "
              f"{x(r.get('deepgemm'), r.get('ours'))} {f(r.get('deepgemm_gemm'))} {f(r.get('cublas_bf16'))} "
              f"{r.get('splits', 0):3d}")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print("no plot:", _why(e))
        return
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.5))
    for name in sorted({r["shape"] for r in rows}):
        rs = [r for r in rows if r["shape"] == name and isinstance(r.get("ours"), float)]
        ax[0].plot([r["M"] for r in rs], [r["pct_floor"] for r in rs], marker="o", label=name)
        rd = [r for r in rs if isinstance(r.get("deepgemm"), float)]
        ax[1].plot([r["M"] for r in rd], [r["deepgemm"] / r["ours"] for r in rd], marker="o", label=name)
    ax[0].set(xscale="log", xlabel="tokens M", ylabel="% of byte floor (ours)", title="fp8_linear: ours vs floor")
    ax[1].set(xscale="log", xlabel="tokens M", ylabel="DeepGEMM (+quant) time / ours", title="speed-up vs DeepGEMM")
    ax[1].axhline(1.0, color="k", lw=0.5)
    ax[0].legend(fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default="")
    ap.add_argument("--sweep-splits", action="store_true")
    ap.add_argument("--no-mma-sync-child", action="store_true")
    ap.add_argument("--child-timeout", type=int, default=120)
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="after this many seconds only ours is timed (rows keep coming; 0: no budget)")
    ap.add_argument("--triton-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ms = [int(m) for m in args.ms.split(",")]
    os.makedirs(args.out, exist_ok=True)
    args.partial = None
    if args.triton_only:
        rows, notes = run(args, only_triton=True)
        json.dump({"rows": rows, "notes": notes}, open(os.path.join(args.out, "bench_fp8_linear_mma_sync.json"), "w"))
        return
    os.environ.setdefault("DSV4_KERNEL_FORCE", "1")
    bw = copy_bw()
    name = torch.cuda.get_device_name(0)
    print(f"{name}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs, copy {bw / 1e12:.2f} TB/s")
    args.partial = os.path.join(args.out, "bench_fp8_linear.partial.json")
    rows, notes = run(args)
    if os.path.exists(args.partial):
        os.remove(args.partial)
    for r in rows:
        sh = next(s for s in model_shapes(args.tp) if s.name == r["shape"])
        r["bytes"] = bytes_of(sh, r["M"])
        r["floor_us"] = r["bytes"] / bw * 1e6
        r["pct_floor"] = 100.0 * r["floor_us"] / r["ours"] if isinstance(r.get("ours"), float) else 0.0
    if not args.no_mma_sync_child:
        tri, why = mma_sync_child(args)
        for r in rows:
            r["triton_mma_sync"] = tri.get((r["shape"], r["M"]))
        if why:
            notes["triton_mma_sync"] = why
    result = {"gpu": name, "copy_bw": bw, "tp": args.tp, "notes": notes, "rows": rows,
              "torch": torch.__version__}
    path = os.path.join(args.out, "bench_fp8_linear.json")
    json.dump(result, open(path, "w"), indent=1)
    print("wrote", path)
    plot(rows, os.path.join(args.out, "bench_fp8_linear.png"))
    summarize(rows, bw)


if __name__ == "__main__":
    main()

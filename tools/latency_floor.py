"""What a call costs before it computes anything: the per-call floor of kernels in a CUDA graph (not a test).

Times, by the sparse-decode bench's own method (`bench_sparse_decode.time_fn`: many calls captured in one CUDA
graph, CUDA events, median of reps), Triton kernels that do no attention at all:

  empty x1          one empty kernel (one program) per call
  empty x2          two empty kernels per call (the split-KV shape: a split grid, then a combine grid)
  chain x1          one kernel of `--programs` programs (default: as many as our split grid has at that shape):
                    each loads a slot index, then the 576-byte row it points at in a 584-byte-per-token cache (a
                    dependent round trip), then stores the row
  chain x2          chain x1, then a second kernel (36 programs of 16 bytes) that reads its slice of every program's
                    stored row in one load and writes the sum (the combine's dependent round trip)
  ..., PDL          the second kernel launched early (programmatic dependent launch) and waiting in-kernel for
                    the first, as our split and combine grids do

and prints each with what 1/100 of a competitor's time is (`--fallback-us`, default: SGLang 0.5.23's Triton
fallback at b = 1, h_q 64, extra 512 in the README table), i.e. whether a ">= 100x" target there is below the
bare launch and memory chain of any split-KV call. Nothing here times our kernel; see bench_sparse_decode.py.
"""
import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from bench_sparse_decode import MAIN_TOKENS, time_fn  # noqa: E402  (the README bench's timing method, unchanged)
# (bench_sparse_decode put ROOT on the path) the packed cache's layout: ROW nope (fp8) + rope (bf16) bytes of a token,
# TOKEN_BYTES per token with its scales
from deepseek_v4_kernel.ops.sparse_decode import mma64_launch  # noqa: E402
from deepseek_v4_kernel.reference.sparse_decode import ROW as ROW_BYTES  # noqa: E402
from deepseek_v4_kernel.reference.sparse_decode import TOKEN_BYTES as TOKEN_STRIDE  # noqa: E402

EXTRA_TOKENS, H_Q = 512, 64   # with MAIN_TOKENS, the b = 1 row these floors are set against


@triton.jit
def _empty_kernel(x_ptr, GDC: tl.constexpr):
    if GDC:   # a dependent grid launched early (PDL) waits here for its primary, as our combine does
        tl.extra.cuda.gdc_wait()


@triton.jit
def _chain_kernel(idx_ptr, cache_ptr, out_ptr, TOKEN_STRIDE: tl.constexpr, ROW: tl.constexpr,
                  BLOCK: tl.constexpr, GDC: tl.constexpr):
    pid = tl.program_id(0)
    if GDC:   # let the dependent (combine) grid launch now; it waits for this grid's completion at gdc_wait
        tl.extra.cuda.gdc_launch_dependents()
    slot = tl.load(idx_ptr + pid)                                  # round trip 1: the slot index
    offs = tl.arange(0, BLOCK)
    row = tl.load(cache_ptr + slot.to(tl.int64) * TOKEN_STRIDE + offs, mask=offs < ROW)  # 2: its row
    tl.store(out_ptr + pid * BLOCK + offs, row, mask=offs < ROW)


@triton.jit
def _merge_kernel(part_ptr, out_ptr, N, NP: tl.constexpr, COLS: tl.constexpr, STRIDE: tl.constexpr,
                  GDC: tl.constexpr):
    # one program per COLS-byte slice: the slice of every program's row in one 2-D load (one round trip, as a
    # combine that reads all splits of a head row at once)
    pid = tl.program_id(0)
    if GDC:
        tl.extra.cuda.gdc_wait()
    rows = tl.arange(0, NP)
    cols = pid * COLS + tl.arange(0, COLS)
    tile = tl.load(part_ptr + rows[:, None] * STRIDE + cols[None, :], mask=rows[:, None] < N, other=0)
    tl.store(out_ptr + cols, tl.sum(tile.to(tl.int32), axis=0).to(tl.uint8))


def skeleton_programs(num_sms):
    """Blocks of our split grid at b = 1, h_q 64, main 128 + extra 512 on a GPU of num_sms SMs (the launch rule's
    pick: heads per block x splits), i.e. how many programs the skeleton's first kernel runs."""
    heads_per_block, splits, _ = mma64_launch(1, 1, H_Q, MAIN_TOKENS + EXTRA_TOKENS, num_sms)
    return -(-H_Q // heads_per_block) * splits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=0, help="programs of the chain kernel (default: as many as our "
                    "split grid has at b = 1, h_q 64, extra 512 on this GPU; 80 on an H100: 4 head blocks x 20 splits)")
    ap.add_argument("--fallback-us", type=float, default=293.9, help="competitor time per call (us)")
    ap.add_argument("--ours-us", type=float, default=7.4, help="our time per call at that shape (us)")
    ap.add_argument("--from-bench", default="", help="bench_sparse_decode.py's JSON of the same machine: take ours and "
                    "the Triton fallback from its b = 1, h_q 64, s_q 1, extra 512 row instead")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("latency_floor: needs a CUDA GPU")
    if args.from_bench:
        with open(args.from_bench) as f:
            row = next(r for r in json.load(f)["rows"]
                       if (r["b"], r["h_q"], r["s_q"], r["extra"]) == (1, 64, 1, 512))
        if "sgl_triton_us" not in row:
            sys.exit(f"latency_floor: {args.from_bench} has no SGLang Triton time at b = 1, h_q 64, extra 512 "
                     f"({row.get('sgl_triton_err', 'not timed')}); pass --fallback-us instead")
        args.ours_us, args.fallback_us = row["ours_us"], row["sgl_triton_us"]
    dev = "cuda"
    if args.programs <= 0:
        args.programs = skeleton_programs(torch.cuda.get_device_properties(0).multi_processor_count)
    n_sets = 4
    pool_tokens = 1 << 20                                          # 584 MB of cache: rows cold across sets
    cache = torch.randint(0, 255, (pool_tokens * TOKEN_STRIDE,), dtype=torch.uint8, device=dev)
    sets = []
    for _ in range(n_sets):
        idx = torch.randint(0, pool_tokens, (args.programs,), dtype=torch.int32, device=dev)
        part = torch.empty(args.programs * 1024, dtype=torch.uint8, device=dev)
        out = torch.empty(args.programs * 1024, dtype=torch.uint8, device=dev)
        sets.append({"idx": idx, "part": part, "out": out})
    dummy = torch.empty(1, device=dev)

    def empty1(a):
        _empty_kernel[(1,)](dummy, False)

    def empty2(a, pdl=False):
        _empty_kernel[(args.programs,)](dummy, False)
        _empty_kernel[(1,)](dummy, pdl, launch_pdl=pdl)

    def chain1(a, pdl=False):
        _chain_kernel[(args.programs,)](a["idx"], cache, a["part"], TOKEN_STRIDE, ROW_BYTES, 1024, pdl)

    def chain2(a, pdl=False):
        chain1(a, pdl)
        _merge_kernel[(ROW_BYTES // 16,)](a["part"], a["out"], args.programs, triton.next_power_of_2(args.programs),
                                          16, 1024, pdl, launch_pdl=pdl)

    rows = []
    for name, fn in (("empty x1", empty1), ("empty x2", empty2), ("empty x2, PDL", lambda a: empty2(a, True)),
                     ("chain x1", chain1), ("chain x2", chain2), ("chain x2, PDL", lambda a: chain2(a, True))):
        us, mode = time_fn(fn, sets, args.reps)
        rows.append({"what": name, "us": us, "mode": mode})
    dev_name = torch.cuda.get_device_name()
    target = args.fallback_us / 100
    print(f"device: {dev_name}, triton {triton.__version__}, torch {torch.__version__}; {args.programs} programs; "
          f">= 100x a {args.fallback_us:.1f} us competitor = {target:.2f} us per call; ours {args.ours_us:.2f} us")
    print("| per call | us | x the 100x budget | ours / this |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['us']:.2f} | {r['us'] / target:.2f} | {args.ours_us / r['us']:.2f} |")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"device": dev_name, "programs": args.programs, "fallback_us": args.fallback_us,
                       "ours_us": args.ours_us, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""A/B timing of sparse-decode libraries (a benchmark script: prints a table, writes JSON; never a test).

  python3 tools/ab_sparse_decode.py [--set narrow|wide|small|NAME,...] [--rounds 2] [--reps 15] [--out F.json]
                                      TAG=LIB.so [TAG=LIB.so ...]

Each library is timed in its own process (DSV4_KERNEL_LIB=LIB.so, DSV4_KERNEL_FORCE=1), the libraries alternating,
`--rounds` times over, with the bench's method (benchmarks/bench_sparse_decode.py: decode-step inputs, KV rows from HBM,
q and indices hot, CUDA graphs of >= 1 ms, median of `--reps`); per shape the minimum over rounds, and its ratio to the
first library's. The way every A/B of docs/sparse_decode.md  was timed, which earlier each device
device script re-implemented each time.
Shape sets: narrow (b >= 8, mostly unsplit), wide (TP-rank head counts, b 1-1024), small (split launches, b <= 32).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = {   # (b, h_q, s_q, extra)
    "narrow": [(128, 64, 1, 512), (128, 64, 1, 2048), (128, 128, 2, 512), (32, 64, 1, 512), (64, 64, 1, 512),
               (128, 16, 1, 512), (128, 32, 1, 512), (8, 64, 1, 512), (16, 64, 1, 2048)],
    "wide": [(b, h, 1, e) for (b, h, e) in [
        (1, 64, 512), (1, 64, 2048), (8, 64, 2048), (32, 64, 2048), (256, 64, 512), (1024, 64, 512),
        (4, 8, 512), (16, 8, 512), (64, 8, 512), (64, 8, 2048), (256, 8, 512),
        (4, 16, 2048), (16, 16, 512), (64, 16, 512), (128, 16, 2048), (512, 16, 512),
        (4, 32, 512), (16, 32, 2048), (64, 32, 512), (128, 32, 2048), (512, 32, 512)]],
    "small": [(1, 64, 1, 512), (1, 64, 1, 2048), (1, 64, 2, 512), (1, 128, 1, 512), (1, 128, 1, 2048),
              (1, 128, 2, 2048), (1, 16, 1, 512), (4, 64, 1, 512), (8, 64, 1, 512), (8, 64, 1, 2048),
              (8, 64, 2, 512), (8, 128, 1, 512), (8, 16, 1, 512), (16, 64, 1, 512), (32, 64, 1, 512)],
}


def shape_key(s):
    return "b={} h_q={} s_q={} extra={}".format(*s)


def shapes_of(spec):
    out = []
    for name in spec.split(","):
        if name not in SETS:
            raise SystemExit(f"--set: unknown shape set {name!r}; expected a comma-separated subset of {sorted(SETS)}")
        out += [s for s in SETS[name] if s not in out]
    return out


def parse_libs(items):
    libs = {}
    for it in items:
        tag, sep, path = it.partition("=")
        if not sep or not tag or not path:
            raise SystemExit(f"library argument {it!r}: expected TAG=PATH.so")
        if tag in libs:
            raise SystemExit(f"library tag {tag!r} given twice")
        if not os.path.isfile(path):
            raise SystemExit(f"library {tag}: no file {path}")
        libs[tag] = os.path.abspath(path)
    if not libs:
        raise SystemExit("no library given: TAG=PATH.so [TAG=PATH.so ...]")
    return libs


def summarize(rounds, tags, shapes):
    """rounds: list of {tag: {shape_key: us}} (one dict per process). Returns {shape_key: {tag: min us}} and the
    table lines (min over rounds; ratio to the first tag; n/a where a tag has no time for a shape)."""
    best = {}
    for r in rounds:
        for tag, res in r.items():
            for k, t in res.items():
                cur = best.setdefault(k, {}).get(tag)
                best[k][tag] = t if cur is None else min(cur, t)
    base = tags[0]
    lines = [f"{'shape':34s} " + " ".join(f"{t:>18s}" for t in tags)]
    for s in shapes:
        k = shape_key(s)
        row = best.get(k, {})
        h = row.get(base)
        cells = []
        for t in tags:
            v = row.get(t)
            if v is None:
                cells.append(f"{'n/a':>18s}")
            elif t == base or h is None:
                cells.append(f"{v:10.2f} us      ")
            else:
                cells.append(f"{v:10.2f} ({v / h:.3f})")
        lines.append(f"{k:34s} " + " ".join(cells))
    return best, lines


def child(tag, spec, reps):
    import torch
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_sparse_decode as B
    import deepseek_v4_kernel.ops.sparse_decode as sd
    inp = B.DecodeInputs(torch.Generator(device="cuda").manual_seed(0))
    res = {}
    for s in shapes_of(spec):
        sets = inp.sets(*s)
        t, mode = B.time_fn(lambda a: sd.sparse_decode(**a), sets, reps)
        res[shape_key(s)] = t
        print(f"{tag:10s} {shape_key(s):34s} {t:9.2f} us ({mode})", file=sys.stderr, flush=True)
        del sets
    print("JSON " + json.dumps({tag: res}), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libs", nargs="*", help="TAG=PATH.so, the first is the baseline")
    ap.add_argument("--set", default="narrow")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per process")
    ap.add_argument("--out", help="JSON file: every round's times and the per-shape minimum")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, a.set, a.reps)
    shapes = shapes_of(a.set)
    libs = parse_libs(a.libs)
    if a.rounds < 1:
        raise SystemExit("--rounds: expected >= 1")
    rounds, failed = [], []
    for r in range(a.rounds):
        for tag, path in libs.items():
            env = dict(os.environ, DSV4_KERNEL_LIB=path, DSV4_KERNEL_FORCE="1")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", tag, "--set", a.set, "--reps", str(a.reps)]
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out, err = "timeout", e.stdout or "", e.stderr or ""
                out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
            js = [ln[5:] for ln in out.splitlines() if ln.startswith("JSON ")]
            if rc != 0 or not js:
                failed.append(f"round {r + 1} {tag}: rc {rc}")
                print(f"round {r + 1} {tag}: rc {rc}\n{err[-2000:]}", flush=True)
                continue
            rounds.append(json.loads(js[-1]))
            print(f"round {r + 1} {tag}: done", flush=True)
    best, lines = summarize(rounds, list(libs), shapes)
    print(f"min over {a.rounds} rounds (alternating processes), us; (ratio to {list(libs)[0]})")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"libs": libs, "set": a.set, "reps": a.reps, "rounds": rounds, "min": best, "failed": failed},
                      f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

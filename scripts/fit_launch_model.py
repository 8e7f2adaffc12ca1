"""Fit the weights of the sparse-decode launch rule's cost model (`ops/sparse_decode.py`: M64_COST, the terms
of `mma64_cost_terms`) to launch sweeps, and say how good the picks of the shipped and of the fitted weights are.
Not a test; the tool for a GPU the weights were not fitted on (they are the H100's; on the first SM120 card):

    python scripts/sweep_sparse_decode.py --auto-kernels --out build/sweep     # on that GPU (every launch point)
    python scripts/fit_launch_model.py build/sweep/sweep_sparse_decode.json [other sweeps, to check against]

The fit: non-negative least squares of the relative error (each timed point's model time / measured time - 1) over
every timed point of the first file (or of --fit-on files). This reproduces the shipped weights from run 47's sweep
(tests/test_sparse_decode.py checks it). The report, per file: for every shape, the point the rule would pick
(`mma64_launch`'s own search, with either set of weights) against the fastest measured point; a pick the sweep
did not time (more blocks per SM than the sweep's limit) is counted apart. Then the fitted M64_COST line, to paste
into ops/sparse_decode.py if its picks are better. --json writes weights and reports.
Reads both formats sweep_sparse_decode.py has written (points as [heads, splits, us] with main_tokens, runs 26-47;
as dicts with tiles per row since).
"""
import argparse
import json
import os
import statistics
import sys
from contextlib import contextmanager

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import deepseek_v4_kernel.ops.sparse_decode as sd  # noqa: E402

KEYS = tuple(sd.M64_COST)


def load_sweep(path):
    """(num_sms, rows): rows of dict(b, h_q, s_q, extra, tiles, points={(heads per block, splits): us})."""
    data = json.load(open(path))
    rows = []
    for r in data["rows"]:
        if "tiles" in r:
            tiles = r["tiles"]
        else:
            tiles = max(1, -(-(data["main_tokens"] + r["extra"]) // sd.TOK_TILE))
        pts = {}
        for p in r["points"]:
            if isinstance(p, dict):
                if "us" in p:
                    pts[(p["hpb"], p["splits"])] = p["us"]
            else:
                pts[(p[0], p[1])] = p[2]
        rows.append(dict(b=r["b"], h_q=r["h_q"], s_q=r["s_q"], extra=r["extra"], tiles=tiles, points=pts))
    return data["num_sms"], rows


def nnls(a, y, max_iter=None):
    """argmin ||a x - y|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    a, y = np.asarray(a, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()) * float(np.abs(y).max()))
    for _ in range(max_iter or 3 * n + 30):
        w = a.T @ (y - a @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def fit(sweeps):
    """Weights {M64_COST key: value} from [(num_sms, rows), ...]: NNLS of the relative error over every timed point."""
    a, y = [], []
    for num_sms, rows in sweeps:
        for r in rows:
            for (hpb, s), us in r["points"].items():
                t = sd.mma64_cost_terms(r["b"], r["s_q"], r["h_q"], r["tiles"], hpb, s, num_sms)
                a.append([t[k] / us for k in KEYS])
                y.append(1.0)
    return dict(zip(KEYS, (float(v) for v in nnls(a, y))))


@contextmanager
def weights(w):
    """mma64_launch's search with other weights (its uncached function; the module's weights restored after)."""
    saved = dict(sd.M64_COST)
    sd.M64_COST.update(w)
    try:
        yield sd.mma64_launch.__wrapped__
    finally:
        sd.M64_COST.clear()
        sd.M64_COST.update(saved)


def report(w, num_sms, rows):
    """Per shape: (shape, pick, pick us or None if not timed, fastest us); and a summary dict."""
    out = []
    with weights(w) as launch:
        for r in rows:
            hpb, s, _ = launch(r["b"], r["s_q"], r["h_q"], r["tiles"] * sd.TOK_TILE, num_sms)
            out.append(((r["b"], r["h_q"], r["s_q"], r["extra"]), (hpb, s), r["points"].get((hpb, s)),
                        min(r["points"].values())))
    ratios = [us / best for _, _, us, best in out if us is not None]
    summary = dict(shapes=len(out), timed_picks=len(ratios), worst=max(ratios, default=float("nan")),
                   median=statistics.median(ratios) if ratios else float("nan"),
                   over_3pct=sum(x > 1.03 for x in ratios))
    return out, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+", help="sweep JSON files (sweep_sparse_decode.py); the first is fitted")
    ap.add_argument("--fit-on", default=None, help="comma-separated indices of the files to fit (default: 0)")
    ap.add_argument("--json", default=None, help="write the weights and the reports here")
    ap.add_argument("--rows", action="store_true", help="print every shape's picks, not only the summaries")
    args = ap.parse_args()
    data = [load_sweep(p) for p in args.sweeps]
    fit_on = [int(i) for i in args.fit_on.split(",")] if args.fit_on else [0]
    fitted = fit([data[i] for i in fit_on])
    shipped = dict(sd.M64_COST)
    print("fitted on:", ", ".join(os.path.basename(args.sweeps[i]) for i in fit_on))
    print(f"{'weight':>8} {'shipped':>8} {'fitted':>8}")
    for k in KEYS:
        print(f"{k:>8} {shipped[k]:8.3f} {fitted[k]:8.3f}")
    res = dict(fitted=fitted, shipped=shipped, fit_on=[args.sweeps[i] for i in fit_on], files={})
    for path, (num_sms, rows) in zip(args.sweeps, data):
        res["files"][path] = {}
        print(f"\n{path} ({num_sms} SMs, {len(rows)} shapes): pick us / fastest us")
        for name, w in (("shipped", shipped), ("fitted", fitted)):
            per_shape, s = report(w, num_sms, rows)
            res["files"][path][name] = dict(summary=s, rows=[dict(shape=sh, pick=pk, pick_us=us, best_us=b)
                                                               for sh, pk, us, b in per_shape])
            print(f"  {name:8s} worst {s['worst']:.3f}  median {s['median']:.3f}  > 1.03: {s['over_3pct']}  "
                  f"picks not timed: {s['shapes'] - s['timed_picks']}")
            if args.rows:
                for sh, pk, us, b in per_shape:
                    print(f"    b={sh[0]:>4} h={sh[1]:>3} s_q={sh[2]} extra={sh[3]:>5}  {pk[0]:>2}h x {pk[1]:>2}  "
                          + (f"{us / b:.3f}" if us is not None else "not timed"))
    print("\nM64_COST = dict(" + ", ".join(f"{k}={fitted[k]:.3f}" for k in KEYS) + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

"""Fit the weights of the sparse-decode launch rule's cost model (`ops/sparse_decode.py`: M64_COST, the terms
of `mma64_cost_terms`) to launch sweeps, and say how good the picks of the shipped and of other weights are.
Not a test; the tool for a GPU the weights were not fitted on (they are the H100's; on the first SM120 card):

    python tools/sweep_sparse_decode.py --auto-kernels --out build/sweep     # on that GPU (every launch point)
    python tools/fit_launch_model.py build/sweep/sweep_sparse_decode.json [other sweeps, to check against]

Three sets of weights: the shipped ones; "nnls", non-negative least squares of the relative error (model time /
measured time - 1) over every timed point of the first file (or of --fit-on files), which reproduces the shipped
weights from the H100 sweep (tests/test_sparse_decode.py checks it); and "searched", a coordinate search from both
for weights whose picks are faster, since a least-squares fit of the times need not pick best (H100: fitted to the
kernels "auto" runs today it put 6 of 80 shapes > 3 % off the fastest point, where the shipped weights put none).
The report, per file and set: for every shape, the point the rule picks (`mma64_launch`'s own search with those
weights) against the fastest measured point; a pick the sweep did not time (more blocks per SM than its limit) is
counted apart. Last, an M64_COST line to paste into ops/sparse_decode.py, only if the best set has fewer shapes > 3 %
off on the fitted data, or as many and a mean pick time more than MIN_GAIN lower. --json writes weights and reports.
Reads both formats sweep_sparse_decode.py has written (points as [heads, splits, us] with main_tokens, H100;
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
        while passive.any():
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            # step from x towards z until the first passive entry reaches 0; it (and any at 0) leaves the set
            neg = passive & (z <= 0)
            d = x[neg] - z[neg]
            alpha = float(np.min(np.where(d > 0, x[neg] / np.where(d > 0, d, 1.0), 0.0)))
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


def shape_tables(num_sms, rows):
    """Per shape: (terms [candidates x weights] in mma64_launch's tie order, measured us per candidate, nan where not
    timed, fastest us). For the search, which evaluates the rule's argmin many times."""
    out = []
    for r in rows:
        cands = list(sd.mma64_candidates(r["h_q"], r["tiles"]))
        terms = [sd.mma64_cost_terms(r["b"], r["s_q"], r["h_q"], r["tiles"], hpb, s, num_sms) for hpb, s, _ in cands]
        out.append((np.array([[t[k] for k in KEYS] for t in terms]),
                    np.array([r["points"].get((hpb, s), np.nan) for hpb, s, _ in cands]),
                    min(r["points"].values())))
    return out


def weight_vector(w):
    """Weights {M64_COST key: value} as a vector in KEYS order (what pick_loss takes)."""
    return np.array([w[k] for k in KEYS], dtype=np.float64)


def pick_loss(w, tables):
    """(shapes whose pick is > 3 % slower than the fastest point, mean pick us / fastest us) with weights w (a vector
    in KEYS order). A pick the sweep did not time counts as the shape's slowest timed point."""
    ratios = []
    for terms, us, best in tables:
        c = terms @ w
        i = int(np.argmax(c <= c.min() + 1e-9))   # the first near-minimal candidate, as mma64_launch keeps
        ratios.append((us[i] if not np.isnan(us[i]) else np.nanmax(us)) / best)
    return sum(x > 1.03 for x in ratios), float(np.mean(ratios))


def search(w0, tables, rounds=20):
    """Coordinate search from w0 (dict) for weights whose picks are faster (pick_loss), since a least-squares fit of
    the times need not pick best when the model's form misses something (a kernel switch with tiles per block). Each
    weight moves by fractions of itself and of the mean weight (so a zero weight can become non-zero)."""
    w = weight_vector(w0)
    best = pick_loss(w, tables)
    scale = max(float(np.abs(w).mean()), 1e-3)
    for _ in range(rounds):
        improved = False
        for k in range(len(w)):
            for unit in [u for u in (abs(w[k]), scale) if u > 0]:
                for f in (-0.5, -0.25, -0.1, -0.03, 0.03, 0.1, 0.25, 0.5, 1.0):
                    cand = w.copy()
                    cand[k] = max(0.0, w[k] + f * unit)
                    loss = pick_loss(cand, tables)
                    if loss < best:
                        best, w, improved = loss, cand, True
        if not improved:
            break
    return dict(zip(KEYS, (float(v) for v in w)))


MIN_GAIN = 0.005   # mean pick / fastest that a new set must save, with no more shapes > 3 % slower


def worth_changing(new, shipped):
    """Whether weights with pick_loss `new` should replace the shipped ones (pick_loss `shipped`)."""
    return new[0] < shipped[0] or (new[0] == shipped[0] and new[1] < shipped[1] - MIN_GAIN)


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
    tables = [t for i in fit_on for t in shape_tables(*data[i])]
    sets = {"shipped": dict(sd.M64_COST), "nnls": fit([data[i] for i in fit_on])}
    # the search from both, the better kept (over 3 %, then mean)
    found = [search(sets[k], tables) for k in ("shipped", "nnls")]
    sets["searched"] = min(found, key=lambda w: pick_loss(weight_vector(w), tables))
    print("fitted on:", ", ".join(os.path.basename(args.sweeps[i]) for i in fit_on))
    print(f"{'weight':>8} " + " ".join(f"{n:>8}" for n in sets))
    for k in KEYS:
        print(f"{k:>8} " + " ".join(f"{w[k]:8.3f}" for w in sets.values()))
    res = dict(weights=sets, fit_on=[args.sweeps[i] for i in fit_on], files={})
    for path, (num_sms, rows) in zip(args.sweeps, data):
        res["files"][path] = {}
        print(f"\n{path} ({num_sms} SMs, {len(rows)} shapes): pick us / fastest us")
        for name, w in sets.items():
            per_shape, s = report(w, num_sms, rows)
            res["files"][path][name] = dict(summary=s, rows=[dict(shape=sh, pick=pk, pick_us=us, best_us=b)
                                                               for sh, pk, us, b in per_shape])
            print(f"  {name:8s} worst {s['worst']:.3f}  median {s['median']:.3f}  > 1.03: {s['over_3pct']}  "
                  f"picks not timed: {s['shapes'] - s['timed_picks']}")
            if args.rows:
                for sh, pk, us, b in per_shape:
                    print(f"    b={sh[0]:>4} h={sh[1]:>3} s_q={sh[2]} extra={sh[3]:>5}  {pk[0]:>2}h x {pk[1]:>2}  "
                          + (f"{us / b:.3f}" if us is not None else "not timed"))
    losses = {n: pick_loss(weight_vector(w), tables) for n, w in sets.items()}
    best = min(losses, key=lambda n: (losses[n], n != "shipped"))
    print(f"\nbest picks on the fitted data: {best} (> 3 % slower: {losses[best][0]} shapes, mean "
          f"{losses[best][1]:.4f}; shipped {losses['shipped'][0]}, {losses['shipped'][1]:.4f})")
    # a change is worth shipping only beyond the sweeps' run-to-run noise (~1-2 % per point on the H100)
    if not worth_changing(losses[best], losses["shipped"]):
        print(f"the shipped weights pick within {MIN_GAIN:.1%} (mean) of the best found here, with no more shapes "
              "> 3 % slower: nothing to change")
    else:
        print("M64_COST = dict(" + ", ".join(f"{k}={sets[best][k]:.3f}" for k in KEYS) + ")")
        print("(check these picks on other sweeps, e.g. the files above, before shipping them)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

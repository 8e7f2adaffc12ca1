# run 52: per-row min over rounds of each library's bench tables (concatenated in the order of `names` x rounds)
import re, sys, collections
path, names = sys.argv[1], sys.argv[2].split(",")
tables, cur = [], None
for line in open(path):
    if re.match(r"^ +b +h +sq", line):
        cur = {}; tables.append(cur); continue
    m = re.match(r"^ +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +\| +([\d.]+)", line)
    if m and cur is not None:
        cur[tuple(int(x) for x in m.groups()[:4])] = float(m.group(6))
res = collections.defaultdict(lambda: collections.defaultdict(list))
for i, t in enumerate(tables):
    for k, v in t.items():
        res[names[i % len(names)]][k].append(v)
base = names[0]
print(f"{'b/h/sq/extra':>18} " + " ".join(f"{n:>8}" for n in names) + "   " + " ".join(f"{n + '/' + base:>12}" for n in names[1:]))
ratios = collections.defaultdict(list)
for k in sorted(res[base], key=lambda k: (k[1], k[2], k[3], k[0])):
    mins = {n: min(res[n][k]) for n in names}
    for n in names[1:]: ratios[n].append(mins[n] / mins[base])
    print(f"{'/'.join(map(str, k)):>18} " + " ".join(f"{mins[n]:8.1f}" for n in names) + "   " +
          " ".join(f"{mins[n] / mins[base]:12.3f}" for n in names[1:]))
import statistics
for n in names[1:]:
    r = sorted(ratios[n]); print(f"{n}/{base}: min {r[0]:.3f} median {statistics.median(r):.3f} max {r[-1]:.3f} over {len(r)} rows")

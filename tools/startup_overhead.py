"""What our sitecustomize.py adds to the start of a Python process (docs/performance.md, "Start-up overhead").

Fresh interpreters, median of N each; the cases of a table are interleaved (one run of each per round) so that a
drift of the machine touches them alike.

1. ``python -c pass`` (a process that never imports SGLang: pip, shell helpers, compilers' scripts): wall clock
   without our directory (the baseline) and with it, and the import time of ``sitecustomize`` itself
   (``-X importtime``, the part of the difference that is ours, free of the noise of a whole process), in three
   layouts of our directory: writable (its .pyc files written by an earlier run), and read-only
   (``PYTHONDONTWRITEBYTECODE=1``: nothing written, as on the README's ``:ro`` mount) without .pyc files (a copy
   without __pycache__: compiled at every start) and with the ones scripts/build.sh compiles
   (``compileall --invalidation-mode checked-hash``).
2. ``python -c "import sglang"``: wall clock without and with our directory, and, measured inside the process, the
   install step the first ``import sglang`` runs (importing the patch layer, NVML probe, version lookup, environment
   rows, the target finder) in a process where SGLang's own imports are done, i.e. the time SGLang's start does not
   already spend, in the same layouts, inactive (no SM12x GPU) and active (``DSV4_KERNEL_FORCE=1``). Skipped, with
   the reason, where SGLang does not import.

    python3 tools/startup_overhead.py [--n 40] [--sglang-n 10] [--build-dir build/dsv4] [--sglang-path DIR]

``--build-dir``: the directory users mount (default: this checkout's sitecustomize.py and package, laid out as
scripts/build.sh does). ``--sglang-path``: put on PYTHONPATH for the SGLang cases (default: the newest unpacked
.sglang/sglang-*, else the installed SGLang). Prints the tables; writes JSON to
benchmarks/results/startup_overhead.json (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUBS = os.path.join(ROOT, "tests", "stubs")   # torchvision stand-in where PyPI's does not load beside CPU torch
COMPILE_MODE = "checked-hash"                  # what scripts/build.sh passes to compileall
# the install step as the first `import sglang` runs it, timed where SGLang's own imports are done
INSTALL_STEP = """
import sys, time
sys.path.insert(0, {build!r})   # not on PYTHONPATH: the start-up hook must not run here
import sglang
t = time.perf_counter()
import deepseek_v4_kernel.patch as patch
patch.install(announce=False)
print("INSTALL_MS=%.3f" % ((time.perf_counter() - t) * 1e3))
"""


def lay_out(dest: str) -> str:
    """sitecustomize.py and the package as scripts/build.sh lays them out (no caches, no extension)."""
    os.makedirs(dest)
    shutil.copy(os.path.join(ROOT, "sitecustomize.py"), dest)
    shutil.copytree(os.path.join(ROOT, "deepseek_v4_kernel"), os.path.join(dest, "deepseek_v4_kernel"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_C*.so"))
    return dest


def copy_without_pyc(src: str, dest: str) -> str:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def compile_pyc(directory: str) -> str:
    """What scripts/build.sh does to the directory it builds."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-f", "-j0", "--invalidation-mode", COMPILE_MODE,
                    directory], check=True)
    return directory


def child_env(pythonpath, read_only=False, force=False) -> dict:
    drop = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_") and k not in drop}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    if read_only:   # as on a read-only mount: no .pyc written
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    if force:       # the layer active, as on an SM120 GPU
        env["DSV4_KERNEL_FORCE"] = "1"
    return env


def run_child(args, env) -> tuple:
    """(wall ms, stdout, stderr) of one fresh interpreter."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, *args], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    ms = (time.perf_counter() - t) * 1e3
    if r.returncode != 0:
        raise RuntimeError(f"{args} failed (PYTHONPATH={env.get('PYTHONPATH')}): {r.stderr[-2000:]}")
    return ms, r.stdout, r.stderr


def wall_ms(code):
    return lambda env: run_child(["-c", code], env)[0]


def sitecustomize_import_ms(env):
    """Cumulative import time of sitecustomize (0 where none is on the path)."""
    err = run_child(["-X", "importtime", "-c", "pass"], env)[2]
    m = re.search(r"import time:\s*\d+ \|\s*(\d+) \|\s*sitecustomize$", err, re.M)
    return int(m.group(1)) / 1e3 if m else 0.0


def install_step_ms(build):
    def measure(env):
        out = run_child(["-c", INSTALL_STEP.format(build=build)], env)[1]
        return float(re.search(r"INSTALL_MS=([\d.]+)", out).group(1))
    return measure


def measure(cases: dict, n: int) -> dict:
    """cases: name -> (measure(env) -> ms, env). One warm-up run each (page cache; .pyc where writable)."""
    for fn, env in cases.values():
        fn(env)
    samples = {name: [] for name in cases}
    for _ in range(n):
        for name, (fn, env) in cases.items():
            samples[name].append(fn(env))
    out = {}
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        out[name] = {"median_ms": statistics.median(xs), "p25_ms": q[0], "p75_ms": q[2], "n": len(xs)}
    return out


def newest_unpacked_sglang():
    base = os.path.join(ROOT, ".sglang")
    dirs = [os.path.join(base, d) for d in (os.listdir(base) if os.path.isdir(base) else ())
            if re.fullmatch(r"sglang-\d+\.\d+\.\d+", d) and os.path.isdir(os.path.join(base, d, "sglang"))]
    return max(dirs, key=lambda d: tuple(int(x) for x in d.rsplit("-", 1)[1].split("."))) if dirs else None


def table(title: str, results: dict, base: str) -> str:
    lines = [f"{title}", "", "| case | median ms | p25-p75 ms | added ms | runs |", "|---|---|---|---|---|"]
    for name, r in results.items():
        added = f"{r['median_ms'] - results[base]['median_ms']:+.1f}" if name.startswith("wall") and name != base \
            else ""
        lines.append(f"| {name} | {r['median_ms']:.2f} | {r['p25_ms']:.2f}-{r['p75_ms']:.2f} | {added} | {r['n']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="runs per `python -c pass` case (median)")
    ap.add_argument("--sglang-n", type=int, default=10, help="runs per `import sglang` case (0: skip them)")
    ap.add_argument("--build-dir", help="the directory users mount (default: laid out here from this checkout)")
    ap.add_argument("--sglang-path", help="a directory holding the package sglang (default: .sglang/, newest)")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "startup_overhead.json"))
    args = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="dsv4_startup_")
    skipped, sglang_results = None, {}
    try:
        src = args.build_dir or lay_out(os.path.join(work, "dsv4"))
        layouts = {   # name -> (directory, read-only)
            "writable, cached .pyc": (copy_without_pyc(src, os.path.join(work, "cached")), False),
            "read-only, no .pyc": (copy_without_pyc(src, os.path.join(work, "no_pyc")), True),
            "read-only, build.sh's .pyc": (compile_pyc(copy_without_pyc(src, os.path.join(work, "built"))), True),
        }
        cases = {"wall: python -c pass": (wall_ms("pass"), child_env([]))}
        for name, (d, ro) in layouts.items():
            cases[f"wall: python -c pass, ours {name}"] = (wall_ms("pass"), child_env([d], ro))
        for name, (d, ro) in layouts.items():
            cases[f"import of sitecustomize, {name}"] = (sitecustomize_import_ms, child_env([d], ro))
        pass_results = measure(cases, args.n)

        sglang_path = args.sglang_path or newest_unpacked_sglang()
        extra = [sglang_path] if sglang_path else []
        if os.path.isdir(STUBS) and subprocess.run([sys.executable, "-c", "import torchvision.io"],
                                                   capture_output=True).returncode != 0:
            extra.append(STUBS)
        if args.sglang_n > 0:
            probe = subprocess.run([sys.executable, "-c", "import sglang"], env=child_env(extra), capture_output=True,
                                   text=True, cwd=tempfile.gettempdir())
            if probe.returncode != 0:
                skipped = "SGLang does not import here: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
            else:
                cached = layouts["writable, cached .pyc"][0]
                cases = {"wall: python -c 'import sglang'": (wall_ms("import sglang"), child_env(extra)),
                         "wall: python -c 'import sglang', ours writable, cached .pyc":
                             (wall_ms("import sglang"), child_env([cached] + extra))}
                for name, (d, ro) in layouts.items():
                    cases[f"install step, {name}"] = (install_step_ms(d), child_env(extra, ro))
                cases["install step, writable, cached .pyc, active"] = (install_step_ms(cached),
                                                                        child_env(extra, force=True))
                sglang_results = measure(cases, args.sglang_n)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(table("python -c pass", pass_results, "wall: python -c pass"))
    print()
    if sglang_results:
        print(table("python -c 'import sglang'", sglang_results, "wall: python -c 'import sglang'"))
    else:
        print(f"import sglang: skipped ({skipped or '--sglang-n 0'})")
    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
           "build_dir": args.build_dir or "laid out from this checkout", "pyc_mode": COMPILE_MODE,
           "sglang_path": sglang_path, "sglang_skipped": skipped, "pass": pass_results, "import_sglang": sglang_results}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

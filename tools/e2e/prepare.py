"""The fetch and prepare stages of the end-to-end harness (run_e2e.py runs them): the bundle's parts carried into the
work dir, checked and unpacked; our library built; SGLang's Marlin MoE JIT module warmed; the model config written;
the copy bandwidth of the floors measured; the user bench run for -measured sessions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional

import model_config
import setups as st
from build_bundle import sha256_file  # the manifest's digests are build_bundle.py's
from sessions import parse_session

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(HERE, "bundle_manifest.json")
SESSION_START_BUDGET_S = 150  # the Marlin warm-up may run until this long before the call's deadline


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stage_fetch(work: str) -> None:
    src = os.path.join(REPO, ".e2e", "parts")
    dst = os.path.join(work, "parts")
    os.makedirs(dst, exist_ok=True)
    names = sorted(os.listdir(src)) if os.path.isdir(src) else []
    for name in names:
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    log(f"fetch: {len(names)} part(s) copied to {dst}: {' '.join(names) or '-'}; now there: "
        f"{' '.join(sorted(os.listdir(dst)))}")
    jit = os.path.join(REPO, ".e2e", "jit")  # prebuild_jit.py's modules, when carried
    if os.path.isdir(jit):
        shutil.copytree(jit, os.path.join(work, "jit"), dirs_exist_ok=True)
        log(f"fetch: prebuilt JIT modules: {' '.join(sorted(os.listdir(jit)))}")


def install_prebuilt_jit(work: str) -> None:
    """prebuild_jit.py's modules into the tvm-ffi cache, where SGLang's load_jit loads a .so without compiling."""
    src = os.path.join(work, "jit")
    if not os.path.isdir(src):
        return
    cache = os.path.expanduser(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"))
    shutil.copytree(src, cache, dirs_exist_ok=True)
    log(f"prepare: prebuilt JIT modules installed into {cache}: {' '.join(sorted(os.listdir(src)))}")


def unpack_group(work: str, group: str, record: dict) -> None:
    import lzma

    marker = os.path.join(work, f".unpacked-{group}")
    digest = "".join(p["sha256"] for p in record["parts"])
    if os.path.isfile(marker) and open(marker).read() == digest:
        log(f"prepare: {group} already unpacked")
        return
    paths = []
    for part in record["parts"]:
        path = os.path.join(work, "parts", part["file"])
        if not os.path.isfile(path):
            raise SystemExit(f"prepare: part {part['file']} of group {group} is missing in {work}/parts "
                             f"(carry it in a call with --stages fetch first)")
        if sha256_file(path) != part["sha256"]:
            raise SystemExit(f"prepare: {path} does not match the manifest's sha256 (expected {part['sha256']})")
        paths.append(path)
    dest = os.path.join(work, record["dest"])
    os.makedirs(dest, exist_ok=True)

    class Joined:  # the parts read as one stream
        def __init__(self, files):
            self.files, self.f = list(files), None

        def read(self, n=-1):
            while True:
                if self.f is None:
                    if not self.files:
                        return b""
                    self.f = open(self.files.pop(0), "rb")
                data = self.f.read(n)
                if data:
                    return data
                self.f.close()
                self.f = None

    t0 = time.time()
    with lzma.LZMAFile(Joined(paths)) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(dest, filter="tar")  # members carry plain paths and modes (build_bundle.py)
    # The tilelang group carries z3-solver's libz3 as <site>/z3/lib (libtilelang finds it there); without a Python
    # package it is a namespace package that `import z3` finds, and torch.compile (SGLang compiles its top-k
    # post-processing) then calls z3's missing API. An __init__ that raises ImportError keeps `import z3` failing
    # as on a machine without z3-solver; the library stays where libtilelang looks.
    z3_dir = os.path.join(dest, "z3")
    if os.path.isdir(z3_dir) and not os.path.isfile(os.path.join(z3_dir, "__init__.py")):
        with open(os.path.join(z3_dir, "__init__.py"), "w") as f:
            f.write("raise ImportError('z3-solver: only its library is bundled (for tilelang), not its Python API')\n")
    with open(marker, "w") as f:
        f.write(digest)
    log(f"prepare: {group} unpacked into {dest} ({time.time() - t0:.0f} s)")


WARM_DONE = "{w}/.warm-marlin"
WARM_MARLIN = ("import torch\n"
               "from sglang.kernels.ops.moe.moe_wna16_marlin import _jit_moe_wna16_marlin_module\n"
               "_jit_moe_wna16_marlin_module(torch.bfloat16, False, False)\n"
               "print('marlin MoE JIT module ready')\n")


def start_marlin_warmup(args, paths: st.Paths) -> Optional[subprocess.Popen]:
    """Compile SGLang's Marlin MoE JIT module (bf16, no EP, no bias: moe_wna16_marlin.py:139's arguments at TP without
    EP) in the background while our library builds; it lands in the tvm-ffi cache (TVM_FFI_CACHE_DIR or
    ~/.cache/tvm-ffi), which the servers of (a) and (c) then load instead of compiling at their first request."""
    if not os.path.isdir(os.path.join(paths.site, "sglang")):
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([paths.tf, paths.site]))
    os.makedirs(os.path.join(args.work, "logs"), exist_ok=True)
    out = open(os.path.join(args.work, "logs", "warm_marlin.log"), "w")
    log("prepare: compiling the Marlin MoE JIT module in the background")
    # its own session: a device call ends the processes it leaves, except those (the compile may outlast the call)
    proc = subprocess.Popen([sys.executable, "-c", WARM_MARLIN + f"open({WARM_DONE!r}.format(w={args.work!r}), 'w')"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=os.path.join(args.work, "logs"),
                            start_new_session=True)
    with open(os.path.join(args.work, ".warm-marlin.pid"), "w") as f:
        f.write(str(proc.pid))
    return proc


def marlin_warmup_running(work: str) -> bool:
    """A server of (a) or (c) started while the warm-up still compiles would compile the same module beside it."""
    try:
        pid = int(open(os.path.join(work, ".warm-marlin.pid")).read())
    except (OSError, ValueError):
        return False
    return os.path.exists(f"/proc/{pid}") and not os.path.isfile(WARM_DONE.format(w=work))


def stage_prepare(args, paths: st.Paths, sessions: List[str], deadline: float) -> None:
    with open(MANIFEST) as f:
        manifest = json.load(f)
    absent = []
    for group, record in manifest["groups"].items():
        parts_here = all(os.path.isfile(os.path.join(args.work, "parts", p["file"])) for p in record["parts"])
        if parts_here or os.path.isfile(os.path.join(args.work, f".unpacked-{group}")):
            unpack_group(args.work, group, record)
        else:
            absent.append(group)
    if absent:
        log(f"prepare: parts of {absent} not here yet (a later call carries them); the rest is unpacked")
    missing = [m for m in ("torch", "triton", "torchvision", "numpy", "safetensors", "aiohttp", "requests", "psutil")
               if subprocess.run([sys.executable, "-c", f"import importlib.util,sys; "
                                  f"sys.exit(importlib.util.find_spec('{m}') is None)"]).returncode]
    if missing:
        raise SystemExit(f"prepare: the machine lacks {missing}, which the bundle leaves to it (bundle_spec.py)")
    install_prebuilt_jit(args.work)
    warm = None
    if args.moe_c == "marlin" and any(s.split("-")[0] in ("a", "c") for s in sessions) and \
            not os.path.isfile(WARM_DONE.format(w=args.work)):
        warm = start_marlin_warmup(args, paths)
    if any(s.startswith("b-") for s in sessions):
        so = os.path.join(paths.dsv4, "deepseek_v4_kernel", "_C.so")
        if os.path.isfile(so) and not args.rebuild:
            log(f"prepare: our library already built in {paths.dsv4}")
        else:
            env = dict(os.environ, DSV4_KERNEL_EXTRA_ARCHS="90a", DSV4_BUILD_DIR=paths.dsv4)
            t0 = time.time()
            r = subprocess.run(["bash", os.path.join(REPO, "scripts", "build.sh")], env=env, cwd=REPO,
                               capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"prepare: scripts/build.sh failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            log(f"prepare: built our library into {paths.dsv4} ({time.time() - t0:.0f} s)")
    path = model_config.write_config(paths.model, layers=args.layers)
    log(f"prepare: model config {path} ({args.layers} layers)")
    measure_copy_bandwidth(args)
    if any(parse_session(s).measured for s in sessions):
        run_user_bench(args, paths)
    if warm is not None:
        try:
            rc = warm.wait(timeout=max(10.0, deadline - time.time() - SESSION_START_BUDGET_S))
            log(f"prepare: Marlin MoE JIT warm-up exited {rc} (logs/warm_marlin.log)")
        except subprocess.TimeoutExpired:
            log("prepare: Marlin MoE JIT warm-up still compiling; it goes on between calls while the machine is warm")


BANDWIDTH_FILE = "copy_bandwidth.json"
COPY_BANDWIDTH = """
import json, torch
from deepseek_v4_kernel.bench.timing import copy_bw
print(json.dumps({"bytes_per_s": copy_bw(), "gpu": torch.cuda.get_device_name(),
                  "method": "deepseek_v4_kernel.bench.timing.copy_bw: a 1 GiB torch device copy, read + write bytes "
                            "over the median of 10 CUDA-event timings"}))
"""


def measure_copy_bandwidth(args) -> Optional[dict]:
    """The floors' bandwidth, measured once per work dir before any server holds the GPU (a 1 GiB device copy)."""
    path = os.path.join(args.work, BANDWIDTH_FILE)
    if os.path.isfile(path) and not args.rerun:
        with open(path) as f:
            rec = json.load(f)
        log(f"prepare: copy bandwidth {rec['bytes_per_s'] / 1e12:.2f} TB/s (measured earlier)")
        return rec
    r = subprocess.run([sys.executable, "-c", COPY_BANDWIDTH], capture_output=True, text=True, timeout=180, cwd=REPO)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        log(f"prepare: copy bandwidth not measured (rc {r.returncode}): {r.stderr.strip()[-300:]}")
        return None
    rec = json.loads(lines[-1])
    rec["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "w") as f:
        json.dump(rec, f)
    log(f"prepare: copy bandwidth {rec['bytes_per_s'] / 1e12:.2f} TB/s ({rec['gpu']})")
    return rec


def copy_bandwidth(work: str) -> Optional[dict]:
    try:
        with open(os.path.join(work, BANDWIDTH_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None



# ------------------------------------------------------------------------------------------------- the user bench
MEASURED_DIR = "measured"   # <work>/measured: the bench file a -measured session's servers read (DSV4_KERNEL_MEASURED)


def measured_env(work: str) -> Dict[str, str]:
    return {"DSV4_KERNEL_PREFER": "measured", "DSV4_KERNEL_MEASURED": os.path.join(work, MEASURED_DIR)}


def run_user_bench(args, paths: st.Paths) -> None:
    """What a user does before DSV4_KERNEL_PREFER=measured: ``python -m deepseek_v4_kernel bench --tp N`` on the GPU,
    with the image's SGLang (the bundle) and our build on the path; its JSON lands in <work>/measured (once)."""
    d = os.path.join(args.work, MEASURED_DIR)
    os.makedirs(d, exist_ok=True)
    have = [f for f in os.listdir(d) if f.endswith(".json")]
    if have and not args.rerun:
        log(f"prepare: user bench file already there: {have}")
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([paths.tf, paths.dsv4, paths.site]), DSV4_KERNEL_FORCE="1",
               PYTHONUNBUFFERED="1", DSV4_KERNEL_MEASURED=d)
    os.makedirs(os.path.join(args.work, "logs"), exist_ok=True)
    t0 = time.time()
    with open(os.path.join(args.work, "logs", "user_bench.log"), "w") as out:
        r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "bench", "--tp", str(args.tp)], env=env,
                           stdout=out, stderr=subprocess.STDOUT, cwd=os.path.join(args.work, "logs"))
    have = [f for f in os.listdir(d) if f.endswith(".json")]
    if r.returncode or not have:
        raise SystemExit(f"prepare: the user bench failed (rc {r.returncode}, files {have}); logs/user_bench.log")
    log(f"prepare: user bench wrote {have} in {time.time() - t0:.0f} s")


def measured_file(work: str) -> Optional[dict]:
    d = os.path.join(work, MEASURED_DIR)
    files = sorted(f for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else []
    if not files:
        return None
    with open(os.path.join(d, files[-1])) as f:
        return {"file": files[-1], **json.load(f)}



"""The end-to-end harness on the GPU test machine: one script, stages chosen by arguments.

    python3 tools/e2e/run_e2e.py --stages prepare,run,report --sessions c-graphs,b-graphs,a-graphs --out "$OUT"

Stages (each call runs the stages it names, and ``report`` always writes what is known so far to --out):
* ``fetch``: copy the bundle parts carried in this call (``.e2e/parts/*``) to <work>/parts (parts arrive over
  several calls while the machine stays warm);
* ``prepare``: check every part against tools/e2e/bundle_manifest.json, unpack them (once), build our library into
  <work>/dsv4 (``DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh``, once), write the model config;
* ``run``: for each session (``<setup>-<graphs|eager>[-mtp]``, setups a/b/c of setups.py) start
  ``python3 -m sglang.launch_server`` with the setup's environment, send the correctness requests (16 prompts x 32
  greedy tokens, logprobs and top-2; then c-graphs' tokens scored teacher-forced), and in ``<setup>-graphs``
  sessions with --throughput the throughput table,
  with --profile the per-op profile of its decode step, then stop the server (its whole process group);
  ``--soak N`` runs a separate ``b-graphs-soak`` session;
* ``report``: compare the sessions' outputs, run the checks, write e2e.json, e2e_table.md, e2e_throughput.png
  (if matplotlib is there) and e2e_logs.tar.xz to --out.
Results of earlier calls stay in <work>/results, so the sessions can be spread over calls of at most 10 minutes: a
session with a result is not run again (unless --rerun), and servers that a call's deadline left running (they run in
their own process groups) are taken over by the next call's run stage. Up to --servers-at-once servers start
together, each with its KV pool capped (--max-total-tokens); their requests still run one session at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import model_config  # noqa: E402
from build_bundle import sha256_file  # noqa: E402  (the manifest's digests are build_bundle.py's)
import server as srv  # noqa: E402
import setups as st  # noqa: E402
import workloads as wl  # noqa: E402

MANIFEST = os.path.join(HERE, "bundle_manifest.json")
STAGES = ("fetch", "prepare", "run", "report")
DEFAULT_SESSIONS = "c-graphs,b-graphs,a-graphs,c-eager,b-eager,a-eager,c-graphs-mtp,b-graphs-mtp,b-graphs-measured"
SESSION_START_BUDGET_S = 150  # the Marlin warm-up may run until this long before the call's deadline


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------- fetch / prepare
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
    path = model_config.write_config(paths.model)
    log(f"prepare: model config {path}")
    if any(parse_session(s).measured for s in sessions):
        run_user_bench(args, paths)
    if warm is not None:
        try:
            rc = warm.wait(timeout=max(10.0, deadline - time.time() - SESSION_START_BUDGET_S))
            log(f"prepare: Marlin MoE JIT warm-up exited {rc} (logs/warm_marlin.log)")
        except subprocess.TimeoutExpired:
            log("prepare: Marlin MoE JIT warm-up still compiling; it goes on between calls while the machine is warm")


# ------------------------------------------------------------------------------------------------- run
class SessionSpec(NamedTuple):
    key: str           # setup a / b / c
    graphs: bool
    mtp: bool
    soak: bool
    measured: bool     # (b) with DSV4_KERNEL_PREFER=measured and the bench file of prepare (MEASURED_DIR)

    @property
    def timed(self) -> bool:
        """Whether the session takes its setup's throughput table and profile (one of each per setup)."""
        return self.graphs and not self.mtp and not self.measured


def parse_session(name: str) -> SessionSpec:
    parts = name.split("-")
    if len(parts) < 2 or parts[0] not in st.SETUP_KEYS or parts[1] not in ("graphs", "eager") or \
            any(p not in ("mtp", "soak", "measured") for p in parts[2:]):
        raise ValueError(f"session {name!r}: expected <a|b|c>-<graphs|eager>[-mtp][-soak][-measured]")
    if "measured" in parts[2:] and parts[0] != "b":
        raise ValueError(f"session {name!r}: -measured is a setting of our patch, so of setup b only")
    return SessionSpec(parts[0], parts[1] == "graphs", "mtp" in parts[2:], "soak" in parts[2:], "measured" in parts[2:])


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


# A block scale holds the same 2^e whichever of these the MoE method stores it in (dummy_weights._write_exponents
# draws the exponents alone): fp32 on the Triton runner, float8_e8m0fnu on the Marlin runner.
EXPONENT_DTYPES = ("float32", "float8_e8m0fnu", "uint8")


def weight_fingerprint(weight_dir: str) -> dict:
    """Per model: a digest of (name, shape, value encoding, fill rule) of every parameter the shim filled."""
    files = sorted(os.listdir(weight_dir)) if os.path.isdir(weight_dir) else []
    models = {}
    for name in files:
        with open(os.path.join(weight_dir, name)) as f:
            rec = json.load(f)
        rows = sorted((p["name"], tuple(p["shape"]),
                       "2^e" if p["rule"].startswith("block_scale") and p["dtype"] in EXPONENT_DTYPES else p["dtype"],
                       p["rule"]) for p in rec["parameters"])
        key = rec["model"]
        digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
        models.setdefault(key, {"fingerprint": digest, "parameters": len(rows), "rows": rows})
    return models


# Seconds a ready session's requests take at most (H200, 4-layer model): the harness leaves a server running for the
# next call rather than start measuring what it cannot finish before the call's deadline.
WORK_BUDGET_S = {"correctness": 120, "throughput": 120, "profile": 60, "soak": 300}


def session_work_s(args, name: str) -> float:
    spec = parse_session(name)
    if spec.soak:
        return WORK_BUDGET_S["soak"]
    need = WORK_BUDGET_S["correctness"]
    if spec.timed and args.throughput:
        need += WORK_BUDGET_S["throughput"]
    if spec.timed and args.profile:
        need += WORK_BUDGET_S["profile"]
    return need


def start_session(args, paths: st.Paths, setups: Dict[str, st.Setup], name: str, port: int) -> dict:
    """Start one session's server; returns its flight record (the partial result and the server's state)."""
    key, graphs, mtp, _, measured = parse_session(name)
    setup = setups[key]
    result: dict = {"session": name, "setup": key, "cuda_graphs": graphs, "mtp": mtp, "tp": args.tp,
                    "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    weight_log = os.path.join(args.work, "weights", name)
    shutil.rmtree(weight_log, ignore_errors=True)
    env = st.server_env(setup, paths, dict(os.environ), args.seed, weight_log)
    if measured:   # the patch decides per size class from the user bench's file (prepare ran it)
        env.update(measured_env(args.work))
        result["measured_file"] = measured_file(args.work)
    cmd = st.server_command(setup, paths, port=port, tp=args.tp, cuda_graphs=graphs, mtp=mtp, seed=args.seed,
                            max_total_tokens=args.max_total_tokens, python=sys.executable)
    result["command"] = " ".join(cmd)
    result["env"] = {k: v for k, v in env.items() if k.startswith(("DSV4_", "SGLANG_", "PYTHONPATH", "NCCL_"))}
    log_path = os.path.join(args.work, "logs", f"{name}.log")
    server = srv.Server(cmd, env, log_path, port, cwd=os.path.dirname(log_path))  # not the work dir: its folders would sit first on sys.path
    server.start()
    return {"result": result, "server": server, "weight_log": weight_log}


FORCED_REFERENCE = "c-graphs"   # whose greedy tokens every session scores teacher-forced


def reference_outputs(work: str, name: str, result: dict) -> Optional[List[dict]]:
    """The reference session's greedy outputs (this session's own when it is the reference), or None."""
    if name == FORCED_REFERENCE:
        return result.get("outputs")
    try:
        with open(os.path.join(work, "results", f"{FORCED_REFERENCE}.json")) as f:
            outputs = json.load(f).get("outputs")
    except (OSError, ValueError):
        return None
    return outputs if outputs and all(o.get("output_ids") for o in outputs) else None


def finish_session(args, flight: dict, deadline: float) -> dict:
    """Run a ready (or failed) session's requests, stop its server, collect its log; returns the session's result."""
    result, server = flight["result"], flight["server"]
    spec = parse_session(result["session"])
    mtp, soak, timed = spec.mtp, spec.soak, spec.timed
    name = result["session"]
    try:
        if "error" in flight:
            raise srv.ServerError(flight["error"])
        result["ready_s"] = server.ready_s
        result["started"] = True
        if soak:
            result["soak"] = wl.soak(server.url, server.pid, args.seed, args.soak, args.soak_concurrency,
                                     deadline=deadline - 20)
            s = result["soak"]
            log(f"{name}: soak {s['completed']}/{s['requests']} done, {s['failed']} failed, {s['wall_s']:.0f} s")
        else:
            prompts = wl.correctness_prompts(args.seed, args.prompts)
            t1 = time.time()
            try:
                result["outputs"] = wl.run_correctness(server.url, prompts, args.new_tokens)
            except srv.ServerError as e:
                if not mtp:
                    raise
                # speculative decoding may refuse logprobs: compare the tokens alone then
                result["logprob_error"] = str(e)[:500]
                result["outputs"] = wl.run_correctness(server.url, prompts, args.new_tokens, logprobs=False)
            result["correctness_s"] = time.time() - t1
            result["served"] = all(o["completion_tokens"] == args.new_tokens for o in result["outputs"])
            ref = reference_outputs(args.work, name, result)
            if ref is not None:   # the reference's tokens, scored by this setup: no divergence cuts it short
                result["forced"] = wl.run_forced(server.url, prompts, [o["output_ids"] for o in ref])
            log(f"{name}: {len(prompts)} prompts x {args.new_tokens} tokens in {result['correctness_s']:.1f} s "
                f"(served: {result['served']})")
            if timed and args.throughput:
                t1 = time.time()
                result["throughput"] = wl.throughput(server.url, args.seed, quick=args.quick)
                log(f"{name}: throughput in {time.time() - t1:.0f} s: " + summarize_throughput(result["throughput"]))
            if timed and args.profile:   # every setup: per-op time of a step, (a) / (b) / (c) side by side
                result["profile"] = wl.profile_decode(server.url, args.seed,
                                                      os.path.join(args.work, "profile", name))
                share = result["profile"].get("share", {})
                log(f"{name}: profile: " + (", ".join(f"{k} {v:.0%}" for k, v in share.items())
                                            or result["profile"].get("error", "?")))
    except Exception as e:  # noqa: BLE001 - the session's failure is a result, the next session still runs
        result["error"] = f"{type(e).__name__}: {e}"[:4000]
        result.setdefault("started", False)
        log(f"{name}: FAILED: {str(e).splitlines()[0][:300]}")
    finally:
        result["alive_at_end"] = server.alive()
        server.stop()
        result["wall_s"] = time.time() - server.started_at
    with open(server.log_path, errors="replace") as f:
        result["log"] = srv.parse_log(f.read())
    result["weights"] = {m: {k: v for k, v in rec.items() if k != "rows"}
                         for m, rec in weight_fingerprint(flight["weight_log"]).items()}
    return result


def summarize_throughput(t: dict) -> str:
    bits = [f"decode c{d['concurrency']} {d['aggregate_tok_s'] or 0:.0f} tok/s" for d in t.get("decode", [])]
    bits += [f"prefill {p['prompt_tokens'] // 1024}K {p['prefill_tok_s']:.0f} tok/s" for p in t.get("prefill", [])]
    if t.get("decode_64k_vs_2k"):
        bits.append(f"64K/2K decode {t['decode_64k_vs_2k']:.2f}")
    return ", ".join(bits)


def _state_path(work: str) -> str:
    return os.path.join(work, "servers.json")


def save_flights(work: str, flights: Dict[str, dict]) -> None:
    state = {name: {"result": f["result"], "server": f["server"].state(), "weight_log": f["weight_log"],
                    **({"error": f["error"]} if "error" in f else {})} for name, f in flights.items()}
    with open(_state_path(work), "w") as f:
        json.dump(state, f)


def adopt_flights(work: str, sessions: List[str]) -> Dict[str, dict]:
    """Servers an earlier call left running: those of the sessions asked for are taken over, the others stopped."""
    try:
        with open(_state_path(work)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    flights = {}
    for name, rec in state.items():
        server = srv.Server.adopt(rec["server"])
        if name not in sessions:
            log(f"{name}: left running by an earlier call but not asked for now: stopped")
            server.stop()
            continue
        flight = {"result": rec["result"], "server": server, "weight_log": rec["weight_log"]}
        if "error" in rec:
            flight["error"] = rec["error"]
        flights[name] = flight
        log(f"{name}: taken over from an earlier call (server started {time.time() - server.started_at:.0f} s ago, "
            f"{'alive' if server.alive() else 'gone'})")
    return flights


def stage_run(args, paths: st.Paths, sessions: List[str], deadline: float) -> None:
    """Sessions run in rounds of up to --servers-at-once servers: a round's servers start together (start-up is
    mostly compilation on the CPU, so they overlap), and once every one of them is ready or failed, each session's
    requests run alone, one session after another, so no measurement shares the GPU with another server's start-up
    or requests. Servers outlive the call: when the deadline comes first, they are left running and recorded, and
    the next call of the run stage takes them over."""
    setups = st.make_setups(args.moe_c)
    results_dir = os.path.join(args.work, "results")
    os.makedirs(results_dir, exist_ok=True)
    flights = adopt_flights(args.work, sessions)
    done = [n for n in sessions if n not in flights and os.path.isfile(os.path.join(results_dir, f"{n}.json"))]
    if done and not args.rerun:
        log(f"run: {', '.join(done)} already ran in an earlier call (results kept; --rerun runs them again)")
    queue = [name for name in sessions if name not in flights and (args.rerun or name not in done)]
    try:
        while queue or flights:
            while queue and len(flights) < args.servers_at_once and time.time() < deadline - 30:
                # sessions on the Marlin runner wait for its JIT warm-up; the others start meanwhile
                ready_to_start = [n for n in queue if not (n.split("-")[0] in ("a", "c") and args.moe_c == "marlin"
                                                           and marlin_warmup_running(args.work))]
                if not ready_to_start:
                    if flights:
                        break
                    time.sleep(2)
                    continue
                name = ready_to_start[0]
                queue.remove(name)
                port = args.port + sessions.index(name)
                log(f"{name}: starting on port {port} ({deadline - time.time():.0f} s left in this call)")
                flights[name] = start_session(args, paths, setups, name, port)
            if not flights:
                break
            # every server of the round ready or failed, or the call's end
            waiting = [n for n, f in flights.items() if "error" not in f and f["server"].ready_s is None]
            while waiting and time.time() < deadline - 15:
                for name in list(waiting):
                    server = flights[name]["server"]
                    try:
                        if server.poll_ready():
                            log(f"{name}: ready in {server.ready_s:.0f} s")
                            waiting.remove(name)
                        elif time.time() - server.started_at > args.startup_timeout_s:
                            raise srv.ServerError(f"server not ready after {args.startup_timeout_s:.0f} s; log tail:\n"
                                                  f"{server.log_tail()}")
                    except srv.ServerError as e:
                        flights[name]["error"] = str(e)
                        log(f"{name}: FAILED to start: {str(e).splitlines()[0][:300]}")
                        waiting.remove(name)
                if waiting:
                    time.sleep(2)
            if waiting:
                break
            for name in [n for n in sessions if n in flights]:
                need = 5 if "error" in flights[name] else session_work_s(args, name)
                if time.time() + need > deadline:
                    log(f"{name}: ready, but its requests need up to {need:.0f} s and "
                        f"{deadline - time.time():.0f} s are left in this call")
                    raise TimeoutError
                result = finish_session(args, flights.pop(name), deadline)
                with open(os.path.join(results_dir, f"{name}.json"), "w") as f:
                    json.dump(result, f)
                save_flights(args.work, flights)
    except TimeoutError:
        pass
    save_flights(args.work, flights)
    if flights or queue:
        log(f"run: call ends with {sorted(flights) or 'no'} server(s) left running (the next call's run stage takes "
            f"them over while the machine is warm) and {queue or 'no'} session(s) not started; run again with "
            f"--stages run,report --sessions {','.join(list(flights) + queue)}")


# ------------------------------------------------------------------------------------------------- report
def stage_report(args) -> None:
    import report

    results_dir = os.path.join(args.work, "results")
    sessions = {}
    for name in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
        with open(os.path.join(results_dir, name)) as f:
            rec = json.load(f)
        sessions[rec["session"]] = rec
    weights = {name: weight_fingerprint(os.path.join(args.work, "weights", name)) for name in sessions}
    doc = report.build(sessions, weights, st.make_setups(args.moe_c), margin=args.margin,
                       logprob_tol=args.logprob_tol, tp=args.tp, seed=args.seed,
                       config=model_config.make_config())
    doc["harness"]["servers_at_once"] = args.servers_at_once
    doc["harness"]["measurement"] = ("servers of a round start together; each session's requests run alone, the "
                                     "other servers of the round idle beside it on the same GPU")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(doc, f, indent=1)
    table = report.markdown(doc)
    with open(os.path.join(args.out, "e2e_table.md"), "w") as f:
        f.write(table)
    plot = report.plot(doc, os.path.join(args.out, "e2e_throughput.png"))
    logs_dir = os.path.join(args.work, "logs")
    if os.path.isdir(logs_dir):
        with tarfile.open(os.path.join(args.out, "e2e_logs.tar.xz"), "w:xz") as tar:
            tar.add(logs_dir, arcname="logs")
            if os.path.isdir(os.path.join(args.work, "weights")):
                tar.add(os.path.join(args.work, "weights"), arcname="weights")
    print(table)
    gating = [c for c in doc["checks"] if c.get("gating", True)]
    log(f"report: {len(sessions)} session(s); gating checks {sum(c['pass'] for c in gating)}/{len(gating)} passed "
        f"({len(doc['checks'])} rows); plot: {plot or 'not drawn'}; files in {args.out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="prepare,run,report", help=f"comma separated, of {', '.join(STAGES)}")
    ap.add_argument("--sessions", default=DEFAULT_SESSIONS, help="comma separated <a|b|c>-<graphs|eager>[-mtp]")
    ap.add_argument("--work", default="/tmp/e2e", help="work directory on the GPU machine (bundle, builds, results)")
    ap.add_argument("--out", default=os.environ.get("OUT", "e2e_out"), help="where the result files go ($OUT)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (GPUs per server)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the dummy weights and the prompts")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--margin", type=float, default=0.1, help="nats: (c)'s top-2 logprob gap under which a "
                    "different token is allowed")
    ap.add_argument("--logprob-tol", type=float, default=0.1, help="nats: chosen-token logprob agreement")
    ap.add_argument("--throughput", action="store_true", help="throughput table in the <setup>-graphs sessions")
    ap.add_argument("--profile", action="store_true",
                    help="per-op profile of each setup's decode step (graphs sessions)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats in the throughput stage")
    ap.add_argument("--soak", type=int, default=0, help="requests of the b-graphs-soak session (0: none)")
    ap.add_argument("--soak-concurrency", type=int, default=32)
    ap.add_argument("--moe-c", default="marlin", choices=("marlin", "flashinfer_mxfp4"),
                    help="MoE runner of the native setup (c)")
    ap.add_argument("--port", type=int, default=30100)
    ap.add_argument("--startup-timeout-s", type=float, default=900, help="a server not ready this long after its "
                    "start has failed (servers started together compile side by side)")
    ap.add_argument("--servers-at-once", type=int, default=3, help="servers started together in a round "
                    "(their requests still run one session at a time)")
    ap.add_argument("--max-total-tokens", type=int, default=262144, help="each server's KV pool cap in tokens "
                    "(servers share the GPU; the largest request set, the soak, holds under ~200K)")
    ap.add_argument("--deadline-s", type=float, default=570, help="stop starting sessions this long after launch "
                    "(a device call lasts at most 600 s)")
    ap.add_argument("--rebuild", action="store_true", help="build our library again")
    ap.add_argument("--rerun", action="store_true", help="run sessions again that have results from an earlier call")
    args = ap.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"--stages: unknown {bad}; expected some of {', '.join(STAGES)}")
    if args.tp < 1:
        ap.error(f"--tp must be >= 1, got {args.tp}")
    if args.servers_at_once < 1:
        ap.error(f"--servers-at-once must be >= 1, got {args.servers_at_once}")
    sessions = [s for s in args.sessions.split(",") if s]
    try:
        for s in sessions:
            parse_session(s)
    except ValueError as e:
        ap.error(f"--sessions: {e}")
    if args.soak > 0 and "b-graphs-soak" not in sessions:
        sessions.append("b-graphs-soak")
    if args.soak <= 0 and any(s.endswith("-soak") for s in sessions):
        ap.error("a -soak session needs --soak N (the number of requests, e.g. 2000)")
    deadline = time.time() + args.deadline_s
    args.work = os.path.abspath(args.work)
    paths = st.Paths(work=args.work, repo=REPO)
    os.makedirs(args.work, exist_ok=True)
    if "fetch" in stages:
        stage_fetch(args.work)
    if "prepare" in stages:
        stage_prepare(args, paths, sessions, deadline)
    if "run" in stages:
        stage_run(args, paths, sessions, deadline)
    if "report" in stages:
        stage_report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The end-to-end harness on the GPU test machine: one script, stages chosen by arguments.

    python3 tools/e2e/run_e2e.py --stages prepare,run,report --sessions a-graphs,c-graphs,b-graphs --profile --out "$OUT"

Stages (each call runs the stages it names, and ``report`` always writes what is known so far to --out):
* ``fetch``: copy the bundle parts carried in this call (``.e2e/parts/*``) to <work>/parts (parts arrive over
  several calls while the machine stays warm);
* ``prepare`` (prepare.py): check every part against tools/e2e/bundle_manifest.json, unpack them (once), build our
  library into <work>/dsv4 (``DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh``, once), write the model config
  (``--layers``), measure the copy bandwidth of the floors (once, before any server);
* ``run``: for each session (``<setup>-<graphs|eager>[-modifiers]``, sessions.py; setups a/b/c of setups.py) start
  ``python3 -m sglang.launch_server`` with the setup's environment and instruction class, send the correctness
  requests (--prompts prompts x 32 greedy tokens, logprobs and top-2; then c-graphs' tokens scored teacher-forced), and
  in ``<setup>-graphs`` sessions with --throughput the throughput table, with --profile the per-op profile of the
  decode step at 1 / 8 / 32 streams, then stop the server (its whole process group); ``--soak N`` runs a separate
  ``b-graphs-soak`` session;
* ``report``: compare the sessions' outputs, run the checks, add the profiles' floors, write e2e.json, e2e_table.md,
  e2e_throughput.png (if matplotlib is there) and e2e_logs.tar.xz to --out.
Results of earlier calls stay in <work>/results, so the sessions can be spread over calls of at most 10 minutes: a
session with a result is not run again (unless --rerun), and servers that a call's deadline left running (they run in
their own process groups) are taken over by the next call's run stage. Up to --servers-at-once servers start
together (auto: as many as fit the GPU's memory at this depth), each with its KV pool capped (--max-total-tokens);
their requests still run one session at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import model_config  # noqa: E402
import run_plan as rp  # noqa: E402
import server as srv  # noqa: E402
import setups as st  # noqa: E402
from prepare import (copy_bandwidth, marlin_warmup_running, measured_env, measured_file,  # noqa: E402,F401
                     stage_fetch, stage_prepare)
from sessions import parse_session  # noqa: E402
import workloads as wl  # noqa: E402

STAGES = ("fetch", "prepare", "run", "report")
DEFAULT_SESSIONS = "c-graphs,b-graphs,a-graphs,c-eager,b-eager,a-eager,c-graphs-mtp,b-graphs-mtp,b-graphs-measured"


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# A block scale holds the same 2^e whichever of these the MoE method stores it in (dummy_weights._write_exponents
# draws the exponents alone): fp32 on the Triton runner, float8_e8m0fnu on the Marlin runner.
EXPONENT_DTYPES = ("float32", "float8_e8m0fnu", "uint8")


def _logical_rows(p: dict) -> list:
    """The checkpoint-level rows of one filled parameter: a matrix filled as the dequantized FP8 draw (the shim's
    fp8_dequantized rule: bf16 where a setup dequantizes the checkpoint's FP8 at load) stands for the FP8 weight and
    block scales a setup that keeps it in FP8 fills under the same names, with the same values."""
    if p["rule"] == "fp8_dequantized":
        n, k = p["shape"]
        return [(p["name"], (n, k), "float8_e4m3fn", "fp8_weight"),
                (p["name"] + "_scale_inv", (-(-n // 128), -(-k // 128)), "2^e", "block_scale")]
    enc = "2^e" if p["rule"].startswith("block_scale") and p["dtype"] in EXPONENT_DTYPES else p["dtype"]
    return [(p["name"], tuple(p["shape"]), enc, p["rule"])]


def weight_fingerprint(weight_dir: str) -> dict:
    """Per model: a digest of (name, shape, value encoding, fill rule) of every parameter the shim filled, at the
    checkpoint's level (_logical_rows), so setups that build a parameter in another dtype from the same draw agree."""
    files = sorted(os.listdir(weight_dir)) if os.path.isdir(weight_dir) else []
    models = {}
    for name in files:
        with open(os.path.join(weight_dir, name)) as f:
            rec = json.load(f)
        rows = sorted(r for p in rec["parameters"] for r in _logical_rows(p))
        key = rec["model"]
        digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
        models.setdefault(key, {"fingerprint": digest, "parameters": len(rows), "rows": rows})
    return models


def session_work_s(args, name: str) -> float:
    """Seconds a ready session's requests take at most (run_plan.work_s at this call's depth and requests): the
    harness leaves a server running for the next call rather than start measuring what it cannot finish before the
    call's deadline."""
    spec = parse_session(name)
    lengths = [len(p) for p in wl.correctness_prompts(args.seed, args.prompts)]
    return rp.work_s(spec.key, args.layers, correctness_lengths=lengths, new_tokens=args.new_tokens,
                     throughput=args.throughput, profile=args.profile, soak=spec.soak, timed=spec.timed,
                     profile_concurrencies=args.profile_concurrencies, profile_prompt_tokens=args.profile_prompt_tokens,
                     profile_window_s=args.profile_window_s)


DEFAULT_CACHE = "kernel-cache-default"   # <work>/<this>: DSV4_KERNEL_CACHE_DIR of the -default sessions


def start_session(args, paths: st.Paths, setups: Dict[str, st.Setup], name: str, port: int) -> dict:
    """Start one session's server; returns its flight record (the partial result and the server's state)."""
    spec = parse_session(name)
    setup = st.default_variant(setups[spec.key]) if spec.default else setups[spec.key]
    cls = st.instruction_class(setup, spec.native)
    result: dict = {"session": name, "setup": spec.key, "cuda_graphs": spec.graphs, "mtp": spec.mtp, "tp": args.tp,
                    "instruction_class": cls, "layers": args.layers, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    weight_log = os.path.join(args.work, "weights", name)
    shutil.rmtree(weight_log, ignore_errors=True)
    env = st.server_env(setup, paths, dict(os.environ), args.seed, weight_log, native=spec.native)
    if spec.measured:   # the patch decides per size class from the user bench's file (prepare ran it)
        env.update(measured_env(args.work))
        result["measured_file"] = measured_file(args.work)
    if spec.default:    # first start: an empty cache directory; the restart reuses what the first start left there
        cache = os.path.join(args.work, DEFAULT_CACHE)
        if not spec.restart:
            shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache, exist_ok=True)
        env["DSV4_KERNEL_CACHE_DIR"] = cache
        result["kernel_cache"] = {"dir": cache, "files_at_start": sorted(os.listdir(cache))}
    cmd = st.server_command(setup, paths, port=port, tp=args.tp, cuda_graphs=spec.graphs, mtp=spec.mtp,
                            seed=args.seed, max_total_tokens=args.max_total_tokens, mem_fraction=args.mem_fraction,
                            python=sys.executable)
    result["command"] = " ".join(cmd)
    result["env"] = {k: v for k, v in env.items()
                     if k.startswith(("DSV4_", "SGLANG_", "PYTHONPATH", "NCCL_")) or k in st.CLASS_VARIABLES}
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
            if timed and args.profile:   # every setup: per-op time of a step at 1 / 8 / 32 streams, side by side
                t1 = time.time()
                result["profile"] = wl.profile_concurrencies(
                    server.url, args.seed, os.path.join(args.work, "profile", name), args.profile_concurrencies,
                    steps=args.profile_steps, prompt_tokens=args.profile_prompt_tokens, window_s=args.profile_window_s)
                for conc, p in result["profile"].items():
                    frac = p.get("gpu_busy_fraction")
                    log(f"{name}: profile c{conc}: " + (f"{p['wall_us_per_step']:.0f} us/step, GPU busy "
                                                        f"{p['gpu_busy_us_per_step']:.0f} us ({frac:.0%})"
                                                        if frac is not None else p.get("error", "?")))
                log(f"{name}: profiles in {time.time() - t1:.0f} s")
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
    setups = st.make_setups(args.moe_c, args.setup_args, args.setup_env)
    results_dir = os.path.join(args.work, "results")
    os.makedirs(results_dir, exist_ok=True)
    flights = adopt_flights(args.work, sessions)
    done = [n for n in sessions if n not in flights and os.path.isfile(os.path.join(results_dir, f"{n}.json"))]
    if done and not args.rerun:
        log(f"run: {', '.join(done)} already ran in an earlier call (results kept; --rerun runs them again)")
    queue = [name for name in sessions if name not in flights and (args.rerun or name not in done)]
    skipped: List[str] = []
    try:
        while queue or flights:
            while queue and len(flights) < args.servers_at_once and time.time() < deadline - 30:
                # sessions on the Marlin runner wait for its JIT warm-up; the others start meanwhile
                # a -restart session starts once its first start is over (it reuses that start's cache)
                ready_to_start = [n for n in queue if not (n.split("-")[0] in ("a", "c") and args.moe_c == "marlin"
                                                           and marlin_warmup_running(args.work))
                                  and parse_session(n).base not in queue and parse_session(n).base not in flights]
                if args.start_only_what_fits:
                    late = [n for n in ready_to_start if time.time() + expected_startup_s(args, setups, n)
                            + session_work_s(args, n) > deadline]
                    for n in late:
                        log(f"{n}: not started: start-up (~{expected_startup_s(args, setups, n):.0f} s) and requests "
                            f"(~{session_work_s(args, n):.0f} s) do not fit the {deadline - time.time():.0f} s left")
                        queue.remove(n)
                        skipped.append(n)
                    ready_to_start = [n for n in ready_to_start if n not in late]
                if not ready_to_start:
                    if flights or not queue:
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
                            mark_class_warm(args, setups, name)
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
            # the teacher-forced reference first: the round's other sessions score its tokens
            for name in sorted((n for n in sessions if n in flights), key=lambda n: n != FORCED_REFERENCE):
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
    queue += skipped
    if flights or queue:
        log(f"run: call ends with {sorted(flights) or 'no'} server(s) left running (the next call's run stage takes "
            f"them over while the machine is warm) and {queue or 'no'} session(s) not started; run again with "
            f"--stages run,report --sessions {','.join(list(flights) + queue)}")


def _class_of(setups: Dict[str, st.Setup], name: str) -> str:
    spec = parse_session(name)
    return st.instruction_class(setups[spec.key], spec.native)


def mark_class_warm(args, setups: Dict[str, st.Setup], name: str) -> None:
    """A server of this instruction class became ready: its kernel caches hold what the next server needs most."""
    d = os.path.join(args.work, "cache", _class_of(setups, name))
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, ".warm"), "w").close()


def expected_startup_s(args, setups: Dict[str, st.Setup], name: str) -> float:
    warm = os.path.isfile(os.path.join(args.work, "cache", _class_of(setups, name), ".warm"))
    return rp.STARTUP_S["warm" if warm else "cold"]


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
    doc = report.build(sessions, weights, st.make_setups(args.moe_c, args.setup_args, args.setup_env),
                       margin=args.margin, logprob_tol=args.logprob_tol, tp=args.tp, seed=args.seed,
                       config=model_config.make_config(layers=args.layers), bandwidth=copy_bandwidth(args.work))
    doc["harness"]["servers_at_once"] = args.servers_at_once
    doc["harness"]["plan"] = args.plan
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


def st_mem_fraction(n: int, biggest_gib: float) -> float:
    import step_model

    return step_model.mem_fraction_static(n, biggest_gib)


def parse_setup_extras(arg_items: List[str], env_items: List[str]):
    """--setup-arg KEY=ARGS and --setup-env KEY:NAME=VALUE into setups.make_setups' extra_args / extra_env."""
    import shlex

    extra_args: Dict[str, List[str]] = {}
    extra_env: Dict[str, Dict[str, str]] = {}
    for item in arg_items:
        key, sep, rest = item.partition("=")
        if not sep or key not in st.SETUP_KEYS:
            raise ValueError(f"--setup-arg {item!r}: expected KEY=ARGS with KEY one of {st.SETUP_KEYS}")
        extra_args.setdefault(key, []).extend(shlex.split(rest))
    for item in env_items:
        key, sep, rest = item.partition(":")
        name, eq, value = rest.partition("=")
        if not sep or key not in st.SETUP_KEYS or not eq or not name:
            raise ValueError(f"--setup-env {item!r}: expected KEY:NAME=VALUE with KEY one of {st.SETUP_KEYS}")
        extra_env.setdefault(key, {})[name] = value
    return extra_args, extra_env


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
    ap.add_argument("--servers-at-once", default="auto", help="servers started together in a round (their "
                    "requests still run one session at a time); auto: as many as fit the GPU's memory "
                    "(run_plan.servers_per_round, from the config)")
    ap.add_argument("--mem-fraction-static", default="auto", help="SGLang's --mem-fraction-static; auto: from the "
                    "round's size and the servers' memory (step_model.mem_fraction_static)")
    ap.add_argument("--layers", type=int, default=model_config.DEFAULT_LAYERS,
                    help="model depth (the layer-kind pattern 0/4/128/4 repeated to it)")
    ap.add_argument("--profile-concurrencies", default="1,8,32", help="decode streams of each profiled batch")
    ap.add_argument("--profile-steps", type=int, default=20, help="scheduler steps in each profile")
    ap.add_argument("--profile-window-s", type=float, default=1.0,
                    help="unprofiled window before each profile (the step's wall time from the streams' token rate)")
    ap.add_argument("--profile-prompt-tokens", type=int, default=2048, help="prompt length of the profiled streams")
    ap.add_argument("--setup-arg", action="append", default=[], metavar="KEY=ARGS",
                    help="extra server arguments of setup KEY (a, b or c), shell-split; repeatable")
    ap.add_argument("--setup-env", action="append", default=[], metavar="KEY:NAME=VALUE",
                    help="an extra environment variable of setup KEY's servers; repeatable")
    ap.add_argument("--start-only-what-fits", action="store_true", help="start a session only if its expected "
                    "start-up (run_plan.STARTUP_S) and requests fit before the deadline (a plan without later calls)")
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
    try:
        args.profile_concurrencies = [int(x) for x in args.profile_concurrencies.split(",") if x.strip()]
        args.setup_args, args.setup_env = parse_setup_extras(args.setup_arg, args.setup_env)
    except ValueError as e:
        ap.error(str(e))
    if args.layers < 4:
        ap.error(f"--layers must be >= 4 (every layer kind: compress ratios 0/4/128 and a learned-gate layer after "
                 f"the {model_config.DEFAULT_HASH_LAYERS} hash-routed ones), got {args.layers}")
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
    config = model_config.make_config(layers=args.layers)
    args.plan = rp.servers_per_round(config, model_config.make_config(), {parse_session(s).key for s in sessions},
                                     args.tp)
    try:
        args.servers_at_once = args.plan["servers_at_once"] if args.servers_at_once == "auto" \
            else int(args.servers_at_once)
        if args.servers_at_once < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--servers-at-once must be auto or >= 1, got {args.servers_at_once}")
    biggest = max(args.plan["server_gib"].values())
    args.mem_fraction = (st_mem_fraction(args.servers_at_once, biggest) if args.mem_fraction_static == "auto"
                         else float(args.mem_fraction_static))
    args.plan.update(servers_at_once=args.servers_at_once, mem_fraction_static=args.mem_fraction, layers=args.layers)
    log(f"plan: {args.layers} layers, {args.servers_at_once} server(s) at once (each <= {biggest:.0f} GiB of "
        f"{args.plan['gpu_gib']:.0f}), --mem-fraction-static {args.mem_fraction}")
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

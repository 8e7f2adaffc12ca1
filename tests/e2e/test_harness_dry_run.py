"""The GPU-run script end to end on the CPU, against a stand-in ``sglang.launch_server`` that answers SGLang's HTTP
API (/health, /generate with logprobs and streaming, /start_profile): sessions start and stop as process groups, the
shim runs in the server process, results, comparisons, checks, table and logs come out."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import e2e_env  # noqa: F401
from e2e_env import ROOT

FAKE_SERVER = textwrap.dedent('''
    import argparse, json, os, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    # a second process that imports SGLang, as its scheduler is (same process group)
    subprocess.Popen([sys.executable, "-c", "import sglang.srt, time; time.sleep(3600)"])
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--moe-runner-backend")
    args, _ = ap.parse_known_args()
    time.sleep(float(os.environ.get("FAKE_STARTUP_S", "0")))  # model load and graph capture
    if os.environ.get("DSV4_KERNEL_CACHE_DIR"):   # what a first start leaves for the next (issue 62's dispatch)
        open(os.path.join(os.environ["DSV4_KERNEL_CACHE_DIR"], "dispatch.json"), "a").close()
    # what the real server's model loader would call (the shim replaces it)
    import sglang.srt.model_loader.weight_utils as wu
    print("weights initialiser:", wu.initialize_dummy_weights.__name__, file=sys.stderr, flush=True)
    SHIFT = int(os.environ.get("FAKE_TOKEN_SHIFT", "0")) if args.moe_runner_backend == "triton" else 0

    def tokens(ids, n):
        return [(sum(ids) + 7 * i + (SHIFT if i == 3 else 0)) % 1000 + 2 for i in range(n)]

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, body, ctype="application/json"):
            self.send_response(code); self.send_header("Content-Type", ctype); self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._send(200 if self.path == "/health" else 404, b"{}")
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/start_profile":
                # five CUDA-graph replays 200 us apart: per step 30 us of MoE and 70 us of sparse MLA
                d = req["output_dir"]; os.makedirs(d, exist_ok=True)
                ev = []
                for i in range(5):
                    t, corr = 1000.0 + 200.0 * i, 7 + i
                    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t - 5, "dur": 2,
                               "args": {"correlation": corr}})
                    ev.append({"ph": "X", "cat": "kernel", "name": "fp4_moe_gemm", "ts": t, "dur": 30,
                               "args": {"correlation": corr}})
                    ev.append({"ph": "X", "cat": "kernel", "name": "sparse_decode_mma", "ts": t + 30, "dur": 70,
                               "args": {"correlation": corr}})
                with open(os.path.join(d, "1-TP-0.trace.json"), "w") as f:
                    json.dump({"traceEvents": ev, "request": req}, f)
                return self._send(200, b"ok")
            n = req["sampling_params"]["max_new_tokens"]
            out = tokens(req["input_ids"], n)
            meta = {"completion_tokens": n, "prompt_tokens": len(req["input_ids"])}
            start = req.get("logprob_start_len", -1)
            if req.get("return_logprob") and start >= 0:   # teacher-forced scoring of the input from `start` on
                scored = req["input_ids"][start:]
                meta["input_token_logprobs"] = [[-0.5 - (0.01 * SHIFT if i == 2 else 0), t, None]
                                                for i, t in enumerate(scored)]
                meta["input_top_logprobs"] = [[[-0.5, t, None], [-2.5, t + 1, None]] for t in scored]
            if req.get("return_logprob"):
                meta["output_token_logprobs"] = [[-0.5, t, None] for t in out]
                meta["output_top_logprobs"] = [[[-0.5, t, None], [-2.5, t + 1, None]] for t in out]
            if not req.get("stream"):
                return self._send(200, json.dumps({"output_ids": out, "meta_info": meta}).encode())
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            for k in range(1, n + 1):
                chunk = {"output_ids": out[:k], "meta_info": {"completion_tokens": k}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n"); self.wfile.flush()
                time.sleep(0.001)
            self.wfile.write(b"data: [DONE]\\n\\n")

    ThreadingHTTPServer.request_queue_size = 256  # 32 streams connect at once
    ThreadingHTTPServer(("127.0.0.1", args.port), H).serve_forever()
''')


def _fake_bundle(work):
    site = os.path.join(work, "site", "sglang")
    os.makedirs(os.path.join(site, "srt", "model_loader"))
    for pkg in ("", "srt", os.path.join("srt", "model_loader")):
        open(os.path.join(site, pkg, "__init__.py"), "w").close()
    with open(os.path.join(site, "srt", "model_loader", "weight_utils.py"), "w") as f:
        f.write("def initialize_dummy_weights(model, low=-1e-3, high=1e-3, seed=1234):\n    pass\n")
    with open(os.path.join(site, "launch_server.py"), "w") as f:
        f.write(FAKE_SERVER)
    os.makedirs(os.path.join(work, "tf"))


def _run(work, out, *extra, env=None):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "e2e", "run_e2e.py"), "--stages", "run,report",
           "--work", str(work), "--out", str(out), "--quick", "--port", "30900", "--profile-window-s", "0.3", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, **(env or {})))


def test_dry_run_produces_results_and_checks(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r = _run(work, out, "--sessions", "c-graphs,b-graphs,a-eager", "--throughput", "--profile", "--soak", "12",
             "--soak-concurrency", "4")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.load(open(out / "e2e.json"))
    assert set(doc["sessions"]) == {"c-graphs", "b-graphs", "a-eager", "b-graphs-soak"}
    b = doc["sessions"]["b-graphs"]
    assert b["started"] and b["served"] and b["throughput"]["decode"][2]["concurrency"] == 32
    assert doc["profile_b"]["share"] == {"sparse_mla": 0.7, "moe_experts": 0.3}
    # every graphs session is profiled at 1 / 8 / 32 streams: per-op time per step side by side, with floors (the
    # stand-in's trace: 4 whole steps between 5 graph replays, 30 + 70 us of kernels in each)
    assert set(doc["profiles"]) == {"b", "c"}
    for key in ("b", "c"):
        assert set(doc["profiles"][key]) == {"1", "8", "32"}
        for conc, p in doc["profiles"][key].items():
            assert p["concurrency"] == int(conc) and p["steps"] == 4 and p["step_method"] == "graph replays"
            assert p["us_per_step"] == {"moe_experts": 30.0, "sparse_mla": 70.0}
            assert p["gpu_busy_us_per_step"] == 100.0 and p["trace_us_per_step"] == 200.0
            assert p["wall_us_per_step"] > 0 and p["decode_tok_s"] > 0
            fl = p["floors"]
            assert fl["moe_experts"]["bytes"] > 0 and fl["moe_experts"]["us"] == 30.0
            assert fl["fp8_linear"]["us"] is None and fl["fp8_linear"]["bytes"] > 0   # nothing ran: no % of floor
    req = json.load(open(work / "profile" / "b-graphs" / "c8" / "1-TP-0.trace.json"))["request"]
    assert req["num_steps"] == 20 and req["activities"] == ["CPU", "GPU"] and req["with_stack"] is False
    fr = doc["gpu_fraction"]["b"]
    assert fr["fraction"] == pytest.approx(100.0 / fr["wall_us_per_step"]) and fr["layers"] == 12
    assert fr["fraction_in_trace"] == 0.5
    table = open(out / "e2e_table.md").read()
    assert "## Decode step per op" in table and "### 32 streams" in table and "| one stream |" in table
    rows = {r["setup"]: r for r in doc["throughput"]}
    assert rows["b"]["decode_c32_tok_s"]   # the throughput table ran (--throughput) for b
    # every session scored c-graphs' tokens teacher-forced (16 prompts x 32 tokens)
    forced = {f["candidate"]: f for f in doc["forced"]}
    assert set(forced) == {"b-graphs", "a-eager"}
    assert forced["b-graphs"]["positions"] == 16 * 32 and forced["b-graphs"]["median_logprob_diff"] == 0
    assert doc["sessions"]["b-graphs-soak"]["soak"]["completed"] == 12
    checks = {c["name"]: c["pass"] for c in doc["checks"]}
    assert checks["b-graphs agrees with c-graphs"] and checks["c-graphs: starts and serves"]
    assert checks["b-graphs: SM120 view in every SGLang process"]
    assert checks["c-graphs: native paths (no SM120 view)"]
    # the stand-in has no patch layer and loads no model: these must fail, not pass by default
    assert not checks["b-graphs: our start-up line in every SGLang process"]
    assert not checks["b-graphs: seeded dummy weights in each of the 1 TP worker(s)"]
    assert (out / "e2e_logs.tar.xz").is_file() and "## Checks" in open(out / "e2e_table.md").read()
    logs = open(work / "logs" / "b-graphs.log").read()
    assert "weights initialiser: seeded_dummy_weights" in logs and "SM120 view of SGLang" in logs


def test_dry_run_catches_a_token_difference(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r = _run(work, out, "--sessions", "c-eager,b-eager", env={"FAKE_TOKEN_SHIFT": "5"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    checks = {c["name"]: c for c in json.load(open(out / "e2e.json"))["checks"]}
    assert not checks["b-eager agrees with c-eager"]["pass"]
    assert "16 clear differences" in checks["b-eager agrees with c-eager"]["detail"]


def test_servers_start_together_and_measure_alone(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r = _run(work, out, "--sessions", "c-eager,b-eager,a-eager", "--servers-at-once", "3",
             env={"FAKE_STARTUP_S": "3"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if ": starting on port" in line]
    served = [i for i, line in enumerate(lines) if "prompts x 32 tokens" in line]
    assert len(starts) == 3 and len(served) == 3 and max(starts) < min(served), r.stdout
    doc = json.load(open(out / "e2e.json"))
    assert all(doc["sessions"][n]["served"] for n in ("c-eager", "b-eager", "a-eager"))
    assert "--max-total-tokens" in doc["sessions"]["b-eager"]["command"]


def test_a_later_call_takes_over_servers_left_running(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    # ready at once, but the requests' budget (run_plan.work_s: a 40-layer model prefills slowly) does not fit the
    # 40 s call: both servers are left running
    r1 = _run(work, out, "--sessions", "c-eager,b-eager", "--deadline-s", "40", "--layers", "40",
              "--servers-at-once", "2")
    assert r1.returncode == 0, r1.stdout[-3000:] + r1.stderr[-3000:]
    assert "left running" in r1.stdout and not os.path.exists(work / "results" / "b-eager.json")
    state = json.load(open(work / "servers.json"))
    assert set(state) == {"c-eager", "b-eager"}
    r2 = _run(work, out, "--sessions", "c-eager,b-eager")  # (no result yet: both run now)
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert r2.stdout.count("taken over from an earlier call") == 2
    doc = json.load(open(out / "e2e.json"))
    checks = {c["name"]: c["pass"] for c in doc["checks"]}
    assert checks["b-eager agrees with c-eager"] and checks["b-eager: starts and serves"]
    assert json.load(open(work / "servers.json")) == {}
    for rec in state.values():  # the servers were stopped after their requests
        assert not os.path.exists(f"/proc/{rec['server']['pid']}")


def test_sessions_with_results_are_not_run_again(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r1 = _run(work, out, "--sessions", "c-eager")
    assert r1.returncode == 0 and "c-eager: starting" in r1.stdout, r1.stdout[-3000:] + r1.stderr[-3000:]
    r2 = _run(work, out, "--sessions", "c-eager,b-eager")
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert "c-eager already ran in an earlier call" in r2.stdout and "c-eager: starting" not in r2.stdout
    assert "b-eager: starting" in r2.stdout
    assert set(json.load(open(out / "e2e.json"))["sessions"]) == {"c-eager", "b-eager"}


def test_default_sessions_start_one_after_the_other_on_one_cache(tmp_path):
    """b-graphs-default and its restart: no MoE runner flag, a fresh kernel cache for the first start, the same cache
    for the second, which starts only once the first is over; rows for both in the checks (information)."""
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r = _run(work, out, "--sessions", "b-graphs-default-restart,b-graphs-default", "--servers-at-once", "2",
             "--prompts", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    first_done = next(i for i, ln in enumerate(lines) if "b-graphs-default: 2 prompts" in ln)
    second_start = next(i for i, ln in enumerate(lines) if "b-graphs-default-restart: starting" in ln)
    assert second_start > first_done, r.stdout
    doc = json.load(open(out / "e2e.json"))
    first, second = doc["sessions"]["b-graphs-default"], doc["sessions"]["b-graphs-default-restart"]
    assert "--moe-runner-backend" not in first["command"] and "--fp8-gemm-backend triton" in first["command"]
    assert "DSV4_KERNEL_PREFER" not in first["env"]
    assert first["env"]["DSV4_KERNEL_CACHE_DIR"] == second["env"]["DSV4_KERNEL_CACHE_DIR"]
    assert first["kernel_cache"]["files_at_start"] == [] and second["kernel_cache"]["files_at_start"] == ["dispatch.json"]
    names = {c["name"] for c in doc["checks"]}
    assert "b-graphs-default-restart: start-up with default settings (second start)" in names


def test_only_what_fits_is_started(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _fake_bundle(str(work))
    r = _run(work, out, "--sessions", "c-eager", "--deadline-s", "60", "--start-only-what-fits")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "c-eager: not started: start-up (~300 s)" in r.stdout and "c-eager: starting" not in r.stdout

"""Measured dispatch (the default): the cache key, the file lock between TP workers, stale entries, read-only cache
directories, failing or wrong candidates, the start-up line, the doctor's lines, the `cache` command and the
DSV4_KERNEL_PREFER values (patch/decisions.py, patch/measured.py, bench/startup.py, cache_cli.py). The GPU side is
tools/gpu_measured.sh's."""

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from sglang_env import ROOT, run_child, sglang_dir

from deepseek_v4_kernel.errors import KeepOriginal
from deepseek_v4_kernel.patch import decisions, measured, policy
from deepseek_v4_kernel.switches import InvalidSwitch

GPU = policy.DeviceInfo([(12, 0)], ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"], "nvml", driver="580.95.05",
                        cores=[24064])


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """NVML answering as an RTX PRO 6000, DSV4_KERNEL_CACHE_DIR = a fresh directory, no decisions active."""
    monkeypatch.setattr(policy, "device_info", lambda: GPU)
    monkeypatch.setenv(decisions.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(decisions, "_fallback_dir", lambda: str(tmp_path / "fallback"))
    monkeypatch.delenv(policy.PREFER, raising=False)
    monkeypatch.delenv(measured.PATH_ENV, raising=False)
    decisions._set_active(None)
    measured._reset_for_tests()
    yield tmp_path
    decisions._set_active(None)
    measured._reset_for_tests()


def _decision(winner, ours=None, sglang=12.0, runnable=True, name="sglang-0.5.23 tilelang_fp8_paged_mqa_logits"):
    ours = ours if ours is not None else (10.0 if winner == "ours" else 14.0)
    return {"winner": winner, "ours_us": ours, "sglang": name, "sglang_us": sglang if runnable else None,
            "handback_runnable": runnable, "ratio": None, "rows": 1}


def _measure_fn(calls, verdicts):
    """A stand-in for the GPU timing: records what it was asked, decides as ``verdicts`` says."""
    def measure(todo):
        calls.append({op: list(v) for op, v in todo.items()})
        return {op: {"classes": {lb: verdicts.get((op, lb), _decision("ours")) for lb in labels}}
                for op, labels in todo.items()}
    return measure


WANTED = {"indexer_logits": ["b1", "b2-8", "b9+"], "hc_prenorm": ["m1", "m2-8"]}


# ----------------------------------------------------------------------------- the key
def test_every_key_component_changes_the_file(cache, monkeypatch):
    key = decisions.environment_key(0)
    assert set(decisions.KEY_FIELDS) <= set(key)
    assert key["gpu"] == GPU.names[0] and key["cuda_cores"] == 24064 and key["driver"] == "580.95.05"
    assert key["capability"] == "sm_120"
    seen = {decisions.file_name(key)}
    for k in decisions.KEY_FIELDS:
        changed = dict(key, **{k: f"other-{key.get(k)}"})
        name = decisions.file_name(changed)
        assert name not in seen, k
        seen.add(name)
        assert decisions.key_difference(key, changed) == f"{k} {key.get(k)} -> other-{key.get(k)}"


def test_the_build_digest_follows_the_package_files(cache):
    before = decisions.build_digest()
    path = os.path.join(ROOT, "deepseek_v4_kernel", "patch", "decisions.py")
    st = os.stat(path)
    try:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert decisions.build_digest() != before
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert decisions.build_digest() == before


def test_the_key_reads_versions_from_package_metadata(cache, monkeypatch):
    versions = {"sglang": "0.5.23", "flashinfer-python": "0.6.15", "sgl-deep-gemm": "0.1.5.post1", "triton": "3.6.0"}
    monkeypatch.setattr(decisions, "_dist_version", lambda names: next((versions[n] for n in names if n in versions),
                                                                       None))
    key = decisions.environment_key(0)
    assert (key["sglang"], key["flashinfer"], key["deep_gemm"], key["triton"]) == ("0.5.23", "0.6.15",
                                                                                   "0.1.5.post1", "3.6.0")


# ----------------------------------------------------------------------------- first start, later starts, stale
def test_first_start_measures_later_start_reads(cache):
    calls = []
    a = decisions.ensure(4, WANTED, _measure_fn(calls, {("indexer_logits", "b1"): _decision("sglang")}))
    assert calls == [WANTED] and a.source == "measured" and a.measured_count == 5 and a.read_count == 0
    assert os.path.dirname(a.path) == str(cache / "cache") and os.path.exists(a.path)
    assert f"5 measured here and written to {a.path}" in a.line()
    data = json.load(open(a.path))
    assert data["schema"] == decisions.SCHEMA and data["key"] == decisions.environment_key(0)
    assert data["tp"]["4"]["ops"]["indexer_logits"]["classes"]["b1"]["winner"] == "sglang"
    decisions._set_active(None)
    again = decisions.ensure(4, WANTED, _measure_fn(calls, {}))
    assert len(calls) == 1 and again.source == "read" and again.read_count == 5 and again.measured_count == 0
    assert f"5 decisions read from {a.path}" in again.line()
    # a server with another class (more CUDA-graph sizes) times only that class, and keeps the rest
    decisions._set_active(None)
    more = decisions.ensure(4, dict(WANTED, hc_prenorm=["m1", "m2-8", "m9-64"]), _measure_fn(calls, {}))
    assert calls[-1] == {"hc_prenorm": ["m9-64"]} and more.read_count == 5 and more.measured_count == 1
    # another TP size is another section of the same file
    decisions._set_active(None)
    decisions.ensure(2, {"indexer_logits": ["b1"]}, _measure_fn(calls, {}))
    assert calls[-1] == {"indexer_logits": ["b1"]} and set(json.load(open(a.path))["tp"]) == {"2", "4"}


@pytest.mark.parametrize("field, value", [("sglang", "0.5.17"), ("deepseek_v4_kernel", "0.0.9"), ("build", "x"),
                                          ("driver", "570.1"), ("flashinfer", "0.2.0")])
def test_an_entry_of_another_set_up_is_stale_and_measured_again(cache, field, value):
    calls = []
    key = decisions.environment_key(0)
    old = dict(key, **{field: value})
    os.makedirs(cache / "cache")
    old_path = str(cache / "cache" / decisions.file_name(old))
    decisions.write_atomic(old_path, decisions.merge(decisions.new_entry(old), 4,
                                                     {"indexer_logits": {"classes": {"b1": _decision("sglang")}}}))
    a = decisions.ensure(4, {"indexer_logits": ["b1"]}, _measure_fn(calls, {}))
    assert calls == [{"indexer_logits": ["b1"]}] and a.path != old_path
    assert any("re-measured: the cached entries are for another set-up" in n and
               f"{field} {value} -> {key[field]}" in n for n in a.notes), a.notes
    assert decisions.lookup("indexer_logits", "b1")["winner"] == "ours"
    # a file of this key's name that holds another key (or garbage) is not trusted either
    decisions._set_active(None)
    with open(a.path, "w") as f:
        json.dump(dict(json.load(open(old_path))), f)
    entry, why = decisions.read_entry(a.path, key)
    assert entry is None and f"stale ({field} {value} -> {key[field]})" in why
    with open(a.path, "w") as f:
        f.write("{not json")
    decisions.ensure(4, {"indexer_logits": ["b1"]}, _measure_fn(calls, {}))
    assert len(calls) == 2 and json.load(open(a.path))["schema"] == decisions.SCHEMA


def test_a_read_only_cache_dir_falls_back_and_says_why(cache, monkeypatch):
    blocker = cache / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(decisions.CACHE_DIR_ENV, str(blocker / "cache"))   # cannot be created (as on a ro mount)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    d, why = decisions.cache_dir()
    assert d == str(cache / "fallback")
    assert f"{blocker / 'cache'} cannot be created" in why and f"{blocker / 'xdg'}" in why
    a = decisions.ensure(1, {"hc_prenorm": ["m1"]}, _measure_fn([], {}))
    assert os.path.dirname(a.path) == d and any(f"cache in {d}: " in n for n in a.notes), a.notes
    # a later start finds it there
    decisions._set_active(None)
    assert decisions.ensure(1, {"hc_prenorm": ["m1"]}, _measure_fn([], {})).source == "read"


def test_measuring_that_fails_leaves_the_built_in_rules(cache):
    def broken(todo):
        raise RuntimeError("CUDA error: out of memory")
    a = decisions.ensure(1, {"indexer_logits": ["b1"]}, broken)
    assert a.source == "none" and a.classes == {}
    assert any("measured dispatch failed (RuntimeError: CUDA error: out of memory)" in n for n in a.notes)
    with pytest.raises(KeepOriginal, match="TileLang"):      # the built-in rule for the TileLang indexer at b1
        measured.check("indexer_logits", "b1", original="tilelang")


# ----------------------------------------------------------------------------- concurrent workers
RACER = """
import json, os, sys, time
from deepseek_v4_kernel.patch import decisions, policy
policy.device_info = lambda: policy.DeviceInfo([(12, 0)], ["RTX TEST"], "nvml", driver="1", cores=[1])
marks = sys.argv[1]
def measure(todo):
    open(os.path.join(marks, "measured-%d" % os.getpid()), "w").close()
    time.sleep(float(sys.argv[2]))
    return {op: {"classes": {lb: {"winner": "ours", "ours_us": 1.0, "sglang": "s", "sglang_us": 2.0,
                                   "handback_runnable": True} for lb in labels}} for op, labels in todo.items()}
a = decisions.ensure(4, {"indexer_logits": ["b1", "b2-8"]}, measure, wait_s=float(sys.argv[3]))
print("ACTIVE=" + json.dumps({"source": a.source, "read": a.read_count, "measured": a.measured_count,
                              "path": a.path, "b1": decisions.lookup("indexer_logits", "b1")["winner"],
                              "notes": a.notes}))
"""


def _race(tmp_path, sleep, wait):
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    env.update(PYTHONPATH=ROOT, DSV4_KERNEL_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(marks), str(sleep), str(wait)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    active = [json.loads(next(l for l in o[0].splitlines() if l.startswith("ACTIVE="))[7:]) for o in outs]
    return active, sorted(os.listdir(marks))


def test_two_workers_racing_one_times_the_other_waits_and_reads(tmp_path):
    active, marks = _race(tmp_path, sleep=1.5, wait=60)
    assert len(marks) == 1, marks                                   # one timed; the other waited for the lock
    assert sorted(a["source"] for a in active) == ["measured", "read"]
    assert {a["path"] for a in active} == {active[0]["path"]} and all(a["b1"] == "ours" for a in active)
    data = json.load(open(active[0]["path"]))
    assert set(data["tp"]["4"]["ops"]["indexer_logits"]["classes"]) == {"b1", "b2-8"}
    assert not [f for f in os.listdir(tmp_path / "cache") if f.endswith(".tmp")]


def test_a_worker_that_waits_too_long_times_its_own_gpu(tmp_path):
    active, marks = _race(tmp_path, sleep=2.0, wait=0.3)
    assert len(marks) == 2, marks                                   # both timed (each its own GPU)
    assert any("held by another process" in " ".join(a["notes"]) for a in active), active
    data = json.load(open(active[0]["path"]))                        # and the file is whole
    assert data["schema"] == decisions.SCHEMA and set(data["tp"]["4"]["ops"]["indexer_logits"]["classes"]) == {
        "b1", "b2-8"}


# ----------------------------------------------------------------------------- per call, per mode
def test_per_call_decisions_follow_the_measurement_and_the_mode(cache, monkeypatch):
    decisions.ensure(4, WANTED, _measure_fn([], {
        ("indexer_logits", "b1"): _decision("sglang"),                                   # TileLang won
        ("indexer_logits", "b2-8"): _decision("ours"),
        ("hc_prenorm", "m1"): _decision("sglang", name="deep_gemm tf32_hc_prenorm_gemm"),
        ("hc_prenorm", "m2-8"): _decision("sglang", runnable=False, name="deep_gemm tf32_hc_prenorm_gemm")}))
    with pytest.raises(KeepOriginal, match=r"measured slower at b1 .*\(measured at this server's start"):
        measured.check("indexer_logits", "b1", original="tilelang")
    measured.check("indexer_logits", "b1", original="torch")    # the decision was against TileLang, not torch
    measured.check("indexer_logits", "b2-8", original="tilelang")
    with pytest.raises(KeepOriginal, match="hc_prenorm: measured slower at m1"):
        measured.check("hc_prenorm", "m1", original="deep_gemm")
    measured.check("hc_prenorm", "m2-8", original="deep_gemm")  # DeepGEMM won but cannot run here: ours
    measured.check("indexer_logits", "b9+", original="tilelang")
    with pytest.raises(KeepOriginal, match="FlashInfer's native SM120 sparse MLA"):   # not timed: built-in rule
        measured.check("sparse_decode", "h64/b1", original="flashinfer")
    monkeypatch.setenv(policy.PREFER, "ours")
    measured.check("indexer_logits", "b1", original="tilelang")
    measured.check("sparse_decode", "h64/b1", original="flashinfer")
    monkeypatch.setenv(policy.PREFER, "builtin")                 # the measurement is not read; the built-in rules are
    measured.check("hc_prenorm", "m1", original="deep_gemm")
    with pytest.raises(KeepOriginal, match="FlashInfer's native SM120 sparse MLA"):
        measured.check("sparse_decode", "h64/b1", original="flashinfer")
    monkeypatch.setenv(policy.PREFER, "measured")                # the old name of the default: the same
    with pytest.raises(KeepOriginal, match="measured slower at b1"):
        measured.check("indexer_logits", "b1", original="tilelang")


@pytest.mark.parametrize("value, mode", [(None, "measured"), ("", "measured"), ("measured", "measured"),
                                         (" Ours ", "ours"), ("BUILTIN", "builtin")])
def test_prefer_values(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(policy.PREFER, raising=False)
    else:
        monkeypatch.setenv(policy.PREFER, value)
    assert policy.prefer_mode() == mode


def test_an_unknown_prefer_value_is_an_error_naming_the_variable_and_the_values(monkeypatch, tmp_path):
    monkeypatch.setenv(policy.PREFER, "fastest")
    with pytest.raises(InvalidSwitch, match=r"DSV4_KERNEL_PREFER must be one of measured, ours, builtin, "
                                            r"got 'fastest'"):
        policy.prefer_mode()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("print('sglang imported')\n")
    r = run_child("import sglang", path=[str(tmp_path)], env={"DSV4_KERNEL_FORCE": "1", policy.PREFER: "fastest"})
    assert r.returncode == 0 and "sglang imported" in r.stdout, r.stderr   # SGLang still starts, unpatched
    assert ("[deepseek_v4_kernel] not installed: InvalidSwitch: DSV4_KERNEL_PREFER must be one of measured, ours, "
            "builtin, got 'fastest'") in r.stderr, r.stderr


# ----------------------------------------------------------------------------- what is said
def test_doctor_lines_and_the_cache_command(cache, capsys):
    from deepseek_v4_kernel import cache_cli, doctor

    lines = "\n".join(decisions.doctor_lines())
    assert "dispatch: measured (DSV4_KERNEL_PREFER=''; accepted: measured, ours, builtin)" in lines
    assert f"dispatch cache: {cache / 'cache'}" in lines and "none yet (dispatch-nvidia-rtx-pro-6000" in lines
    a = decisions.ensure(4, WANTED, _measure_fn([], {("indexer_logits", "b1"): _decision("sglang")}))
    text = doctor.format_text(doctor.collect(run_selftest=False, import_modules=False))
    assert f"dispatch decisions for this set-up: {a.path}" in text
    assert ("  tp4 indexer_logits b1: SGLang's sglang-0.5.23 tilelang_fp8_paged_mqa_logits runs (ours 14.0 us, "
            "sglang-0.5.23 tilelang_fp8_paged_mqa_logits 12.0 us)") in text
    assert "  tp4 hc_prenorm m1: ours runs" in text
    assert cache_cli.main(["show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown[0]["path"] == a.path and shown[0]["key"]["gpu"] == GPU.names[0]
    rows = {(r["op"], r["class"]): r for r in shown[0]["decisions"]}
    assert rows[("indexer_logits", "b1")]["runs"] == "sglang" and rows[("hc_prenorm", "m1")]["runs"] == "ours"
    assert len(rows) == 5
    assert cache_cli.main(["show"]) == 0 and "tp4 indexer_logits b1: sglang runs" in capsys.readouterr().out
    assert cache_cli.main(["clear"]) == 0 and "removed 2 file(s)" in capsys.readouterr().out   # entry + lock
    assert not os.path.exists(a.path)


def test_the_module_command_shows_the_cache(tmp_path):
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "cache", "show"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env={**os.environ, decisions.CACHE_DIR_ENV: str(tmp_path)})
    assert r.returncode == 0 and f"cache directory: {tmp_path}" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "cache", "measure", "--op", "attention"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--op must be a comma-separated subset of sparse_decode" in r.stderr


# ----------------------------------------------------------------------------- the server's shapes
def _runner(sa, tp=4, context=1048576):
    hf = types.SimpleNamespace(num_attention_heads=64, index_topk=512, moe_intermediate_size=2048)
    return types.SimpleNamespace(server_args=sa, tp_size=tp,
                                 model_config=types.SimpleNamespace(hf_config=hf, context_len=context))


def test_server_shapes_per_sglang_layout():
    from deepseek_v4_kernel.bench import startup

    v0517 = types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(
        bs=[1, 2, 4, 8, 12, 16, 24, 32])), speculative_algorithm=None, chunked_prefill_size=8192)
    s = startup.server_shapes(_runner(v0517))
    assert s.tp == 4 and s.decode_rows == (1, 2, 4, 8, 12, 16, 24, 32) and s.prefill_rows == 8192
    assert s.indexer_ctx == startup.INDEXER_MAX_CTX and s.moe_inter == 512 and not s.notes
    mtp = types.SimpleNamespace(cuda_graph_bs=[1, 2, 4], speculative_algorithm="EAGLE",
                                speculative_num_draft_tokens=4, chunked_prefill_size=None)   # 0.5.12's field
    s = startup.server_shapes(_runner(mtp, tp=1, context=8192))
    assert s.decode_rows == (4, 8, 16) and s.indexer_ctx == 2048 and s.prefill_rows == 0
    s = startup.server_shapes(_runner(types.SimpleNamespace(), tp=8))
    assert s.decode_rows == startup.DEFAULT_DECODE_BS and "CUDA-graph batch sizes not found" in s.notes[0]
    cases = startup.wanted_cases(startup.server_shapes(_runner(v0517)), num_sms=188)
    # the class more of the server's rows fall in first (12-32: 4 rows, 2-8: 3, 1: 1)
    assert list(cases["indexer_logits"]) == ["b9+", "b2-8", "b1"]
    assert [c.n for c in cases["indexer_logits"]["b9+"]] == [32]       # the largest rows the server runs there
    assert set(cases["sparse_decode"]) == {"h16/b1", "h64/b1", "h16/b2-8", "h64/b2-8", "h16/b9-32", "h64/b9-32"}
    assert list(cases["hc_prenorm"]) == ["m9-64", "m2-8", "m1", "m1025+"]      # decode sizes and the prefill chunk
    assert {c.get("splits") for c in cases["hc_prenorm"]["m1"]} == {None, 64}
    # fp8_linear: every class up to 64 rows (eager prefills of few tokens reach any), at wq_b / wo_b / wq_a of TP 4
    fp8 = cases["fp8_linear"]
    assert set(fp8) == {"m1", "m2-8", "m9-16", "m17+"} and [c.n for c in fp8["m17+"]] == [64, 64, 64]
    assert [(c.get("shape"), c.get("N"), c.get("K")) for c in fp8["m2-8"]] == [
        ("wq_a", 1024, 4096), ("wq_b", 8192, 1024), ("wo_b", 4096, 2048)] and fp8["m2-8"][0].n == 8


@pytest.mark.parametrize("version, needle", [
    ("0.5.12", "server_args.cuda_graph_bs"),
    ("0.5.17", "server_args.cuda_graph_config.decode.bs"),
    ("0.5.23", "get_exec().graph.cuda_graph_config.decode.bs")])
def test_the_batch_sizes_are_where_each_wheel_keeps_them(version, needle):
    """Where bench/startup.py reads the CUDA-graph batch sizes is where each wheel's own capture code reads them."""
    base = sglang_dir(version)
    src = {"0.5.12": "sglang/srt/model_executor/cuda_graph_runner.py",
           "0.5.17": "sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
           "0.5.23": "sglang/srt/model_executor/runner/base_cuda_graph_runner.py"}[version]
    text = open(os.path.join(base, src)).read()
    assert needle.split(".", 1)[-1] in text, (version, needle)
    if version == "0.5.23":
        assert "def get_exec(" in open(os.path.join(base, "sglang/srt/runtime_context.py")).read()
    fields = open(os.path.join(base, "sglang/srt/server_args.py")).read()
    if version == "0.5.23":
        fields += open(os.path.join(base, "sglang/srt/arg_groups/fields/spec.py")).read()
    for name in ("speculative_num_draft_tokens", "speculative_algorithm"):
        assert name in fields, (version, name)


def test_a_wrong_or_failing_candidate_is_reported_never_chosen_and_a_failing_ours_keeps_sglang(monkeypatch):
    """bench/startup.measure_cases on the CPU (our Triton kernel in the interpreter, timing replaced by fixed numbers):
    a competitor that raises or returns wrong numbers is reported and never the winner; where ours fails its float64
    check SGLang's kernel runs."""
    torch = pytest.importorskip("torch")
    from deepseek_v4_kernel.bench import competitors as comp
    from deepseek_v4_kernel.bench import runner, shapes, startup

    def replica(a):   # SGLang's torch hc_pre (correct), "timed" at 7 us
        call = comp._torch_hc_pre(a)
        call.us = 7.0
        return call

    def raises(a):
        def call():
            raise RuntimeError("CUDA error: no kernel image is available")
        return call

    def wrong(a):
        def call():
            out, sq = comp._torch_hc_pre(a)()
            return out * 3, sq
        call.us = 1.0   # fastest, and wrong
        return call

    found = [comp.Competitor("hc_prenorm", "sglang replica", "t", comp.SGLANG, prepare=replica),
             comp.Competitor("hc_prenorm", "raising", "t", comp.SGLANG, prepare=raises),
             comp.Competitor("hc_prenorm", "wrong", "t", comp.SGLANG, prepare=wrong)]
    monkeypatch.setattr(comp, "discover", lambda op, **k: found)
    monkeypatch.setattr(comp, "sglang_default", lambda op, names, v: ("sglang replica", "the test's"))
    monkeypatch.setattr(runner, "time_rotated", lambda calls: (getattr(calls[0], "us", 10.0), "graph"))
    case = shapes.Case("hc_prenorm", 2, "m2-8", (("splits", None),))
    said = []
    out = startup.measure_cases({"hc_prenorm": {"m2-8": [case]}}, 60.0, said.append, device=torch.device("cpu"),
                                l2=1 << 20, all_competitors=True)
    rec = out["hc_prenorm"]["classes"]["m2-8"]
    results = rec["cases"][0]["results"]
    assert set(rec["cases"][0]["seconds"]) == {"reference", "ours", "sglang replica", "raising", "wrong"}
    assert results["raising"]["status"] == "failed" and "no kernel image" in results["raising"]["reason"]
    assert results["wrong"]["status"] == "wrong" and results["wrong"]["error"] > 0.5
    assert rec["winner"] == "sglang" and rec["best"] == "sglang replica"       # ours 10 us against 7 us; never "wrong"
    assert any(s.startswith("hc_prenorm m2-8: SGLang's (ours 10.0 us, sglang replica 7.0 us)") for s in said), said
    # at start-up (the default) only ours and the call site's kernel are timed: the others decide nothing there
    out = startup.measure_cases({"hc_prenorm": {"m2-8": [case]}}, 60.0, said.append, device=torch.device("cpu"),
                                l2=1 << 20)
    assert set(out["hc_prenorm"]["classes"]["m2-8"]["cases"][0]["results"]) == {"ours", "sglang replica"}
    assert out["hc_prenorm"]["classes"]["m2-8"]["winner"] == "sglang"
    # a wrong kernel at the call site is reported and never chosen: ours runs
    monkeypatch.setattr(comp, "sglang_default", lambda op, names, v: ("wrong", "the test's"))
    out = startup.measure_cases({"hc_prenorm": {"m2-8": [case]}}, 60.0, said.append, device=torch.device("cpu"),
                                l2=1 << 20)
    rec = out["hc_prenorm"]["classes"]["m2-8"]
    assert rec["winner"] == "ours" and not rec["handback_runnable"] and rec["why"].startswith("SGLang's wrong wrong:")
    monkeypatch.setattr(comp, "sglang_default", lambda op, names, v: ("sglang replica", "the test's"))
    # ours failing its check: SGLang's kernel runs there
    monkeypatch.setattr(runner, "ours_prepare", lambda op, impl=None: wrong)
    out = startup.measure_cases({"hc_prenorm": {"m2-8": [case]}}, 60.0, said.append, device=torch.device("cpu"),
                                l2=1 << 20)
    rec = out["hc_prenorm"]["classes"]["m2-8"]
    assert rec["winner"] == "sglang" and rec["why"].startswith("ours wrong: relative error")
    ours, why = measured.verdict("hc_prenorm", "m2-8", rec)
    assert not ours and "SGLang's kernel runs" in why


def test_a_budget_that_runs_out_is_recorded_and_later_starts_time_nothing(monkeypatch, cache):
    """bench/startup.measure_cases with a clock that advances 10 s per timing: a 25 s budget decides the first two
    classes of the op (each: ours + SGLang's kernel) and records the third undecided ("budget"); ensure writes that
    too, so the next start reads every class (nothing timed), `cache measure` (remeasure) times them again, and an
    entry of another set-up (a stale key) is measured again."""
    torch = pytest.importorskip("torch")
    from deepseek_v4_kernel.bench import competitors as comp
    from deepseek_v4_kernel.bench import runner, shapes, startup

    clock = [0.0]
    monkeypatch.setattr(startup, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def timed(calls):
        clock[0] += 10.0
        return 7.0, "graph"
    monkeypatch.setattr(runner, "time_rotated", timed)
    found = [comp.Competitor("hc_prenorm", "sglang replica", "t", comp.SGLANG, prepare=comp._torch_hc_pre)]
    monkeypatch.setattr(comp, "discover", lambda op, **k: found)
    monkeypatch.setattr(comp, "sglang_default", lambda op, names, v: ("sglang replica", "the test's"))
    cases = {"hc_prenorm": {lb: [shapes.Case("hc_prenorm", n, lb, (("splits", None),))]
                            for lb, n in (("m2-8", 2), ("m9-64", 9), ("m1", 1))}}
    said = []

    def measure(todo):
        return startup.measure_cases({op: {lb: cases[op][lb] for lb in labels} for op, labels in todo.items()},
                                     25.0, said.append, device=torch.device("cpu"), l2=1 << 20)
    wanted = {"hc_prenorm": ["m2-8", "m9-64", "m1"]}
    a = decisions.ensure(1, wanted, measure)
    assert a.measured_count == 2 and a.undecided_count == 1 and a.source == "measured"
    assert a.undecided["hc_prenorm"]["m1"].startswith("budget: the 25 s (DSV4_KERNEL_MEASURE_BUDGET_S) ran out")
    assert "1 undecided (budget; recorded now: the built-in rules decide them" in a.line(), a.line()
    assert any(x.startswith("hc_prenorm m1: undecided (budget") for x in said), said
    assert any(x.startswith("hc_prenorm: 2 decided, 1 undecided; seconds: discovery") for x in said), said
    assert decisions.lookup("hc_prenorm", "m1") is None and decisions.lookup("hc_prenorm", "m2-8")["winner"]
    data = json.load(open(a.path))
    assert data["tp"]["1"]["ops"]["hc_prenorm"]["undecided"] == {"m1": a.undecided["hc_prenorm"]["m1"]}
    # the next start reads all three (two decisions, one undecided), times nothing
    decisions._set_active(None)
    calls = []
    again = decisions.ensure(1, wanted, lambda todo: calls.append(todo) or {})
    assert not calls and again.source == "read" and again.read_count == 2 and again.undecided_count == 1
    assert "1 undecided (budget; as recorded" in again.line()
    # cache measure: everything asked for again; a class decided now leaves the undecided record
    decisions._set_active(None)
    clock[0] = 0.0
    redo = decisions.ensure(1, {"hc_prenorm": ["m1"]}, measure, remeasure=True)
    assert redo.measured_count == 1 and redo.undecided_count == 0
    assert "undecided" not in json.load(open(a.path))["tp"]["1"]["ops"]["hc_prenorm"]
    # another set-up (here: another SGLang) is another key: measured again, whatever the old file recorded
    decisions._set_active(None)
    key = dict(decisions.environment_key(0), sglang="9.9.9")
    calls = []
    stale = decisions.ensure(1, wanted, _measure_fn(calls, {}), key=key)
    assert calls == [wanted] and stale.measured_count == 3 and stale.path != a.path


def test_the_schedule_takes_every_op_s_first_class_before_any_op_s_second():
    from deepseek_v4_kernel.bench import startup

    got = startup._schedule({"a": {"x": 1, "y": 2, "w": 3}, "b": {"z": 4}, "c": {}})
    assert got == [("a", "x"), ("b", "z"), ("a", "y"), ("a", "w")]


def test_the_harness_reads_what_a_server_log_says():
    from deepseek_v4_kernel import cache_cli

    log = ("[deepseek_v4_kernel] MoE runner for DeepSeek-V4's MXFP4 experts: ours (triton runner) - ours measured "
           "faster than FlashInfer's MXFP4 runner (tokens1 50.0 / 80.0 us); measured at this first start (21.3 s), "
           "written to /c/dispatch-x.json\n"
           "[deepseek_v4_kernel] pid 71 GPU 1: measured dispatch, TP 2: 3 decisions read from /c/dispatch-x.json, 2 "
           "measured here and written to /c/dispatch-x.json (17.50 s)\n"
           "[deepseek_v4_kernel] pid 70 GPU 0: measured dispatch, TP 2: 5 decisions read from /c/dispatch-x.json "
           "(0.01 s)\n")
    got = cache_cli.from_log(log)
    assert got["moe_runner"] == [{"runner": "ours", "why": got["moe_runner"][0]["why"], "seconds": 21.3}]
    assert got["workers"] == [
        {"pid": 71, "gpu": 1, "tp": 2, "read": 3, "measured": 2, "path": "/c/dispatch-x.json", "seconds": 17.5},
        {"pid": 70, "gpu": 0, "tp": 2, "read": 5, "measured": 0, "path": "/c/dispatch-x.json", "seconds": 0.01}]
    # the line decide_at_model_load prints is what from_log reads
    a = decisions.Active("/c/f.json", 4, "read", read_count=7, seconds=0.004)
    assert cache_cli.from_log(f"[deepseek_v4_kernel] pid 9 GPU 0: {a.line()}")["workers"][0]["read"] == 7


def test_fp8_linear_competitor_is_the_function_sglang_resolved_with_its_quantization(monkeypatch):
    """bench/fp8_competitors on the CPU with a stand-in of SGLang's fp8_utils: where no server set SGLang's backend
    global, it is set as SGLang's auto would (DSV4_BENCH_FP8_GEMM_BACKEND otherwise) and dispatch_w8a8_block_fp8_linear
    decides; the resolved function is the call site's original (sglang_default), called with SGLang's keywords; a
    model's own resolved function wins over both; each is checked against the float64 reference before timing (a
    replica with SGLang's e4m3 activation quantization passes, a wrong one is reported)."""
    torch = pytest.importorskip("torch")
    from deepseek_v4_kernel.bench import competitors as comp
    from deepseek_v4_kernel.bench import fp8_competitors as fc
    from deepseek_v4_kernel.bench import inputs, runner, shapes
    from deepseek_v4_kernel.reference import fp8_linear as ref

    seen = {}

    def quantized_linear(input, weight, block_size, weight_scale, input_scale=None, bias=None):
        seen["kw"] = (tuple(block_size), input_scale, bias)   # SGLang's own per-1x128 e4m3 activation quantization
        xg = input.float().view(input.shape[0], -1, 128)
        s = xg.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 448.0
        xq = ((xg / s).to(torch.float8_e4m3fn).float() * s).view_as(input)
        return ref.fp8_linear_reference(xq, weight, weight_scale).to(torch.bfloat16)

    def triton_w8a8_block_fp8_linear(**k):
        return quantized_linear(**k)

    fu = types.ModuleType(fc.FP8_UTILS)
    fu.FP8_GEMM_RUNNER_BACKEND = None
    fu.Fp8GemmRunnerBackend = lambda v: f"backend:{v}"
    fu.triton_w8a8_block_fp8_linear = triton_w8a8_block_fp8_linear
    fu.dispatch_w8a8_block_fp8_linear = lambda: triton_w8a8_block_fp8_linear
    monkeypatch.setitem(sys.modules, fc.FP8_UTILS, fu)
    monkeypatch.setattr(fc, "RESOLVED", None)
    monkeypatch.setenv(fc.BACKEND_ENV, "triton")
    found = comp.discover("fp8_linear")
    assert fu.FP8_GEMM_RUNNER_BACKEND == "backend:triton"
    names = [c.name for c in found]
    default, why = comp.sglang_default("fp8_linear", names, "0.5.17")
    assert default == "sglang triton_w8a8_block_fp8_linear (Fp8LinearMethod's resolved backend)" == names[0]
    assert "its own activation quantization" in why and measured._kind(default) == "triton"
    case = shapes.fp8_linear_case(3, "wq_a", 256, 512)
    assert case.size_class == "m2-8" and case.label == "m=3 shape=wq_a N=256 K=512"
    pools = inputs.Pools(torch.device("cpu"), 1 << 20)
    sets = inputs.fp8_linear_sets(case, pools)[:2]
    check = inputs.check_rows(case.n)
    want = inputs.fp8_linear_reference(sets[0], check)
    monkeypatch.setattr(runner, "time_rotated", lambda calls: (5.0, "graph"))
    res = runner.measure("fp8_linear", default, found[0].prepare, sets, want, check)
    assert res["status"] == "ok" and 1e-3 < res["error"] < inputs.TOLERANCE["fp8_linear"], res
    assert seen["kw"] == ((128, 128), None, None)

    def wrong(a):
        return lambda: quantized_linear(a["x"], a["weight"], [128, 128], a["weight_scale"] * 2)
    assert runner.measure("fp8_linear", "wrong", wrong, sets, want, check)["status"] == "wrong"
    # a loaded model's method says what the server resolved: it wins over this process's dispatch
    def cutlass_w8a8_block_fp8_linear_with_fallback(**k):
        return quantized_linear(**k)
    layer = torch.nn.Module()
    layer.quant_method = types.SimpleNamespace(block_quant=True,
                                               w8a8_block_fp8_linear=cutlass_w8a8_block_fp8_linear_with_fallback)
    model = torch.nn.Module()
    model.add_module("wq_b", layer)
    monkeypatch.setattr(fc, "RESOLVED", fc.from_model(model))
    assert fc.RESOLVED[1] == "the loaded model's wq_b"
    names = [c.name for c in comp.discover("fp8_linear")]
    assert comp.sglang_default("fp8_linear", names, "0.5.17")[0] == (
        "sglang cutlass_w8a8_block_fp8_linear_with_fallback (Fp8LinearMethod's resolved backend)")
    assert "sglang triton_w8a8_block_fp8_linear" in names   # the user bench times it too, by name

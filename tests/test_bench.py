"""CPU tests of ``python -m deepseek_v4_kernel bench`` and DSV4_KERNEL_PREFER=measured (deepseek_v4_kernel/bench,
bench/competitors.py, patch/measured.py): shape grids per TP, size classes, the JSON schema and what the measured
file decides, competitor discovery against the unpacked SGLang 0.5.17 / 0.5.23 wheels (a stand-in ``tilelang``
records what SGLang's kernels would be compiled with), the input plumbing against SGLang's own torch fallbacks, and
the CLI's argument errors. The GPU run is benchmarks/bench_competitors.py's.
"""
import json
import os
import subprocess
import sys
import types

import pytest

from sglang_env import ROOT, WHEELS, run_child, sglang_dir

from deepseek_v4_kernel.bench import cli, report, runner, shapes
from deepseek_v4_kernel.patch import measured, policy, targets

# ----------------------------------------------------------------------------- shapes and classes


@pytest.mark.parametrize("tp,heads", [(1, 64), (2, 32), (4, 16), (8, 8)])
def test_sparse_decode_grid_heads_per_rank_and_padding(tp, heads):
    padded = shapes.sparse_decode_cases(tp, pad=True)
    unpadded = shapes.sparse_decode_cases(tp, pad=False)
    assert {c.get("heads") for c in unpadded} == {heads}
    assert {c.n for c in unpadded} == {1, 8, 32, 128} and {c.get("extra") for c in unpadded} == {512, 2048}
    pad_cases = [c for c in padded if c.get("padded")]
    if tp == 1:   # the rank's heads are 64 already: nothing padded, no duplicate rows
        assert not pad_cases and len(padded) == len(unpadded)
    else:         # SGLang pads decode calls of up to 64 tokens to 64 heads: b = 128 is never padded
        assert {c.n for c in pad_cases} == {1, 8, 32} and {c.get("heads") for c in pad_cases} == {64}
        assert len(padded) == len(unpadded) + len(pad_cases)
    assert all(c.size_class == f"h{c.get('heads')}/" + c.size_class.split("/")[1] for c in padded)


def test_grids_of_the_other_ops():
    idx = shapes.indexer_cases(4)
    assert {(c.n, c.get("ctx")) for c in idx} == {(b, c) for b in (1, 8, 32) for c in (4096, 16384, 65536)}
    hc = shapes.hc_prenorm_cases(1, num_sms=132)
    assert sorted({c.n for c in hc}) == [1, 8, 64, 256, 1024, 4096]
    assert {c.get("splits") for c in hc if c.n == 1} == {None, 64}
    moe = shapes.fp4_moe_cases(4)
    assert [c.n for c in moe] == [1, 8, 32, 128, 1024] and {c.get("inter") for c in moe} == {512}
    for op in shapes.OPS:   # the quick grid is a subset
        full = {(c.n, c.params) for c in shapes.cases(op, 2, 188)}
        assert {(c.n, c.params) for c in shapes.cases(op, 2, 188, quick=True)} < full


def test_mhc_splits_match_sglang_source():
    """Our copy of SGLang's split count equals mhc._compute_num_split_for_mhc_pre of both wheels."""
    from deepseek_v4_kernel.bench import sources

    for v in ("0.5.17", "0.5.23"):
        path = os.path.join(sglang_dir(v), "sglang/kernels/ops/layernorm/mhc.py")
        for sms in (132, 170, 188):
            fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
                get_device_properties=lambda i, s=sms: types.SimpleNamespace(multi_processor_count=s)))
            ns = {"torch": fake_torch}
            exec(compile(sources.extract(path, ["_compute_num_split_for_mhc_pre"]), path, "exec"), ns)
            for m in (1, 8, 63, 64, 65, 256, 1000, 4096, 16384):
                assert shapes.sglang_mhc_splits(m, sms) == ns["_compute_num_split_for_mhc_pre"](m, 16384), (v, sms, m)


@pytest.mark.parametrize("n,label", [(1, "b1"), (2, "b2-8"), (8, "b2-8"), (9, "b9-32"), (32, "b9-32"), (33, "b33+"),
                                     (5000, "b33+")])
def test_size_class_boundaries(n, label):
    assert measured.size_class("sparse_decode", n, heads=16) == f"h16/{label}"


def test_size_class_of_the_other_ops_and_errors():
    assert measured.size_class("indexer_logits", 32) == "b9+" and measured.size_class("indexer_logits", 1) == "b1"
    assert measured.size_class("hc_prenorm", 100) == "m65-256"
    assert measured.size_class("hc_prenorm", 16384) == "m1025+"
    assert measured.size_class("fp4_moe", 1024) == "tokens129+"
    for c in shapes.cases("hc_prenorm", 1, 132):   # every grid point is in its own class
        assert measured.size_class("hc_prenorm", c.n) == c.size_class
    with pytest.raises(ValueError, match="n must be a positive int"):
        measured.size_class("indexer_logits", 0)
    with pytest.raises(ValueError, match="heads must be"):
        measured.size_class("sparse_decode", 4)
    with pytest.raises(ValueError, match="op must be one of"):
        measured.size_class("attention", 4)


def test_rotation_count_bounds():
    from deepseek_v4_kernel.bench.timing import rotation_count

    assert rotation_count(1 << 30, 50 << 20) == 2                      # one call already streams GiBs
    assert rotation_count(1 << 20, 50 << 20) == 64                     # small calls: as many sets as allowed
    assert rotation_count(10 << 20, 50 << 20, hi=100) == 20            # 4 x L2 / bytes per call


# ----------------------------------------------------------------------------- decisions and the JSON
def _row(cls, ours, sglang, name="sglang-0.5.17 tilelang_fp8_paged_mqa_logits", others=None):
    res = {"ours": {"status": "ok", "us": ours} if ours is not None else {"status": "failed", "reason": "x"}}
    if sglang is not None:
        res[name] = {"status": "ok", "us": sglang}
    res.update(others or {})
    row = {"class": cls, "label": cls, "n": 1, "params": {}, "results": res}
    runner._decide(row, name)
    return row


def test_row_and_class_verdicts():
    rows = [_row("b1", 10.0, 20.0), _row("b1", 30.0, 15.0),       # class sum: ours 40 < 35? no: SGLang's wins
            _row("b2-8", 10.0, 12.0, others={"deep_gemm fp8_paged_mqa_logits": {"status": "ok", "us": 5.0}}),
            _row("b9+", 10.0, None),                               # SGLang's path cannot run here: ours
            _row("b33+", None, 10.0)]                              # ours failed: SGLang's
    assert rows[0]["winner"] == "ours" and rows[0]["ratio"] == 2.0 and rows[1]["winner"] == "sglang"
    assert rows[2]["best"] == "deep_gemm fp8_paged_mqa_logits" and rows[2]["winner"] == "ours"   # best != SGLang's
    classes = runner.classes_of(rows)
    assert classes["b1"]["winner"] == "sglang" and classes["b1"]["ours_us"] == 40.0 and classes["b1"]["sglang_us"] == 35
    assert classes["b2-8"]["winner"] == "ours" and classes["b2-8"]["handback_runnable"]
    assert classes["b2-8"]["best"] == "deep_gemm fp8_paged_mqa_logits" and classes["b2-8"]["best_us"] == 5.0
    assert classes["b9+"] == dict(classes["b9+"], winner="ours", handback_runnable=False, sglang_us=None)
    assert classes["b33+"]["winner"] == "sglang"


GPU = {"name": "NVIDIA RTX PRO 6000 Blackwell", "nvml_name": "NVIDIA RTX PRO 6000 Blackwell", "capability": [12, 0],
       "sm_count": 188, "l2_bytes": 128 << 20}


def _doc(classes_by_op, sglang="0.5.17", package=None):
    from deepseek_v4_kernel import __version__

    ops = {op: {"sglang_default": "x", "sglang_default_why": "y", "competitors": [], "rows": [], "classes": cls}
           for op, cls in classes_by_op.items()}
    vers = {"torch": "2.11.0", "triton": "3.6.0", "sglang": sglang, "flashinfer": "0.6.15.post1", "tilelang": None}
    return report.build(dict(GPU), vers, 4, {"quick": False}, ops, package or __version__)


def _cls(winner, runnable=True):
    return {"winner": winner, "ours_us": 10.0, "sglang_us": 20.0 if runnable else None, "sglang": "s",
            "ratio": 2.0, "handback_runnable": runnable, "rows": 1}


def test_json_schema_written_and_checked(tmp_path):
    doc = _doc({"indexer_logits": runner.classes_of([_row("b1", 10.0, 20.0)])})
    assert report.schema_errors(doc) == []
    path = report.write(doc, str(tmp_path / "sub" / "bench.json"))
    back = json.load(open(path))
    assert back["schema"] == measured.SCHEMA and back["gpu"]["capability"] == [12, 0] and back["tp"] == 4
    assert set(back["versions"]) >= {"torch", "triton", "sglang", "flashinfer", "tilelang"}
    bad = dict(doc, gpu={"name": "x"})
    del bad["versions"]
    errs = report.schema_errors(bad)
    assert "missing top-level field 'versions'" in errs and "missing gpu.capability" in errs
    doc["ops"]["indexer_logits"]["classes"]["b1"]["winner"] = "maybe"
    with pytest.raises(ValueError, match="winner must be 'ours' or 'sglang'"):
        report.write(doc, str(tmp_path / "bad.json"))


@pytest.fixture
def this_gpu(monkeypatch, tmp_path):
    """NVML answering as an RTX PRO 6000 with SGLang 0.5.17 installed; DSV4_KERNEL_MEASURED = tmp dir."""
    name = GPU["nvml_name"]
    monkeypatch.setattr(policy, "device_info", lambda: policy.DeviceInfo([(12, 0)], [name], "nvml"))
    monkeypatch.setattr(policy, "sglang_version", lambda: "0.5.17")
    monkeypatch.setenv(measured.PATH_ENV, str(tmp_path))
    monkeypatch.setenv(policy.PREFER, "measured")
    measured._reset_for_tests()
    yield tmp_path
    measured._reset_for_tests()


def _write(tmp_path, doc, tp=4):
    path = measured.default_path(GPU["nvml_name"], (12, 0), tp)
    assert os.path.dirname(path) == str(tmp_path) and path.endswith("-sm120-tp4.json")
    report.write(doc, path)
    measured._reset_for_tests()
    return path


def test_measured_match_decides_per_op_and_class(this_gpu):
    _write(this_gpu, _doc({"sparse_decode": {"h16/b1": _cls("ours"), "h16/b33+": _cls("sglang")},
                           "indexer_logits": {"b1": _cls("sglang"), "b9+": _cls("sglang")},
                           "hc_prenorm": {"m1": _cls("sglang", runnable=False)}}))
    assert measured.op_decision("sparse_decode")[0]
    ok, why = measured.op_decision("indexer_logits")
    assert not ok and "faster in every class" in why
    assert not measured.op_decision("fp4_moe")[0]                       # not measured: not patched
    assert measured.prefers_ours("sparse_decode", "h16/b1")[0]
    assert not measured.prefers_ours("sparse_decode", "h16/b33+")[0]
    assert measured.prefers_ours("sparse_decode", "h64/b1")[0]           # a class nobody measured stays ours
    ours, why = measured.prefers_ours("hc_prenorm", "m1")                # lost, but the hand-back cannot run here
    assert ours and "cannot run here" in why
    from deepseek_v4_kernel.errors import KeepOriginal

    with pytest.raises(KeepOriginal, match="measured slower at h16/b33"):
        measured.check("sparse_decode", measured.size_class("sparse_decode", 100, heads=16))
    measured.check("sparse_decode", "h16/b1")


def test_start_up_line_says_which_file_decides(this_gpu, monkeypatch):
    """Under DSV4_KERNEL_PREFER=measured every process's start-up line names the file read, or why none applies
    (the line is printed before SGLang sets up logging, so an INFO record would be lost there)."""
    from deepseek_v4_kernel import patch

    patcher = types.SimpleNamespace(active=True, targets=(), why="on SM12x", version="0.5.17", summary=lambda: "none")
    line = patch.start_up_line(patcher)   # no bench file: the start-up measurement decides (patch/decisions.py)
    assert "; dispatch: measured (each worker reads or times its decisions after its model loads; cache " in line
    assert line.endswith("doctor")
    path = _write(this_gpu, _doc({"sparse_decode": {"h16/b1": _cls("ours")}}))
    assert f"dispatch: DSV4_KERNEL_PREFER=measured: read {path}; details:" in patch.start_up_line(patcher)
    monkeypatch.delenv(policy.PREFER)   # measured is the default: the same
    assert f"dispatch: DSV4_KERNEL_PREFER=measured: read {path}; details:" in patch.start_up_line(patcher)
    monkeypatch.setenv(policy.PREFER, "builtin")
    assert "dispatch: the built-in rules (DSV4_KERNEL_PREFER=builtin)" in patch.start_up_line(patcher)


def test_measured_rows_of_the_target_table(this_gpu):
    """PREFER=measured: every row of an op asks the file; the rows' own conditions still decide after it."""
    _write(this_gpu, _doc({"sparse_decode": {"h16/b1": _cls("ours")}, "indexer_logits": {"b1": _cls("sglang")},
                           "hc_prenorm": {"m1": _cls("ours")}, "fp4_moe": {"tokens1": _cls("ours")}}))
    for t in targets.TARGETS:
        cond = targets.CONDITIONS[t.when]
        assert cond.__dsv4_measured_gate__ == t.op
        if t.op == "indexer_logits":
            needed, why = cond(None if t.kind != "env" else "0.5.17")
            assert not needed and "measured" in why, t
        elif t.op == "fp8_linear":   # not timed by the bench yet (not in measured.OPS): its rows stay SGLang's
            needed, why = cond(None if t.kind != "env" else "0.5.17")
            assert not needed and "fp8_linear was not measured" in why, (t, why)
        elif t.when.startswith("measured_gate:"):
            assert cond(None) == (True, "always on SM12x"), t
    # the FlashInfer row: a native kernel no longer keeps ours out when the file says ours won
    fake = types.SimpleNamespace(_sm120_default_backend="flashinfer")
    assert targets.CONDITIONS["sm120_sparse_decode_not_native"](fake)[0]
    # the README's "when" column is unchanged by the gate
    assert "| always on SM12x |" in targets.markdown_table()


def test_without_prefer_measured_nothing_changes(this_gpu, monkeypatch):
    monkeypatch.delenv(policy.PREFER)
    for t in targets.TARGETS:
        if t.when.startswith("measured_gate:"):
            assert targets.CONDITIONS[t.when](None) == (True, "always on SM12x")
    measured.check("sparse_decode", "h16/b33+")   # no file, no setting: a no-op


def test_a_file_the_bench_wrote_on_a_gpu_is_read_and_decides(monkeypatch):
    """tests/data/bench-nvidia-h200-sm90-tp1.json is what ``python -m deepseek_v4_kernel bench`` wrote on an H200
    (SGLang 0.5.17 with TileLang, DeepGEMM and FlashMLA installed): DSV4_KERNEL_PREFER=measured reads it, and the
    doctor names it and what it decides per op."""
    path = os.path.join(ROOT, "tests", "data", "bench-nvidia-h200-sm90-tp1.json")
    with open(path) as f:
        data = json.load(f)
    assert measured.validate(data, "NVIDIA H200", (9, 0), "0.5.17", data["deepseek_v4_kernel"]) is None
    m = measured.read([path], "NVIDIA H200", (9, 0), "0.5.17", data["deepseek_v4_kernel"])
    # (written before the bench timed fp8_linear: a file without an op patches none of its calls by it)
    assert m.ok and set(m.classes) == set(measured.OPS) - {"fp8_linear"}
    for op in m.classes:   # the labels the file holds are the classes the patch layer asks about
        assert set(m.classes[op]) <= {measured.size_class(op, n, **({"heads": 64} if op == "sparse_decode" else {}))
                                      for n in measured.class_representatives(op)}, op
    assert measured.op_decision("indexer_logits", m)[0]
    v = m.classes["indexer_logits"]["b9+"]
    assert v["winner"] == "ours" and v["sglang"].endswith("tilelang_fp8_paged_mqa_logits") and v["handback_runnable"]
    # a class SGLang's kernel cannot run here (FlashInfer's SM120 sparse MLA on sm_90) stays ours
    assert measured.prefers_ours("sparse_decode", "h64/b1", m)[0]
    monkeypatch.setattr(policy, "device_info", lambda: policy.DeviceInfo([(9, 0)], ["NVIDIA H200"], "nvml"))
    monkeypatch.setattr(policy, "sglang_version", lambda: "0.5.17")
    monkeypatch.setenv(measured.PATH_ENV, path)
    monkeypatch.setenv(policy.PREFER, "measured")
    measured._reset_for_tests()
    try:
        from deepseek_v4_kernel import __version__

        lines = "\n".join(measured.doctor_lines())
        if __version__ != data["deepseek_v4_kernel"]:   # a newer package calls the file stale, and says so
            assert "stale: run bench again" in lines
        else:
            assert f"read {path}" in lines and "indexer_logits: DSV4_KERNEL_PREFER=measured: ours faster at" in lines
    finally:
        measured._reset_for_tests()


def test_builtin_keeps_tilelang_indexer_at_one_row_unless_preferred(this_gpu, monkeypatch):
    """Without DSV4_KERNEL_PREFER: the TileLang indexer (SGLang's SM120 path) is kept at b = 1, where it was
    measured faster, and only where the replaced kernel is TileLang; PREFER=ours runs ours; PREFER=measured follows
    the user's file instead (here: ours won b1)."""
    from deepseek_v4_kernel.errors import KeepOriginal

    monkeypatch.delenv(policy.PREFER)
    with pytest.raises(KeepOriginal, match=r"indexer_logits b1: SGLang's TileLang kernel measured faster .*=ours"):
        measured.check("indexer_logits", "b1", original="tilelang")
    measured.check("indexer_logits", "b2-8", original="tilelang")   # ours
    measured.check("indexer_logits", "b1", original="torch")        # SGLang's torch path: ours
    measured.check("indexer_logits", "b1")
    monkeypatch.setenv(policy.PREFER, "ours")
    measured.check("indexer_logits", "b1", original="tilelang")
    monkeypatch.setenv(policy.PREFER, "measured")
    _write(this_gpu, _doc({"indexer_logits": {"b1": _cls("ours")}}))
    measured._reset_for_tests()
    measured.check("indexer_logits", "b1", original="tilelang")
    # the adapter of the TileLang rows asks before any kernel runs (builtin: the bench file above, which measured
    # dispatch, the default, would read, says ours won b1)
    monkeypatch.setenv(policy.PREFER, "builtin")
    import torch

    from deepseek_v4_kernel.patch import adapters

    q = torch.zeros(1, 1, 64, 128)
    with pytest.raises(KeepOriginal, match="indexer_logits b1"):
        adapters.tilelang_fp8_paged_mqa_logits(q, None, None, None, None, None, 16384)
    for (op, label, _), why in measured.BUILTIN_KEEP.items():   # every built-in row names a real class
        if label == "*":   # a kernel that could not be timed here, kept in every class: it says so
            assert "not timed" in why, why
            continue
        assert label in {measured.size_class(op, n) for n in measured.class_representatives(op)} and " us" in why


@pytest.mark.parametrize("change,expect", [
    (lambda d: d["gpu"].update(nvml_name="NVIDIA H200"), "gpu.nvml_name is 'NVIDIA H200'"),
    (lambda d: d["versions"].update(sglang="0.5.23"), "versions.sglang is '0.5.23', installed is '0.5.17' (stale"),
    (lambda d: d.update(deepseek_v4_kernel="0.0.1"), "deepseek_v4_kernel is '0.0.1'"),
    (lambda d: d.update(schema="other/9"), "schema is 'other/9'"),
])
def test_measured_file_mismatch_or_stale_is_ignored(this_gpu, change, expect):
    """A bench file of another GPU, SGLang, package or schema is not read (the start-up measurement decides per call
    instead), and the reason is said."""
    doc = _doc({"sparse_decode": {"h16/b1": _cls("sglang")}})
    change(doc)
    with open(measured.default_path(GPU["nvml_name"], (12, 0), 4), "w") as f:
        json.dump(doc, f)
    measured._reset_for_tests()
    ok, why = measured.op_decision("sparse_decode")
    assert ok and "decided per call" in why and expect in why, why
    assert not measured.bench_file_decides()
    assert measured.prefers_ours("sparse_decode", "h16/b1")[0]   # per call: nothing read, nothing handed back


def test_measured_capability_mismatch_and_missing_file(this_gpu, monkeypatch):
    ok, why = measured.op_decision("sparse_decode")
    assert ok and "no measured file" in why and "python -m deepseek_v4_kernel bench" in why
    # a file of another compute capability is not even a candidate for this GPU
    doc = _doc({"sparse_decode": {"h16/b1": _cls("ours")}})
    report.write(doc, measured.default_path(GPU["nvml_name"], (12, 1), 4))
    measured._reset_for_tests()
    assert "no measured file" in measured.op_decision("sparse_decode")[1]
    # named directly, its capability is checked
    monkeypatch.setenv(measured.PATH_ENV, measured.default_path(GPU["nvml_name"], (12, 1), 4))
    doc["gpu"]["capability"] = [12, 1]
    report.write(doc, os.environ[measured.PATH_ENV])
    measured._reset_for_tests()
    assert "gpu.capability is [12, 1], this GPU is [12, 0]" in measured.op_decision("sparse_decode")[1]


def test_table_renders_every_competitor():
    row = _row("b1", 10.0, 20.0, others={"deep_gemm fp8_paged_mqa_logits": {"status": "wrong", "error": 0.5}})
    doc = _doc({"indexer_logits": runner.classes_of([row])})
    doc["ops"]["indexer_logits"].update(rows=[report._compact_row(row)], sglang_default=row["sglang"], competitors=[
        {"name": row["sglang"], "runnable": True, "same_as": "", "reason": ""},
        {"name": "deep_gemm fp8_paged_mqa_logits", "runnable": True, "same_as": "", "reason": ""},
        {"name": "sglang-0.5.23 tilelang_fp8_paged_mqa_logits", "runnable": False, "reason": "",
         "same_as": row["sglang"]}])
    text = report.table(doc)
    assert "WRONG" in text and "2.00x" in text and "same kernel as" in text and "c1 = " + row["sglang"] in text


# ----------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("argv,msg", [
    (["--tp", "3"], "--tp must be one of 1, 2, 4, 8"), (["--tp", "two"], "--tp must be one of 1, 2, 4, 8"),
    (["--tp"], "--tp needs a value (one of 1, 2, 4, 8)"),
    (["--ops", "attention"], "--ops must be a comma-separated subset of sparse_decode,indexer_logits"),
    (["--ops="], "--ops must be a comma-separated subset"), (["--out="], "--out must be a file path"),
    (["--sglang-sources", "latest"], "--sglang-sources must be SGLang versions"),
    (["--fast"], "unknown argument '--fast'"),
])
def test_cli_argument_errors_name_the_argument(argv, msg, capsys):
    with pytest.raises(cli.UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        cli.parse_args(argv)
    assert cli.main(argv) == 2
    assert msg in capsys.readouterr().err


def test_cli_parses_a_full_command():
    o = cli.parse_args(["--tp", "4", "--ops=indexer_logits,hc_prenorm", "--out", "/tmp/x.json", "--quick",
                        "--mma-sync", "--no-pad", "--sglang-sources", "0.5.23"])
    assert o["tp"] == 4 and o["ops"] == ["indexer_logits", "hc_prenorm"] and o["out"] == "/tmp/x.json"
    assert o["quick"] and o["mma_sync"] and not o["pad"] and o["sglang_sources"] == ("0.5.23",)


def test_module_command_dispatches_bench():
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "bench", "--tp", "5"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--tp must be one of 1, 2, 4, 8" in r.stderr and "got '5'" in r.stderr


# ----------------------------------------------------------------------------- competitors against the real wheels
def test_sglang_kernels_have_the_call_forms_the_bench_uses():
    """The functions competitors.py loads exist in both wheels with the parameters it passes (read with ast:
    tilelang is not installed here)."""
    from deepseek_v4_kernel.bench import sources
    from deepseek_v4_kernel.bench import competitors as comp

    for v in ("0.5.17", "0.5.23"):
        tree = sglang_dir(v)
        f = lambda key: sources.find_file(tree, comp.FILES[key])  # noqa: E731
        assert sources.signature_of(f("tilelang_indexer"), "tilelang_fp8_paged_mqa_logits") == list(
            targets._INDEXER_PARAMS[:2]) + ["weight", "seq_lens", "page_table", "deep_gemm_metadata", "max_seq_len",
                                            "clean_logits"]
        assert sources.signature_of(f("tilelang_indexer"), "fp8_paged_mqa_logits_kernel") == [
            "head_dim", "num_heads", "block_size", "clear_accum", "split_kv"]
        assert sources.signature_of(f("mhc"), comp.MHC_SPLITK) == [
            "hc_mult3", "hc_hidden_size", "split_k", "token_block", "hidden_block", "threads"]
        assert sources.signature_of(f("mhc"), comp.MHC_ONE_SPLIT)[:6] == [
            "x", "fn", "out", "sqrsum", "hc_mult3", "hc_hidden_size"]
        assert sources.signature_of(f("flash_mla_sm120_triton"), "flash_mla_sparse_decode_triton") == [
            "q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale", "extra_k_cache",
            "extra_indices", "extra_topk_length"]
        assert sources.signature_of(f("flash_mla_sm120"), "_flash_mla_flashinfer")[:3] == ["q", "k_cache", "indices"]
        assert "mhc_pre_gemm_sqrsum_splitk_kernel(" in open(f("mhc")).read()
        assert ("_mhc_pre_gemm_sqrsum_dispatch" in open(f("mhc")).read()) == (v == "0.5.23")
        reason = comp.triton_moe_blocker(tree)
        assert "Hidden size mismatch" in reason and "hidden/2 bytes" in reason
    with pytest.raises(LookupError, match="defines no no_such_kernel"):
        sources.extract(sources.find_file(sglang_dir("0.5.17"), comp.FILES["mhc"]), ["no_such_kernel"])


DISCOVER = """
import json, sys, torch
from deepseek_v4_kernel.bench import competitors as comp
mma = sys.argv[1:] == ["mma"] or %r
out = {}
for op in ("indexer_logits", "hc_prenorm", "fp4_moe", "sparse_decode"):
    for c in comp.discover(op, mma_sync=mma, source_versions=("0.5.17", "0.5.23")):
        out[c.name] = dict(runnable=c.runnable, reason=c.reason, same_as=c.same_as, role=c.role)
        if c.runnable and "tilelang" in c.name:   # call it: the stand-in tilelang records the compile options
            if op == "hc_prenorm":
                a = dict(x=torch.zeros(40, 16384, dtype=torch.bfloat16), fn=torch.zeros(24, 16384), num_splits=None)
            else:
                a = dict(q=torch.zeros(2, 1, 64, 128).to(torch.float8_e4m3fn), kv_cache=torch.zeros(
                         8, 64, 1, 132, dtype=torch.uint8), weights=torch.zeros(2, 64), seq_lens=torch.full((2,), 300,
                         dtype=torch.int32), page_table=torch.zeros(2, 5, dtype=torch.int32), max_seq_len=300)
            c.prepare(a)()
print("DISCOVERED=" + json.dumps(out))
"""

STAND_IN_TILELANG = '''
import enum, json, os
class PassConfigKey(str, enum.Enum):
    TL_DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
    TL_DISABLE_TMA_LOWER = "tl.disable_tma_lower"
    TL_ENABLE_FAST_MATH = "tl.enable_fast_math"
    TL_DISABLE_SAFE_MEMORY_ACCESS = "tl.disable_safe_memory_access"
    TL_PTXAS_REGISTER_USAGE_LEVEL = "tl.ptxas_register_usage_level"
    TL_DISABLE_WGMMA = "tl.disable_wgmma"
def set_log_level(level):
    pass
def jit(func=None, **kw):
    def decorate(fn):
        def kernel(*args, **kwargs):
            cfg = {getattr(k, "value", k): v for k, v in (kw.get("pass_configs") or {}).items()}
            with open(os.environ["TL_RECORD"], "a") as f:
                f.write(json.dumps({"kernel": fn.__name__, "pass_configs": cfg}) + "\\n")
        return kernel
    return decorate(func) if callable(func) else decorate
from . import language, layout
'''
STAND_IN_ANY = '''
class _Any:
    def __getattr__(self, name): return _Any()
    def __call__(self, *a, **k): return _Any()
    def __getitem__(self, k): return _Any()
def __getattr__(name): return _Any()
'''


def _discover_in_child(tmp_path, mma):
    pkg = tmp_path / "stand_in" / "tilelang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN_TILELANG)
    (pkg / "language.py").write_text(STAND_IN_ANY)
    (pkg / "layout.py").write_text(STAND_IN_ANY)
    record = tmp_path / f"compiles-{mma}.jsonl"
    sglang_dir("0.5.17"), sglang_dir("0.5.23")
    r = run_child(DISCOVER % (mma,), path=[str(tmp_path / "stand_in")],
                  env={"DSV4_SGLANG_SOURCES": WHEELS, "TL_RECORD": str(record)})
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("DISCOVERED="))[len("DISCOVERED="):])
    compiles = [json.loads(l) for l in open(record)] if record.exists() else []
    return found, compiles


def test_discovery_without_tilelang_says_why():
    import importlib.util

    if importlib.util.find_spec("tilelang") is not None:
        pytest.skip("tilelang is installed here: the unavailable case cannot be shown")
    sglang_dir("0.5.17"), sglang_dir("0.5.23")
    r = run_child(DISCOVER % (False,), env={"DSV4_SGLANG_SOURCES": WHEELS})
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("DISCOVERED="))[len("DISCOVERED="):])
    tl = {k: v for k, v in found.items() if "tilelang" in k}
    assert len(tl) == 6 and all(not v["runnable"] for v in tl.values())
    assert all("No module named 'tilelang'" in v["reason"] for k, v in tl.items() if not v["same_as"])
    # what runs without a GPU or tilelang: SGLang's Triton / torch fallbacks (loaded from the files) and the replica
    assert found["sglang-0.5.17 triton flash_mla_sm120 fallback"]["runnable"]
    assert found["sglang-0.5.17 torch fp8_paged_mqa_logits_torch_sm120"]["runnable"]
    assert found["sglang-0.5.23 torch fp8_paged_mqa_logits_torch_sm120"]["same_as"] == \
        "sglang-0.5.17 torch fp8_paged_mqa_logits_torch_sm120"   # identical source: timed once
    flashinfer = next(v for k, v in found.items() if k.startswith("flashinfer sm120"))
    assert not flashinfer["runnable"] and "SM120-only" in flashinfer["reason"]
    for v in ("0.5.17", "0.5.23"):
        moe = found[f"sglang-{v} triton MoE runner"]
        assert not moe["runnable"] and "Hidden size mismatch" in moe["reason"]


@pytest.mark.parametrize("mma", [False, True])
def test_tilelang_kernels_load_and_take_the_forced_pass_configs(tmp_path, mma):
    """With a stand-in tilelang: SGLang's TileLang kernels load from both wheels' files and are called; the mma.sync
    mode adds TL_DISABLE_WGMMA to every kernel and turns on SGLang's own SM120 settings (0.5.23: no warp
    specialisation in the mHC pre-GEMMs); the native mode leaves SGLang's options as they are."""
    found, compiles = _discover_in_child(tmp_path, mma)
    assert found["sglang-0.5.17 tilelang_fp8_paged_mqa_logits"]["runnable"]
    assert found["sglang-0.5.23 tilelang_fp8_paged_mqa_logits"]["same_as"] == "sglang-0.5.17 tilelang_fp8_paged_mqa_logits"
    assert all(v["runnable"] for k, v in found.items() if "tilelang mhc" in k)
    by_kernel = {}
    for c in compiles:
        by_kernel.setdefault(c["kernel"], []).append(c["pass_configs"])
    assert set(by_kernel) == {"fp8_paged_mqa_logits", "mhc_pre_gemm_sqrsum_splitk_stage_0",
                              "mhc_pre_gemm_sqrsum_tilelang"}
    for cfg in by_kernel["fp8_paged_mqa_logits"]:   # SGLang's own options, always
        assert cfg["tl.disable_warp_specialized"] and cfg["tl.disable_tma_lower"] and cfg["tl.disable_safe_memory_access"]
    for cfgs in by_kernel.values():
        assert all(bool(c.get("tl.disable_wgmma")) == mma for c in cfgs), by_kernel
    splitk = by_kernel["mhc_pre_gemm_sqrsum_splitk_stage_0"]   # 0.5.17, then 0.5.23 (SM120: WS off)
    one_split = by_kernel["mhc_pre_gemm_sqrsum_tilelang"]
    assert len(splitk) == 2 and len(one_split) == 2
    assert [bool(c.get("tl.disable_warp_specialized")) for c in splitk] == [False, mma]
    assert [bool(c.get("tl.disable_warp_specialized")) for c in one_split] == [False, mma]


def test_loaded_sources_keep_their_own_future_flags(tmp_path):
    """SGLang's mHC split-K kernel names hc_hidden_size only in its inner kernel's annotations; TileLang resolves
    string annotations against the closure alone, so the loader must evaluate them as the file would (no
    ``annotations`` future inherited from the loader's own module), and keep a file's own future imports."""
    from deepseek_v4_kernel.bench import sources

    body = "def factory(n):\n    def inner(a: ('T', n)):\n        return 0\n    return inner\n"
    plain, future = tmp_path / "plain.py", tmp_path / "future.py"
    plain.write_text("import os\n" + body)
    future.write_text("from __future__ import annotations\n" + body)
    assert sources.load(str(plain), ["factory"])["factory"](5).__annotations__["a"] == ("T", 5)
    assert sources.load(str(future), ["factory"])["factory"](5).__annotations__["a"] == "('T', n)"


# ----------------------------------------------------------------------------- inputs against SGLang's fallbacks
def test_inputs_match_sglang_torch_fallbacks_and_a_wrong_result_is_not_timed():
    """Our rotated inputs (reference packers, SGLang's page strides) through SGLang's own torch fallbacks agree with
    our float64 references; a result off by a layout mistake is reported 'wrong' before any timing."""
    import torch

    from deepseek_v4_kernel.bench import inputs
    from deepseek_v4_kernel.bench import competitors as comp

    sglang_dir("0.5.17")
    os.environ.setdefault("DSV4_SGLANG_SOURCES", WHEELS)
    found = {c.name: c for op in ("sparse_decode", "indexer_logits", "hc_prenorm")
             for c in comp.discover(op, source_versions=("0.5.17",))}
    pools = inputs.Pools(torch.device("cpu"), 1 << 20)
    cases = [(shapes.Case("sparse_decode", 2, "h16/b2-8", (("heads", 16), ("extra", 64), ("padded", False))),
              "sglang-0.5.17 torch flash_mla_sm120 fallback"),
             (shapes.Case("indexer_logits", 2, "b2-8", (("ctx", 300),)),
              "sglang-0.5.17 torch fp8_paged_mqa_logits_torch_sm120"),
             (shapes.Case("hc_prenorm", 3, "m2-8", (("splits", 4),)),
              "sglang torch hc_pre path (replica: F.linear fp32 + square-sum)")]
    for case, name in cases:
        sets = inputs.SETS[case.op](case, pools)
        rows = inputs.check_rows(case.n)
        ref = inputs.REFERENCE[case.op](sets[0], rows)
        assert inputs.rel_error(case.op, found[name].prepare(sets[0])(), ref, sets[0], rows) < inputs.TOLERANCE[case.op] / 4
        wrong = runner.measure(case.op, name, lambda a, f=found[name].prepare: _swap_rows(f(a)), sets, ref, rows)
        assert wrong["status"] == "wrong" and wrong["error"] > inputs.TOLERANCE[case.op], (case.op, wrong)


def _swap_rows(call):
    def swapped():
        r = call()
        return tuple(t.flip(-2 if t.dim() > 1 else -1) for t in r) if isinstance(r, tuple) else r.flip(0)
    return swapped


def test_run_op_to_measured_decisions_on_cpu(monkeypatch, this_gpu):
    """The whole pipeline at tiny shapes on the CPU (our Triton kernels in the interpreter, SGLang's torch fallbacks
    from the 0.5.17 sources; CUDA-graph timing replaced by a fixed number): discovery, the checks, the verdicts,
    the JSON, and what PREFER=measured then decides from it."""
    import torch

    from deepseek_v4_kernel.bench import inputs

    sglang_dir("0.5.17")
    monkeypatch.setenv("DSV4_SGLANG_SOURCES", WHEELS)
    tiny = {"indexer_logits": [shapes.Case("indexer_logits", 2, "b2-8", (("ctx", 128),))],
            "hc_prenorm": [shapes.Case("hc_prenorm", 2, "m2-8", (("splits", None),))]}
    monkeypatch.setattr(shapes, "cases", lambda op, *a, **k: tiny[op])
    monkeypatch.setattr(runner, "time_rotated", lambda calls: (5.0, "graph"))
    opt = runner.Options(tp=4, ops=list(tiny), source_versions=("0.5.17",))
    pools = inputs.Pools(torch.device("cpu"), 1 << 20)
    lines = []
    ops = {op: runner.run_op(op, opt, pools, lines.append, 188, "0.5.17") for op in tiny}
    assert any(l.startswith("[indexer_logits 1/1] b=2 ctx=128: ours 5.0 us") for l in lines), lines
    idx = ops["indexer_logits"]
    torch_fb = idx["rows"][0]["results"]["sglang-0.5.17 torch fp8_paged_mqa_logits_torch_sm120"]
    assert torch_fb["status"] == "ok" and torch_fb["error"] < inputs.TOLERANCE["indexer_logits"]
    assert idx["rows"][0]["results"]["ours"]["error"] < inputs.TOLERANCE["indexer_logits"]
    # SGLang 0.5.17's path at the call site is TileLang, which does not run here: ours, never handed back
    assert idx["sglang_default"] == "sglang-0.5.17 tilelang_fp8_paged_mqa_logits"
    assert idx["classes"]["b2-8"]["winner"] == "ours" and not idx["classes"]["b2-8"]["handback_runnable"]
    hc = ops["hc_prenorm"]["rows"][0]["results"]
    assert hc["ours"]["status"] == "ok" and hc["sglang torch hc_pre path (replica: F.linear fp32 + square-sum)"][
        "status"] == "ok"
    gpu = dict(GPU)
    doc = report.build(gpu, dict(report.versions(), sglang="0.5.17"), 4, {}, ops,
                       __import__("deepseek_v4_kernel").__version__)
    _write(this_gpu, doc)
    assert measured.op_decision("indexer_logits")[0] and measured.op_decision("hc_prenorm")[0]
    assert not measured.op_decision("sparse_decode")[0]   # not measured
    assert "b2-8" in report.table(doc)

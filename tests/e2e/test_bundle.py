"""The bundle's spec and committed manifest agree with each other, with SGLang 0.5.17's pins and with the limits of
one device call; where the wheels are at hand (.e2e/wheels, or DSV4_E2E_WHEELS), their sha256 too."""
import json
import os
import re

import pytest

import e2e_env  # noqa: F401
import build_bundle as bb
import bundle_spec as spec
from e2e_env import ROOT, SGLANG_VERSION


def manifest():
    if not os.path.isfile(bb.MANIFEST):
        pytest.fail(f"{bb.MANIFEST} is missing: run python3 tools/e2e/build_bundle.py and commit it")
    with open(bb.MANIFEST) as f:
        return json.load(f)


def test_spec_is_consistent():
    assert spec.spec_problems() == []
    assert set(spec.GROUP_ORDER) == set(spec.GROUP_DEST)


def test_manifest_matches_spec():
    m = manifest()
    listed = {(p["name"], p["version"], p["group"]) for p in m["packages"]}
    wanted = {(p.name, p.version, p.group) for p in spec.PACKAGES}
    assert listed == wanted, f"spec and manifest differ: {sorted(listed ^ wanted)}"
    for p in m["packages"]:
        assert re.fullmatch(r"[0-9a-f]{64}", p["sha256"]), p["name"]
        assert p["wheel"].endswith(".whl") and p["files"] > 0


def test_manifest_slimming_applied():
    pkgs = {p["name"]: p for p in manifest()["packages"]}
    excluded = pkgs["sglang-kernel"]["excluded"]
    assert "sgl_kernel/flash_ops.abi3.so" in excluded and any(e.startswith("sgl_kernel/sm100/") for e in excluded)
    assert "xgrammar/lib/libxgrammar.a" in pkgs["xgrammar"]["excluded"]
    assert pkgs["xgrammar"]["stripped"] == ["xgrammar/libxgrammar_bindings.so"]
    assert pkgs["z3-solver"]["files"] == 1


def test_parts_fit_a_device_call():
    m = manifest()
    seen = []
    for group, rec in m["groups"].items():
        assert rec["dest"] == spec.GROUP_DEST[group]
        assert sum(p["bytes"] for p in rec["parts"]) == rec["xz_bytes"]
        for part in rec["parts"]:
            assert part["bytes"] <= m["part_limit_bytes"] <= spec.PART_LIMIT
            seen.append((part["file"], part["bytes"]))
    sizes = dict(seen)
    flat = [f for t in m["transfers"] for f in t]
    assert sorted(flat) == sorted(sizes), "every part in exactly one transfer"
    assert all(sum(sizes[f] for f in t) <= spec.TRANSFER_LIMIT for t in m["transfers"])


def test_plan_transfers():
    mib = spec.MIB
    groups = {"base": {"parts": [{"file": "b0", "bytes": 50 * mib}, {"file": "b1", "bytes": 20 * mib}]},
              "tf": {"parts": [{"file": "t0", "bytes": 5 * mib}]},
              "tilelang": {"parts": [{"file": "l0", "bytes": 40 * mib}]}}
    assert bb.plan_transfers(groups) == [["b0", "t0"], ["b1", "l0"]]
    with pytest.raises(SystemExit, match="over"):
        bb.plan_transfers({"base": {"parts": [{"file": "x", "bytes": 61 * mib}]}})


def test_pins_agree_with_sglang_0_5_17():
    from sglang_env import sglang_dir

    meta = os.path.join(sglang_dir(SGLANG_VERSION), f"sglang-{SGLANG_VERSION}.dist-info", "METADATA")
    pins = {}
    for line in open(meta):
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)\s*$", line.strip())
        if m:
            pins[spec.normalise(m.group(1))] = m.group(2)
    ours = {spec.normalise(p.name): p.version for p in spec.PACKAGES}
    checked = [n for n in ours if n in pins]
    assert len(checked) >= 8, checked
    assert {n: ours[n] for n in checked} == {n: pins[n] for n in checked}


def test_wheels_match_manifest_where_present():
    wheels = os.environ.get("DSV4_E2E_WHEELS", os.path.join(ROOT, ".e2e", "wheels"))
    if not os.path.isdir(wheels):
        pytest.skip(f"no downloaded wheels in {wheels} (python3 tools/e2e/build_bundle.py fetches them)")
    for p in manifest()["packages"]:
        path = os.path.join(wheels, p["wheel"])
        if os.path.isfile(path):
            assert bb.sha256_file(path) == p["sha256"], p["wheel"]


def test_every_wheel_is_pinned_by_file_name_and_sha256():
    """Rebuilding picked another build of apache-tvm-ffi 0.1.11 (another manylinux tag) and changed the bundle: each
    package names its exact wheel, and the manifest records that file."""
    assert set(spec.WHEELS) == {p.name for p in spec.PACKAGES}
    for p in manifest()["packages"]:
        assert (p["wheel"], p["sha256"]) == spec.WHEELS[p["name"]], p["name"]


def test_download_asks_for_the_pinned_file_and_refuses_any_other(tmp_path, monkeypatch):
    """pip gets a hashed requirement per package (it then takes the build with that sha256), and a file that is not
    the pinned one (another build's name, or other bytes under the pinned name) stops the build, naming it."""
    pkg = next(p for p in spec.PACKAGES if p.name == "apache-tvm-ffi")
    name, sha = spec.WHEELS[pkg.name]
    calls = []

    def fake_pip(cmd, check):
        req = cmd[cmd.index("-r") + 1]
        calls.append((cmd, open(req).read()))
        dest = cmd[cmd.index("-d") + 1]
        with open(os.path.join(dest, write_as[0]), "wb") as f:
            f.write(b"another build")

    monkeypatch.setattr(bb.subprocess, "run", fake_pip)
    for write_as in (["apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"], [name]):
        wheels = tmp_path / write_as[0][-20:]
        with pytest.raises(SystemExit, match=re.escape(f"apache-tvm-ffi==0.1.11: want {name} sha256 {sha}, got ")):
            bb.download(str(wheels), [pkg])
    cmd, req = calls[0]
    assert "--require-hashes" in cmd and req == f"apache-tvm-ffi==0.1.11 --hash=sha256:{sha}\n"

"""The patch mechanism (hook.py) on throw-away modules, and the policy switches.

The real SGLang targets are tested in test_patch_targets.py and start-up faults in
test_startup.py.
"""

import logging
import sys
import textwrap

import pytest

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.patch import hook, policy, targets
from deepseek_v4_kernel.patch.hook import Patcher
from deepseek_v4_kernel.patch.targets import Target


@pytest.fixture
def toypkg(tmp_path, monkeypatch):
    """A package `toypkg_<n>`: lib.op (the 'original'), user.py (binds op at import), ours.op (replacement)."""
    name = f"toypkg_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lib.py").write_text(textwrap.dedent("""
        def op(x, y=1, *, flag=False):
            return ("orig", x, y)
        def other(a):
            return a
        STATE = "initial"
        class Base:
            def inherited(self, x):
                return ("base", x)
        class Method(Base):
            def apply(self, x, y=1):
                return ("orig", x, y)
    """))
    (pkg / "user.py").write_text(f"from {name}.lib import op\nfrom {name}.lib import op as aliased\n")
    (pkg / "ours.py").write_text(textwrap.dedent("""
        from deepseek_v4_kernel.errors import ExtensionUnavailable, KeepOriginal, UnsupportedCase
        def op(x, y=1, *, flag=False):
            if x == 7:
                raise KeepOriginal("toy x7: the original was measured faster")
            if x < 0:
                raise UnsupportedCase(f"toy: x must be >= 0, got {x}")
            if x == 1000:
                raise ExtensionUnavailable("toy: the library has no kernel for this GPU (sm_121)")
            return ("ours", x, y)
        def narrow(x):
            return ("narrow", x)
        def wrap(original, x, y=1, *, flag=False):
            return ("wrapped", original(x, y, flag=flag))
        wrap.__dsv4_wraps_original__ = True
        def apply(self, x, y=1):
            if x < 0:
                raise UnsupportedCase(f"toy: x must be >= 0, got {x}")
            return ("ours", type(self).__name__, x, y)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for m in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[m]


def _target(pkg, **kw):
    base = dict(op="toy", module=f"{pkg}.lib", attr="op", replacement=f"{pkg}.ours:op", first="0.5.12",
                params=("x", "y", "flag"), importers=(f"{pkg}.user",))
    base.update(kw)
    return Target(**base)


def _patcher(tlist, version="0.5.23", active=True):
    p = Patcher(tlist, version, active, "test")
    p.install()
    return p


def test_patch_on_import_and_rebind_importer(toypkg):
    t = _target(toypkg)
    p = _patcher([t])
    try:
        assert p.records[t].status == hook.PENDING
        import importlib

        user = importlib.import_module(f"{toypkg}.user")
        lib = sys.modules[f"{toypkg}.lib"]
        assert p.records[t].status == hook.PATCHED, p.records[t].reason
        assert lib.op(2) == ("ours", 2, 1)
        assert user.op(3, y=4) == ("ours", 3, 4)
        assert user.aliased(5) == ("ours", 5, 1)
        assert lib.op.__dsv4_original__(2) == ("orig", 2, 1)
    finally:
        p.uninstall()


def test_module_imported_before_install_is_patched_and_importers_rebound(toypkg):
    import importlib

    user = importlib.import_module(f"{toypkg}.user")
    assert user.op(1) == ("orig", 1, 1)
    t = _target(toypkg)
    p = _patcher([t])
    try:
        assert p.records[t].status == hook.PATCHED
        assert user.op(1) == ("ours", 1, 1) and user.aliased(1) == ("ours", 1, 1)
    finally:
        p.uninstall()


def test_missing_attribute_is_skipped(toypkg):
    import importlib

    t = _target(toypkg, attr="does_not_exist")
    p = _patcher([t])
    try:
        importlib.import_module(f"{toypkg}.lib")
        assert p.records[t].status == hook.SKIPPED
        assert "no attribute does_not_exist" in p.records[t].reason
    finally:
        p.uninstall()


def test_method_of_a_class_is_patched_and_hands_back_with_self(toypkg, monkeypatch):
    monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
    t = _target(toypkg, attr="Method.apply", replacement=f"{toypkg}.ours:apply", params=("self", "x", "y"),
                importers=())
    p = _patcher([t])
    lib = __import__(f"{toypkg}.lib", fromlist=["Method"])
    assert p.records[t].status == hook.PATCHED, p.records[t].reason
    m = lib.Method()
    assert m.apply(2) == ("ours", "Method", 2, 1)
    assert m.apply(-1, y=5) == ("orig", -1, 5)  # handed back, self passed through
    assert p.records[t].handbacks == 1
    # a method the class only inherits is not this target's call site; a missing class is drift
    inherited = _target(toypkg, attr="Method.inherited", replacement=f"{toypkg}.ours:apply", params=(), importers=())
    gone = _target(toypkg, attr="Gone.apply", replacement=f"{toypkg}.ours:apply", params=(), importers=())
    p2 = _patcher([inherited, gone])
    p2.on_import(f"{toypkg}.lib", lib)
    assert p2.records[inherited].status == hook.SKIPPED and "not a plain function" in p2.records[inherited].reason
    assert p2.records[gone].status == hook.SKIPPED and "no attribute" in p2.records[gone].reason


def test_signature_drift_is_skipped(toypkg):
    import importlib

    t = _target(toypkg, attr="other", params=("x", "y"))  # `other(a)` lacks the keywords the caller passes
    t2 = _target(toypkg, replacement=f"{toypkg}.ours:narrow")  # ours must take the caller's keywords too
    p = _patcher([t, t2])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        assert p.records[t].status == hook.SKIPPED and "signature drifted" in p.records[t].reason
        assert p.records[t2].status == hook.SKIPPED and "does not take" in p.records[t2].reason
        assert lib.other(7) == 7 and lib.op(1) == ("orig", 1, 1)
    finally:
        p.uninstall()


def test_condition_false_leaves_original(toypkg, monkeypatch):
    import importlib

    monkeypatch.setitem(targets.CONDITIONS, "toy_native", lambda m: (m.STATE != "initial", "native kernel present"))
    t = _target(toypkg, when="toy_native")
    p = _patcher([t])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        assert p.records[t].status == hook.LEFT and p.records[t].reason == "native kernel present"
        assert lib.op(1) == ("orig", 1, 1)
    finally:
        p.uninstall()


def _unset_for_the_test(monkeypatch, *names):
    """Unset ``names`` now and again after the test (setenv first, so that monkeypatch records the absence)."""
    for k in names:
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)


def test_setattr_gate_and_env_gate(toypkg, monkeypatch):
    import importlib

    from deepseek_v4_kernel.patch import policy

    _unset_for_the_test(monkeypatch, "DSV4_TOY_GATE", policy.ENV_SET)
    g = _target(toypkg, attr="STATE", kind="setattr", value="flipped", importers=())
    e = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1")
    p = _patcher([g, e])
    try:
        import os

        assert os.environ["DSV4_TOY_GATE"] == "1" and p.records[e].status == hook.PATCHED
        lib = importlib.import_module(f"{toypkg}.lib")
        assert lib.STATE == "flipped" and p.records[g].status == hook.PATCHED
    finally:
        p.uninstall()


def test_env_gate_respects_user_setting(monkeypatch):
    from deepseek_v4_kernel.patch import policy

    _unset_for_the_test(monkeypatch, policy.ENV_SET)
    monkeypatch.setenv("DSV4_TOY_GATE", "0")
    e = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1")
    p = _patcher([e])
    import os

    assert os.environ["DSV4_TOY_GATE"] == "0" and p.records[e].status == hook.LEFT


def test_env_gate_reasserted_in_workers_only_where_this_layer_set_it(monkeypatch):
    """SGLang 0.5.13-0.5.19's launcher turns a flag off after start-up, in its own process: the launcher's process
    (where the user had not set it) marks it as set by this layer, and a worker that inherits another value sets
    it again; a value the user gave, or a row without reassert, stays."""
    import os

    from deepseek_v4_kernel.patch import policy

    _unset_for_the_test(monkeypatch, "DSV4_TOY_GATE", policy.ENV_SET)
    e = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1", reassert=True)
    plain = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1")
    _patcher([e]).uninstall()                                   # the launcher's process: the user set nothing
    assert os.environ["DSV4_TOY_GATE"] == "1" and os.environ[policy.ENV_SET] == "DSV4_TOY_GATE"
    os.environ["DSV4_TOY_GATE"] = "False"                       # SGLang's launcher, after start-up
    p = _patcher([plain])                                       # a worker, row without reassert
    assert os.environ["DSV4_TOY_GATE"] == "False" and p.records[plain].status == hook.LEFT
    p = _patcher([e])                                           # a worker, reasserting row
    assert os.environ["DSV4_TOY_GATE"] == "1" and p.records[e].status == hook.PATCHED
    assert "set again" in p.records[e].reason and os.environ[policy.ENV_SET] == "DSV4_TOY_GATE"
    monkeypatch.delenv(policy.ENV_SET)                          # the user's own 0: never marked, never reasserted
    monkeypatch.setenv("DSV4_TOY_GATE", "0")
    p = _patcher([e])
    assert os.environ["DSV4_TOY_GATE"] == "0" and p.records[e].status == hook.LEFT
    assert policy.ENV_SET not in os.environ


def test_env_gate_condition_sees_the_sglang_version(monkeypatch):
    """An env row's condition is evaluated at install with the SGLang version (no module exists yet): not needed
    -> the variable stays unset and the row says why; needed -> set."""
    import os

    from deepseek_v4_kernel.patch import policy

    _unset_for_the_test(monkeypatch, "DSV4_TOY_GATE", policy.ENV_SET)
    seen = []
    monkeypatch.setitem(targets.CONDITIONS, "toy_env", lambda v: (seen.append(v) or v != "0.5.20", "version says no"))
    e = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1", first="0.5.12", when="toy_env")
    for version, want in (("0.5.20", None), ("0.5.23", "1")):
        monkeypatch.delenv("DSV4_TOY_GATE", raising=False)
        p = _patcher([e], version)
        try:
            assert os.environ.get("DSV4_TOY_GATE") == want
            assert p.records[e].status == (hook.LEFT if want is None else hook.PATCHED)
            assert want or p.records[e].reason == "version says no"
        finally:
            p.uninstall()
    assert seen == ["0.5.20", "0.5.23"]


def test_env_gate_condition_that_raises_costs_only_its_row(toypkg, monkeypatch):
    import importlib
    import os

    from deepseek_v4_kernel.patch import policy

    def broken(version):
        raise OSError("disk gone")

    _unset_for_the_test(monkeypatch, "DSV4_TOY_GATE", policy.ENV_SET)
    monkeypatch.setitem(targets.CONDITIONS, "toy_broken", broken)
    e = Target(op="toy", module="", attr="DSV4_TOY_GATE", kind="env", value="1", when="toy_broken")
    t = _target(toypkg)
    p = _patcher([e, t])
    try:
        assert p.records[e].status == hook.ERROR and "disk gone" in p.records[e].reason
        assert "DSV4_TOY_GATE" not in os.environ
        importlib.import_module(f"{toypkg}.lib")
        assert p.records[t].status == hook.PATCHED
    finally:
        p.uninstall()


def test_hc_prenorm_gate_condition_by_version_and_deep_gemm(monkeypatch):
    """SGLang 0.5.17-0.5.20's fused post/pre step imports deep_gemm behind the flag alone: set it only where a
    deep_gemm is importable there; 0.5.13-0.5.16 do not take that step on SM120 and 0.5.21+ ask the replaced
    mhc._use_deep_gemm_hc_prenorm first, so the flag is safe there without one."""
    import importlib.util

    cond = targets.CONDITIONS["hc_prenorm_gate_cannot_reach_a_missing_deep_gemm"]
    real = importlib.util.find_spec
    for have in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if have else None) if name == "deep_gemm" else real(name, *a))
        for v in ("0.5.17", "0.5.18", "0.5.19", "0.5.20"):
            needed, why = cond(v)
            assert needed == have and "deep_gemm" in why, v
        for v in ("0.5.13", "0.5.15.post1", "0.5.16", "0.5.21", "0.5.22", "0.5.23"):
            assert cond(v)[0], v


def test_extension_unavailable_hands_back(toypkg, monkeypatch, caplog):
    """A GPU the compiled library has no kernel for (ops/_device.extension_error) or a library that does
    not load: the call goes back to SGLang's function, logged once; strict mode raises."""
    import importlib

    from deepseek_v4_kernel.errors import ExtensionUnavailable

    t = _target(toypkg)
    p = _patcher([t])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
        with caplog.at_level(logging.WARNING, logger="deepseek_v4_kernel"):
            assert lib.op(1000) == ("orig", 1000, 1)
            assert lib.op(1000, y=2) == ("orig", 1000, 2)
            assert lib.op(3) == ("ours", 3, 1)
        msgs = [r.getMessage() for r in caplog.records if "handing this call back" in r.getMessage()]
        assert len(msgs) == 1 and "no kernel for this GPU (sm_121)" in msgs[0], msgs
        assert p.records[t].handbacks == 2
        monkeypatch.setenv("DSV4_KERNEL_STRICT", "1")
        with pytest.raises(ExtensionUnavailable, match="sm_121"):
            lib.op(1000)
    finally:
        p.uninstall()


def test_unsupported_case_hands_back_once_logged_and_strict_raises(toypkg, monkeypatch, caplog):
    import importlib

    t = _target(toypkg)
    p = _patcher([t])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
        with caplog.at_level(logging.WARNING, logger="deepseek_v4_kernel"):
            assert lib.op(-1) == ("orig", -1, 1)
            assert lib.op(-1) == ("orig", -1, 1)
            assert lib.op(-2) == ("orig", -2, 1)
        msgs = [r.getMessage() for r in caplog.records if "handing this call back" in r.getMessage()]
        assert len(msgs) == 2, msgs  # once per distinct case
        assert "x must be >= 0, got -1" in msgs[0]
        assert p.records[t].handbacks == 3
        monkeypatch.setenv("DSV4_KERNEL_STRICT", "1")
        with pytest.raises(UnsupportedCase, match="x must be >= 0"):
            lib.op(-1)
    finally:
        p.uninstall()


def test_keep_original_runs_the_original_as_kept_not_handed_back(toypkg, monkeypatch, caplog):
    """A measured choice of SGLang's kernel: counted apart from hand-backs, said once at INFO (no WARNING), and the
    original runs even under DSV4_KERNEL_STRICT=1 (it is not a gap in ours)."""
    import importlib

    t = _target(toypkg)
    p = _patcher([t])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        monkeypatch.setenv("DSV4_KERNEL_STRICT", "1")
        with caplog.at_level(logging.INFO, logger="deepseek_v4_kernel"):
            assert lib.op(7) == ("orig", 7, 1)
            assert lib.op(7) == ("orig", 7, 1)
            assert lib.op(3) == ("ours", 3, 1)
        kept = [r for r in caplog.records if "keeping the original" in r.getMessage()]
        assert len(kept) == 1 and kept[0].levelno == logging.INFO and "measured faster" in kept[0].getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        rec = p.records[t]
        assert (rec.kept, rec.handbacks) == (2, 0) and rec.as_dict()["kept_reasons"] == {
            "toy x7: the original was measured faster": 2}
    finally:
        p.uninstall()


def test_a_wrapping_replacement_gets_the_original(toypkg):
    import importlib

    t = _target(toypkg, replacement=f"{toypkg}.ours:wrap")
    p = _patcher([t])
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        assert lib.op(3, y=2) == ("wrapped", ("orig", 3, 2))
        assert p.records[t].status == "patched"
    finally:
        p.uninstall()


def test_inactive_patcher_touches_nothing(toypkg):
    import importlib

    t = _target(toypkg)
    p = _patcher([t], active=False)
    try:
        lib = importlib.import_module(f"{toypkg}.lib")
        assert lib.op(1) == ("orig", 1, 1)
        assert p.records[t].status == hook.INACTIVE
    finally:
        p.uninstall()


@pytest.mark.parametrize("version,expect", [
    (None, "not installed"), ("0.5.11", "predates"), ("0.5.24", None), ("garbage", "cannot parse"),
])
def test_version_gating(toypkg, version, expect):
    t = _target(toypkg, first="0.5.12")
    ok, why = t.applies_to_version(version)
    assert ok == (expect is None) and (expect is None or expect in why)
    closed = _target(toypkg, first="0.5.13", last="0.5.15.post1")
    assert closed.applies_to_version("0.5.15.post1")[0] and not closed.applies_to_version("0.5.16")[0]
    assert not closed.applies_to_version("0.5.12.post1")[0]


def test_parse_version_orders_releases():
    vs = ["0.5.12", "0.5.12.post1", "0.5.13rc0", "0.5.13", "0.5.15.post1", "0.5.16", "0.5.23"]
    assert sorted(vs, key=policy.parse_version) == ["0.5.12", "0.5.12.post1", "0.5.13rc0", "0.5.13",
                                                    "0.5.15.post1", "0.5.16", "0.5.23"]


@pytest.mark.parametrize("caps,force,disable,active", [
    ([(12, 0)], False, False, True),
    ([(12, 1)], False, False, True),
    ([(9, 0)], False, False, False),
    ([(9, 0)], True, False, True),
    ([], False, False, False),
    ([], True, False, True),
    ([(12, 0)], False, True, False),
])
def test_policy_device_and_switches(monkeypatch, caps, force, disable, active):
    monkeypatch.setattr(policy, "_DEVICE", policy.DeviceInfo(capabilities=caps, names=["gpu"] * len(caps)))
    monkeypatch.setenv(policy.FORCE, "1" if force else "0")
    monkeypatch.setenv(policy.DISABLE, "1" if disable else "")
    assert policy.active()[0] is active


def test_cuda_visible_devices_filter(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert policy._visible_indices(4) == [1, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert policy._visible_indices(2) == [0, 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert policy._visible_indices(2) == [0, 1]


def test_every_target_row_is_well_formed():
    for t in targets.TARGETS:
        assert t.kind in ("replace", "setattr", "env"), t
        assert t.first in targets.SURVEYED and (t.last is None or t.last in targets.SURVEYED), t
        if t.when is not None:
            assert t.when in targets.CONDITIONS, t
        if t.kind == "replace":
            mod, _, fn = t.replacement.partition(":")
            assert (mod.startswith("deepseek_v4_kernel.ops.") or mod == "deepseek_v4_kernel.patch.adapters") and fn, t
            if t.callers:
                assert t.params, f"{t}: a replacement must list the keywords its callers pass"


def test_summary_words_cover_every_status():
    statuses = {hook.PATCHED, hook.PENDING, hook.SKIPPED, hook.LEFT, hook.INACTIVE, hook.ERROR}
    assert set(hook.SUMMARY_WORDS) == statuses


def test_summary_counts_what_happened(toypkg):
    import importlib

    p = _patcher([_target(toypkg), _target(toypkg, attr="other", params=("a",), importers=()),
                  _target(toypkg, first="0.5.13", last="0.5.15.post1")])
    try:
        assert p.summary() == "2 waiting for their module, 1 not for this version"
        importlib.import_module(f"{toypkg}.lib")
        assert p.summary() == "1 patched, 1 skipped, 1 not for this version"
    finally:
        p.uninstall()


def test_nvml_failure_is_said(monkeypatch):
    import ctypes

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    info = policy._query_nvml()
    assert info.error == "libnvidia-ml.so.1 not loadable: libnvidia-ml.so.1: cannot open shared object file"
    assert info.describe() == f"no GPU visible to NVML: {info.error}"
    assert policy.DeviceInfo().describe() == "no GPU visible to NVML"


def _start_up_hook_namespace():
    """sitecustomize.py's definitions, executed under a name sys.modules does not hold (so it installs nothing)."""
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sitecustomize.py")
    ns = {"__name__": "_dsv4_start_up_hook_under_test", "__file__": path}
    exec(compile(open(path).read(), path, "exec"), ns)
    return ns


def test_start_up_watcher_installs_on_first_watched_import_and_hands_over(toypkg, monkeypatch):
    """sitecustomize.py's watcher: nothing happens until a watched package is imported; then the patch layer
    installs (without a finder of its own on sys.meta_path) and the watcher hands it this and later imports."""
    import importlib
    import types

    ns = _start_up_hook_namespace()
    ns["WATCHED_PACKAGES"] = frozenset((toypkg,))
    made = []

    def install():
        p = Patcher([_target(toypkg)], "0.5.23", True, "test")
        p.install(add_finder=not fake_patch._start_up_watcher_present())
        made.append(p)
        return p

    from deepseek_v4_kernel import patch as real_patch

    fake_patch = types.SimpleNamespace(install=install, installed=lambda: made[-1] if made else None,
                                       _start_up_watcher_present=real_patch._start_up_watcher_present)
    monkeypatch.setitem(sys.modules, "deepseek_v4_kernel.patch", fake_patch)
    monkeypatch.setattr(sys.modules["deepseek_v4_kernel"], "patch", fake_patch, raising=False)
    watcher = ns["FirstImportHook"]()
    sys.meta_path.insert(0, watcher)
    try:
        importlib.import_module("json")   # not watched: nothing installed
        assert not made
        lib = importlib.import_module(f"{toypkg}.lib")
        assert len(made) == 1 and made[0]._finder not in sys.meta_path and watcher in sys.meta_path
        assert lib.op(2) == ("ours", 2, 1) and made[0].records[made[0].targets[0]].status == hook.PATCHED
        user = importlib.import_module(f"{toypkg}.user")   # a later import: the same patcher, importer rebound
        assert len(made) == 1 and user.op(3) == ("ours", 3, 1)
    finally:
        sys.meta_path.remove(watcher)


# ----------------------------------------------------------------------------- what ran: counters, logs, exit summary
def test_outcomes_logged_and_handbacks_counted_by_reason(toypkg, monkeypatch, caplog):
    """Each target's outcome is logged once at INFO when its module is imported (patched, and skipped / left with the
    reason); every hand-back is counted by its reason, the first of each reason logged at WARNING."""
    import importlib

    monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
    good, missing = _target(toypkg), _target(toypkg, attr="does_not_exist", importers=())
    p = _patcher([good, missing])
    try:
        with caplog.at_level(logging.INFO, logger="deepseek_v4_kernel"):
            lib = importlib.import_module(f"{toypkg}.lib")
            for x in (-1, -1, -2, 1000, 5):
                lib.op(x)
        text = caplog.text
        assert f"patched {toypkg}.lib.op" in text
        assert f"skipped {toypkg}.lib.does_not_exist: {toypkg}.lib has no attribute does_not_exist" in text
        rec = p.records[good]
        assert rec.handbacks == 4
        assert rec.handback_reasons == {"toy: x must be >= 0, got -1": 2, "toy: x must be >= 0, got -2": 1,
                                        "toy: the library has no kernel for this GPU (sm_121)": 1}
        assert text.count("handing this call back") == 3   # once per reason
        assert p.report()[0]["handback_reasons"] == rec.handback_reasons
    finally:
        p.uninstall()


def test_ops_count_calls_by_kernel_and_say_the_first_one(caplog, monkeypatch, tmp_path):
    """ops/_stats: each call counted by (op, kernel), the first of each logged at INFO, a slower-path reason logged
    once at WARNING and counted every time; with DSV4_KERNEL_STATS_DIR the snapshot lands in <dir>/<pid>.json."""
    import json
    import os

    from deepseek_v4_kernel.ops import _stats

    monkeypatch.setattr(_stats, "CALLS", type(_stats.CALLS)())
    monkeypatch.setattr(_stats, "FALLBACKS", type(_stats.FALLBACKS)())
    monkeypatch.setenv(_stats.STATS_DIR_ENV, str(tmp_path))
    with caplog.at_level(logging.INFO, logger="deepseek_v4_kernel"):
        for impl in ("mma64ws", "mma64ws", "mma64wsh16"):
            _stats.count("sparse_decode", impl)
        for _ in range(3):
            _stats.warn_once("fp4_moe", "the compiled decode kernels cannot take a call (no library)")
    assert [m.getMessage() for m in caplog.records].count("deepseek_v4_kernel: sparse_decode: first call ran mma64ws") == 1
    assert caplog.text.count("first call ran") == 2 and caplog.text.count("cannot take a call") == 1
    snap = _stats.snapshot()
    assert snap["sparse_decode"]["calls"] == {"mma64ws": 2, "mma64wsh16": 1}
    assert snap["fp4_moe"]["fallbacks"] == {"the compiled decode kernels cannot take a call (no library)": 3}
    assert "sparse_decode: mma64ws 2, mma64wsh16 1" in _stats.summary()
    written = json.load(open(os.path.join(str(tmp_path), f"{os.getpid()}.json")))
    assert written["ops"]["sparse_decode"]["calls"]["mma64wsh16"] == 1


def test_exit_summary_line_and_quiet(tmp_path):
    """A process where the layer is active prints one line at exit naming what ran and what was handed back;
    DSV4_KERNEL_QUIET=1 silences it (and the start-up line)."""
    from sglang_env import run_child

    code = """
        import deepseek_v4_kernel.patch as patch
        from deepseek_v4_kernel.ops import _stats
        patch.install()
        _stats.count("hc_prenorm", "cuda")
        _stats.count("hc_prenorm", "cuda")
    """
    r = run_child(code, env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if "at exit:" in l]
    assert len(lines) == 1 and "hc_prenorm: cuda 2" in lines[0] and "handed back to SGLang: nothing" in lines[0], \
        r.stderr
    q = run_child(code, env={"DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_QUIET": "1"})
    assert q.returncode == 0 and "at exit:" not in q.stderr and "[deepseek_v4_kernel" not in q.stderr, q.stderr


# ----------------------------------------------------------------------------- switches
@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), (" Yes ", True), ("ON", True),
                                             ("0", False), ("false", False), ("no", False), ("Off", False),
                                             ("", None), (None, None)])
def test_one_parser_for_boolean_switches(monkeypatch, value, expected):
    from deepseek_v4_kernel.switches import env_bool

    if value is None:
        monkeypatch.delenv("DSV4_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("DSV4_TEST_SWITCH", value)
    for default in (False, True):
        assert env_bool("DSV4_TEST_SWITCH", default) is (default if expected is None else expected)


@pytest.mark.parametrize("name", [policy.FORCE, policy.STRICT, policy.QUIET, "DSV4_HC_PRENORM_ATOMIC"])
def test_a_switch_value_we_do_not_read_is_an_error_naming_the_variable(monkeypatch, name):
    from deepseek_v4_kernel.switches import InvalidSwitch, env_bool

    monkeypatch.setenv(name, "enabled")
    with pytest.raises(InvalidSwitch, match=f"{name} must be one of 1/true/yes/on .* got 'enabled'"):
        env_bool(name, False)
    assert issubclass(InvalidSwitch, UnsupportedCase)   # inside an op: handed back to SGLang, never a crash


def test_atomic_switch_reads_false_as_off(monkeypatch):
    """DSV4_HC_PRENORM_ATOMIC=false (and no / off) turns the atomic sums off, as 0 does."""
    from deepseek_v4_kernel.ops import hc_prenorm as hp
    for off in ("0", "false", "no", "OFF"):
        monkeypatch.setenv("DSV4_HC_PRENORM_ATOMIC", off)
        assert hp.deterministic_sums() and not hp.atomic_enabled()
    monkeypatch.setenv("DSV4_HC_PRENORM_ATOMIC", "true")
    assert hp.atomic_enabled() == (not hp.deterministic_sums())


@pytest.mark.parametrize("visible, expected", [(None, [0, 1, 2, 3]), ("-1", []), ("", []), ("2,0", [2, 0]),
                                               ("1,-1,2", [1]), ("0,9,1", [0]), ("1,1", [1]),
                                               ("GPU-8a3c", [0, 1, 2, 3]), ("MIG-1/2/3", [0, 1, 2, 3])])
def test_cuda_visible_devices_read_as_cuda_reads_it(monkeypatch, visible, expected):
    """CUDA stops at the first invalid entry of CUDA_VISIBLE_DEVICES (-1 hides every GPU); UUIDs and MIG names,
    which the NVML probe cannot map, make it look at every GPU."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert policy._visible_indices(4) == expected


def test_slower_fallbacks_are_said_once(monkeypatch, caplog):
    """fp4_moe and hc_prenorm say (once, WARNING) when their compiled kernels cannot take a call they would take by
    default and a slower Triton kernel runs instead (here: the library does not load)."""
    torch = pytest.importorskip("torch")
    from deepseek_v4_kernel.ops import _stats, fp4_moe, hc_prenorm

    monkeypatch.setattr(_stats, "FALLBACKS", type(_stats.FALLBACKS)())
    monkeypatch.delenv("DSV4_FP4_MOE_IMPL", raising=False)
    monkeypatch.delenv("DSV4_HC_PRENORM_IMPL", raising=False)
    monkeypatch.setattr(fp4_moe.dispatch, "_interp", lambda: False)
    monkeypatch.setattr(fp4_moe.dispatch, "_cuda_decode_unsupported", lambda *a: "the library does not load")
    monkeypatch.setattr(fp4_moe.dispatch, "_cuda_stream_unsupported", lambda *a: "the library does not load")
    x, w13, w2 = torch.zeros(2, 256, dtype=torch.bfloat16), torch.zeros(8, 512, 128, dtype=torch.uint8), \
        torch.zeros(8, 256, 128, dtype=torch.uint8)
    monkeypatch.setattr(hc_prenorm.dispatch, "_interpret", lambda: False)
    monkeypatch.setattr(hc_prenorm.dispatch, "auto_prefers_cuda", lambda *a: True)
    monkeypatch.setattr(hc_prenorm.dispatch, "cuda_unsupported", lambda *a: "the library does not load")
    xh, fn = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(24, 256)
    with caplog.at_level(logging.WARNING, logger="deepseek_v4_kernel"):
        for _ in range(3):
            assert fp4_moe.pick_impl(x, w13, w2, 6) not in ("cuda_decode", "cuda_stream")
            assert hc_prenorm.pick_impl(xh, fn, 1) == "triton"
    assert caplog.text.count("fp4_moe: the compiled decode kernels cannot take a call of 12 slots") == 1
    assert caplog.text.count("hc_prenorm: the compiled kernel cannot take a call of m = 4 rows") == 1
    assert sum(_stats.FALLBACKS.values()) == 6

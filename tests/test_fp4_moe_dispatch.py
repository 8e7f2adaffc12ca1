"""fp4_moe's dispatch rules, shapes and versions only (docs/fp4_moe.md section 4): split-K, the streaming kernels'
variant and launch plan, the default impl per compute capability, regime and Triton version, and the sm_120a AOT
compile of the picked Triton tiles (shared memory, mma.sync only)."""
import os

import pytest
import torch

from aot_errors import skip_or_fail

from deepseek_v4_kernel.ops import fp4_moe as op


def test_split_k_rule():
    """Shapes only: split while the grid is under SPLIT_PROGRAMS_PER_SM per SM, >= 2 K steps each."""
    assert op.split_k(384, 4096, 128, 132) == 4      # 1 token, gemm1 on an H100
    assert op.split_k(768, 2048, 128, 132) == 2      # the rule alone (gemm2 uses it only on request)
    assert op.split_k(3264, 4096, 128, 132) == 1     # 8 tokens: enough programs already
    assert op.split_k(10, 256, 128, 132) == 1        # one K step per split would be left
    assert op.split_k(1, 1 << 20, 128, 1000) == op.MAX_SPLIT_K


def test_stream_default_variant_rule():
    """The default variant (dispatch.stream_default_variant, measured on an H200): the 4-block register ring up to 24
    slots (4 tokens at top-6) and wherever shared memory cannot hold four 52 KB blocks per SM (SM120's 100 KB); the
    4-block shared-memory ring with two MMA chains above 24 slots on 228 KB GPUs (H100 / H200)."""
    d = op.dispatch
    assert d.STREAM_DEFAULT_VARIANT is None
    assert [d.stream_default_variant(S, 228) for S in (6, 24, 25, 48, 1536)] == [1, 1, 5, 5, 5]
    assert [d.stream_default_variant(S, 100) for S in (6, 24, 25, 1536)] == [1, 1, 1, 1]
    assert d.stream_default_variant(96) == 1                     # unknown shared memory: the small-memory choice
    assert d.stream_plan(16, 6, 256, 4096, 2048, 132, None, 228)["variant"] == 5
    assert d.stream_plan(16, 6, 256, 4096, 2048, 188, None, 100)["variant"] == 1
    assert d.stream_plan(16, 6, 256, 4096, 2048, 132, {"variant": 0}, 228)["variant"] == 0


def test_stream_plan_rule():
    """Shapes only (docs/fp4_moe.md section 4): the fewest warps per item (1, 2, 4) that give every warp of the
    grid >= STREAM_BALANCE items, at most the K steps; DeepSeek-V4-Flash (E 256, top-6, hidden 4096) on 132 SMs."""
    plan = op.dispatch.stream_plan
    assert op.dispatch.stream_items_bound(6, 256, 128) == 768          # 1 token: 6 experts x 128 row tiles
    assert op.dispatch.stream_items_bound(48, 256, 128) == (48 + 6) * 128
    assert op.dispatch.stream_items_bound(1536, 256, 128) == (256 + 192) * 128
    V0 = {"variant": 0}
    # variant 0: 3 blocks x 4 warps per SM = 1584 warps; 1 token: 768 items -> 4 warps each (3072 < 3168 still)
    assert plan(1, 6, 256, 4096, 2048, 132, V0) == {"variant": 0, "blocks_per_sm": 0, "wpi1": 4, "wpi2": 4}
    assert plan(2, 6, 256, 4096, 2048, 132, V0)["wpi1"] == 2               # 13 passes x 128 x 2 >= 3168
    assert plan(8, 6, 256, 4096, 2048, 132, V0)["wpi1"] == 1
    # TP 8 (I = 256): gemm2's K is 2 steps, so at most 2 warps per item
    assert plan(1, 6, 256, 4096, 256, 132, V0)["wpi2"] == 2
    assert plan(1, 6, 256, 4096, 256, 132, V0)["wpi1"] == 4
    # variant 1 (4 blocks per SM) has more warps to feed: 2 tokens need 4 warps per item there
    assert plan(2, 6, 256, 4096, 2048, 132, {"variant": 1})["wpi1"] == 4
    # a smaller card (24 SMs) reaches 1 warp per item sooner
    assert plan(2, 6, 256, 4096, 2048, 24, V0)["wpi1"] == 1
    assert plan(1, 6, 256, 4096, 2048, 132, {"variant": 0, "wpi1": 2, "blocks_per_sm": 1}) == {
        "variant": 0, "blocks_per_sm": 1, "wpi1": 2, "wpi2": 2}           # 1 block per SM: 528 warps, 768 x 2 >= 1056
    for bad in ({"variant": 6}, {"wpi1": 3}, {"blocks_per_sm": -1}, {"stages": 4}):
        with pytest.raises(ValueError):
            plan(1, 6, 256, 4096, 2048, 132, bad)
    assert op.dispatch.stream_wpi(10, 1, 1000) == 1                   # K of one step: one warp



@pytest.mark.gpu
def test_default_impl_by_capability():
    if os.environ.get("DSV4_FP4_MOE_IMPL"):
        pytest.skip("DSV4_FP4_MOE_IMPL set")
    major = torch.cuda.get_device_capability()[0]
    want = dict(op.DEFAULT_IMPL_CC10 if major >= 10 else op.DEFAULT_IMPL_SM90)
    if op.dispatch.triton_version() > op.DEQUANT_DECODE_MAX_TRITON:
        want = {k: "dot_scaled" if v == "dequant" else v for k, v in want.items()}
    for name in ("decode", "mid", "prefill"):
        assert op.default_impl(name) == want[name]
    assert op.regime(1, 6, 256) == "decode" and op.regime(8192, 6, 256) == "prefill"


@pytest.mark.parametrize("cc, version, decode", [((12, 0), (3, 6), "dequant"), ((12, 0), (3, 8), "dot_scaled"),
                                                 ((9, 0), (3, 6), "dequant"), ((9, 0), (3, 8), "dot_scaled"),
                                                 ((12, 0), (3, 5), "dequant"), ((12, 0), (4, 1), "dot_scaled")])
def test_default_impl_decode_regime_by_triton_version(monkeypatch, cc, version, decode):
    """H100: triton 3.8.0 builds "dequant" through shared memory and it lost 1.4x to "dot_scaled" at 64-256
    tokens; so the decode regime takes "dequant" only up to DEQUANT_DECODE_MAX_TRITON, and the other regimes keep
    their table's impl under every version."""
    monkeypatch.delenv("DSV4_FP4_MOE_IMPL", raising=False)
    monkeypatch.setattr(op.dispatch, "_interp", lambda: False)
    monkeypatch.setattr(op.dispatch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(op.dispatch.torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(op.dispatch, "triton_version", lambda: version)
    table = op.DEFAULT_IMPL_CC10 if cc[0] >= 10 else op.DEFAULT_IMPL_SM90
    assert op.default_impl("decode", "cuda") == decode
    assert op.default_impl("mid", "cuda") == table["mid"] and op.default_impl("prefill", "cuda") == table["prefill"]



# ----------------------------------------------------------------------------- sm_120 AOT (CPU)
@pytest.fixture(scope="module")
def sm120_aot():
    """Compile the picked tiles at DeepSeek-V4 shapes for sm_120a in a subprocess (the test
    process runs Triton in interpreter mode): mxfp8 (the cc >= 10 default at mid and prefill) at
    every regime, the exact impls at decode (dequant is the cc >= 10 default there; "decode1" = 1
    token, the split-K variants) and prefill (their largest tiles)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    script = os.path.join(root, "tools", "aot_fp4_moe.py")
    recs = []
    for impls, labels in (("mxfp8", "decode,mid,prefill"), ("dequant,dot_scaled", "decode1,decode,prefill")):
        r = subprocess.run([sys.executable, script, "--arch", "120", "--impls", impls,
                            "--labels", labels], env=env, capture_output=True, text=True,
                           timeout=600, cwd=root)
        if r.returncode != 0:
            skip_or_fail(r.stderr, "sm_120 AOT compile")
        recs += [json.loads(ln[3:]) for ln in r.stdout.splitlines() if ln.startswith("AOT")]
    return recs


def test_sm120_aot_smem_and_instructions(sm120_aot):
    """<= 101376 B shared memory, mma.sync only (no wgmma/tcgen05, absent on SM120), and the
    mxfp8 impl lowers to the native block-scaled MMA (kind::mxf8f6f4)."""
    assert len(sm120_aot) == 18
    assert all(d["config"]["SPLIT_K"] > 1 for d in sm120_aot if d["label"] == "decode1")
    for d in sm120_aot:
        assert "error" not in d, d
        assert d["shared"] <= op.SMEM_LIMIT, d
        assert d["mma_sync"] and not d["wgmma"] and not d["tcgen05"], d
        if d["impl"] == "mxfp8":
            assert d["mxf8f6f4"] and d["block_scale"], d
        else:
            assert not d["block_scale"], d

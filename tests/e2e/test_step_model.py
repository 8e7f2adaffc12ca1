"""The decode step's arithmetic: bytes per op against hand counts of DeepSeek-V4-Flash's shapes, floors, servers'
memory and round size, the depth at which the GPU dominates at one stream, and the run plan's budgets."""
import pytest

import e2e_env  # noqa: F401
import model_config as mc
import run_plan as rp
import step_model as sm

C4 = mc.make_config()                      # the 4-layer model of the earlier runs (memory reference)
C12 = mc.make_config(layers=mc.DEFAULT_LAYERS)


def test_layer_weights_by_hand():
    fp8_c0 = (1024 * 4096 + 8 * 32 * 4) + (512 * 4096 + 4 * 32 * 4) \
        + (32768 * 1024 + 256 * 8 * 4) + (4096 * 8192 + 32 * 64 * 4) \
        + (4096 * 4096 + 32 * 32 * 4) + (4096 * 2048 + 32 * 16 * 4)        # wq_a wkv wq_b wo_b, shared gate_up down
    bf16_c0 = 8192 * 4096 * 2 + 256 * 4096 * 2                                 # wo_a, router
    mhc = 2 * 24 * 16384 * 4
    assert sm.layer_weight_bytes(C4, 0) == {"fp8_linear": fp8_c0, "bf16_linear": bf16_c0, "mhc": mhc}
    c4 = sm.layer_weight_bytes(C4, 4)
    assert c4["fp8_linear"] == fp8_c0 + 8192 * 1024 + 64 * 8 * 4            # + the indexer's wq_b
    assert c4["bf16_linear"] == bf16_c0 + 2048 * 4096 * 2 + 512 * 4096 * 2 + 64 * 4096 * 2
    assert sm.layer_weight_bytes(C4, 128)["bf16_linear"] == bf16_c0 + 1024 * 4096 * 2
    # TP 2: column/row-parallel halves, replicated ones stay
    tp2 = sm.layer_weight_bytes(C4, 0, tp=2)
    assert tp2["bf16_linear"] == 4096 * 4096 * 2 + 256 * 4096 * 2
    assert fp8_c0 / 2 < tp2["fp8_linear"] < fp8_c0


def test_expert_bytes_and_distinct_experts():
    assert sm.expert_bytes(C4) == (3 * 2048 * 4096) // 2 + (3 * 2048 * 4096) // 32 == 13_369_344   # 13.4 MB
    assert sm.expert_bytes(C4, tp=2) == 13_369_344 // 2
    assert sm.expert_bytes(C4, scale_bytes=4) == 13_369_344 + 3 * (3 * 2048 * 4096) // 32
    assert sm.expected_distinct_experts(1) == pytest.approx(6.0)
    assert sm.expected_distinct_experts(8) == pytest.approx(256 * (1 - (250 / 256) ** 8))
    assert 6 * 8 > sm.expected_distinct_experts(8) > 40      # a few collisions
    assert sm.expected_distinct_experts(4096) == pytest.approx(256, abs=1e-6)
    assert sm.expected_distinct_experts(0) == 0


def test_kv_rows():
    assert sm.kv_rows_per_token(C4, 0, 3000) == {"sparse_mla": 128, "indexer": 0}
    assert sm.kv_rows_per_token(C4, 4, 3000) == {"sparse_mla": 128 + 512, "indexer": 750}
    assert sm.kv_rows_per_token(C4, 4, 1000) == {"sparse_mla": 128 + 250, "indexer": 250}
    assert sm.kv_rows_per_token(C4, 128, 3000) == {"sparse_mla": 128 + 23, "indexer": 0}
    assert sm.kv_rows_per_token(C4, 0, 50)["sparse_mla"] == 50


def test_step_bytes_sum_the_layers_and_scale_with_streams():
    one, eight = sm.step_bytes(C12, 1, 3000), sm.step_bytes(C12, 8, 3000)
    layers = [sm.layer_weight_bytes(C12, r) for r in C12["compress_ratios"]]
    assert one["fp8_linear"] == sum(w["fp8_linear"] for w in layers)
    assert one["bf16_linear"] == sum(w["bf16_linear"] for w in layers) + 129280 * 4096 * 2   # + lm_head
    assert one["mhc"] == sum(w["mhc"] for w in layers) + 4 * 16384 * 4                      # + hc head
    assert one["moe_experts"] == pytest.approx(12 * 6 * 13_369_344)
    assert eight["fp8_linear"] == one["fp8_linear"]                         # weights: once per step
    assert eight["sparse_mla"] == 8 * one["sparse_mla"]                     # rows: per token
    rows = 3 * 128 + 6 * (128 + 512) + 3 * (128 + 23)
    assert one["sparse_mla"] == rows * 584 and one["indexer"] == 6 * 750 * 132


def test_floors():
    got = sm.floors({"fp8_linear": 4.0e9, "mhc": 1e6}, {"fp8_linear": 2000.0, "other": 5.0}, 4.0e12)
    assert got["fp8_linear"] == {"bytes": 4.0e9, "floor_us": pytest.approx(1000.0), "us": 2000.0,
                                 "pct_of_floor": pytest.approx(50.0)}
    assert got["other"]["floor_us"] is None and got["other"]["pct_of_floor"] is None
    assert got["mhc"]["us"] is None and got["mhc"]["pct_of_floor"] is None
    assert sm.floors({"fp8_linear": 1.0}, {"fp8_linear": 1.0}, None)["fp8_linear"]["floor_us"] is None


def test_memory_and_round_size():
    # the arithmetic scaled to what the 4-layer servers held reproduces it
    for s in "abc":
        assert sm.server_gib(C4, s, C4) == pytest.approx(sm.MEASURED_4_LAYER_WEIGHTS_GIB[s] + sm.SERVER_OVERHEAD_GIB)
    assert 1.0 < sm.MEASURED_4_LAYER_WEIGHTS_GIB["a"] * 2 ** 30 / sm.weight_bytes(C4, "a") < 1.2
    assert sm.weight_bytes(C4, "b") > sm.weight_bytes(C4, "a")          # fp32 expert scales on the Triton runner
    big = [sm.server_gib(C12, s, C4) for s in "abc"]
    assert 50 < max(big) < 65
    assert sm.servers_at_once(big) == 2                                  # 12 layers: two servers per H200
    assert sm.servers_at_once([sm.server_gib(C4, s, C4) for s in "abc"]) == 4
    assert sm.servers_at_once([200.0]) == 1
    # the static fraction keeps SGLang's slack under half of what the round leaves free
    n, f = 2, max(big)
    frac = sm.mem_fraction_static(n, f)
    assert sm.GPU_GIB * (1 - frac) <= (sm.GPU_GIB - n * f) / 2 + 0.1
    assert sm.mem_fraction_static(1, 20.0) == 0.7 and sm.mem_fraction_static(4, 40.0) == 0.95
    plan = rp.servers_per_round(C12, C4, ["a", "b", "c"])
    assert plan["servers_at_once"] == 2 and plan["mem_fraction_static"] == frac


def test_depth_is_the_fewest_whole_patterns_with_the_gpu_dominating():
    depth = sm.choose_depth()
    assert depth == mc.DEFAULT_LAYERS == 12
    assert all(sm.gpu_fraction(depth, s) >= 0.8 for s in "abc")
    assert any(sm.gpu_fraction(depth - 4, s) < 0.8 for s in "abc")
    # the 4-layer model was host-bound at one stream in (b) and (c), as issue 59's numbers say
    assert sm.gpu_fraction(4, "b", pessimistic=False) < 0.6 and sm.gpu_fraction(4, "c", pessimistic=False) < 0.6
    # a faster host needs fewer layers; an unreachable target is an error, not a silent depth
    fast = dict(sm.DEPTH_MODEL, host_us=1400.0)
    assert sm.choose_depth(model=fast) < depth
    with pytest.raises(ValueError, match="no depth"):
        sm.choose_depth(model=dict(sm.DEPTH_MODEL, target=1.5))
    rows = sm.depth_table([4, 12])
    assert rows[1]["layers"] == 12 and rows[1]["c_fraction"] >= 0.8


def test_work_budget_follows_depth_and_setup():
    lengths = [17, 64, 129, 300, 513, 1000, 2100, 3000]
    kw = dict(correctness_lengths=lengths, new_tokens=32, throughput=False, profile=True,
              profile_concurrencies=(1, 8, 32), profile_prompt_tokens=2048, profile_window_s=1.0)
    a12, a4, b12 = rp.work_s("a", 12, **kw), rp.work_s("a", 4, **kw), rp.work_s("b", 12, **kw)
    assert a12 > a4 > b12 > 0
    assert a12 < 200 and b12 < 60          # what the two-call plan of tools/e2e/README.md counts on
    assert rp.work_s("b", 12, **dict(kw, profile=False)) < b12
    assert rp.work_s("b", 12, soak=True, **kw) == rp.SOAK_S
    assert rp.correctness_tokens([10, 20], 4) == 30 + 30 + 8

"""The few-layer DeepSeek-V4-Flash config: real widths, every layer kind, and the field names SGLang 0.5.17 reads."""
import json
import os
import re

import pytest

import e2e_env  # noqa: F401
import model_config as mc
from e2e_env import SGLANG_VERSION


def test_default_config_covers_every_layer_kind():
    config = mc.make_config()
    assert mc.coverage_problems(config) == []
    kinds = mc.layer_kinds(config)
    assert {k["compress_ratio"] for k in kinds} == {0, 4, 128}
    assert {k["routing"] for k in kinds} == {"hash", "gate"}
    assert config["num_nextn_predict_layers"] == 1


def test_real_widths():
    c = mc.make_config()
    expected = {"hidden_size": 4096, "num_attention_heads": 64, "q_lora_rank": 1024, "o_lora_rank": 1024,
                "o_groups": 8, "head_dim": 512, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64,
                "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1,
                "moe_intermediate_size": 2048, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
                "window_size": 128, "hc_mult": 4}
    assert {k: c[k] for k in expected} == expected
    assert c["quantization_config"]["quant_method"] == "fp8"
    assert c["quantization_config"]["weight_block_size"] == [128, 128]


def test_coverage_problems_name_what_is_missing():
    config = mc.make_config(compress_ratios=(4, 4), hash_layers=2)
    problems = mc.coverage_problems(config)
    assert "no layer with compress ratio 0" in problems
    assert "no layer with compress ratio 128" in problems
    assert "no gate-routed MoE layer" in problems


@pytest.mark.parametrize("kwargs,needle", [
    ({"compress_ratios": (0, 8)}, "compress_ratios"),
    ({"hash_layers": 9}, "hash_layers"),
    ({"mtp_layers": 2}, "mtp_layers"),
])
def test_bad_arguments_are_refused_by_name(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        mc.make_config(**kwargs)


def test_cli_writes_config(tmp_path, capsys):
    assert mc.main([str(tmp_path), "--compress-ratios", "0,4,128,4", "--hash-layers", "3", "--layers", "4"]) == 0
    with open(os.path.join(tmp_path, "config.json")) as f:
        assert json.load(f) == mc.make_config()
    assert "NOT covered" not in capsys.readouterr().out
    # the default depth: the pattern repeated to DEFAULT_LAYERS
    assert mc.main([str(tmp_path)]) == 0
    with open(os.path.join(tmp_path, "config.json")) as f:
        assert json.load(f) == mc.make_config(layers=mc.DEFAULT_LAYERS)


def test_config_at_the_chosen_depth_keeps_every_layer_kind_and_its_share():
    """The harness's depth (DEFAULT_LAYERS, step_model.choose_depth): the 0 / 4 / 128 / 4 pattern repeated, the real
    model's 3 hash-routed layers first, learned-gate layers after, the MTP layer, real widths."""
    config = mc.make_config(layers=mc.DEFAULT_LAYERS)
    assert config["num_hidden_layers"] == mc.DEFAULT_LAYERS == 12
    assert config["compress_ratios"] == [0, 4, 128, 4] * 3
    assert mc.coverage_problems(config) == []
    kinds = mc.layer_kinds(config)
    assert [k["routing"] for k in kinds] == ["hash"] * 3 + ["gate"] * 9
    counts = {r: sum(k["compress_ratio"] == r for k in kinds) for r in mc.ALLOWED_RATIOS}
    assert counts == {0: 3, 4: 6, 128: 3}    # the pattern's shares: 1/4, 1/2, 1/4
    assert config["num_nextn_predict_layers"] == 1 and config["hidden_size"] == 4096
    assert {k: v for k, v in config.items() if k not in ("compress_ratios", "num_hidden_layers")} == \
        {k: v for k, v in mc.make_config().items() if k not in ("compress_ratios", "num_hidden_layers")}


def test_depth_repeats_and_cuts_the_pattern():
    assert mc.ratios_for_depth(6) == [0, 4, 128, 4, 0, 4]
    assert mc.ratios_for_depth(3, (4, 128)) == [4, 128, 4]
    assert mc.make_config((0, 4, 128, 4), layers=5)["compress_ratios"] == [0, 4, 128, 4, 0]
    with pytest.raises(ValueError, match="layers must be >= 1"):
        mc.ratios_for_depth(0)
    # too shallow for every kind: named, not hidden
    assert "no layer with compress ratio 128" in mc.coverage_problems(mc.make_config(layers=2, hash_layers=1))
    assert "no gate-routed MoE layer" in mc.coverage_problems(mc.make_config(layers=3))


def _src(rel):
    from sglang_env import sglang_dir

    with open(os.path.join(sglang_dir(SGLANG_VERSION), "sglang", rel)) as f:
        return f.read()


def test_hash_layers_use_the_name_sglang_reads():
    # deepseek_v2.py builds the hash-routed MoE from num_hash_layers; n_hash_layers alone would build none
    src = _src("srt/models/deepseek_v2.py")
    assert 'getattr(config, "num_hash_layers", 0)' in src
    assert "config.n_hash_layers" not in src and '"n_hash_layers"' not in src
    assert mc.make_config()["num_hash_layers"] == mc.DEFAULT_HASH_LAYERS


def test_every_config_attribute_the_model_reads_is_written():
    # SGLang's config object does not apply DeepSeekV4Config's defaults: a missing field is an AttributeError
    attrs = set()
    for rel in ("srt/models/deepseek_v4.py", "srt/models/deepseek_v4_nextn.py"):
        attrs |= set(re.findall(r"\bconfig\.([a-z][a-z0-9_]*)\b", _src(rel)))
    config = mc.make_config()
    # set by SGLang or transformers, or methods: not config.json fields
    not_fields = {"to_dict", "get_text_config", "architectures", "quantization_config", "torch_dtype", "dtype"}
    missing = sorted(a for a in attrs - not_fields if a not in config)
    assert missing == [], f"config.json lacks fields deepseek_v4.py reads: {missing}"


def test_experts_are_mxfp4_by_default_with_dummy_weights():
    # no safetensors -> try_detect_fp4_experts returns None -> SGLANG_DSV4_FP4_EXPERTS's default (True) stays
    assert "SGLANG_DSV4_FP4_EXPERTS = EnvBool(True)" in _src("srt/environ.py")
    cfg = _src("srt/configs/model_config.py")
    assert "self.is_fp4_experts = envs.SGLANG_DSV4_FP4_EXPERTS.get()" in cfg
    assert "if detected is not None:" in cfg

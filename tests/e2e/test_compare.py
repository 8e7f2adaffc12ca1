"""Token/logprob agreement on synthetic outputs, including cases that must fail."""
import pytest

import e2e_env  # noqa: F401
import compare as cmp


def steps(tokens, logprob=-0.5, margin=2.0):
    return [cmp.Step(t, logprob, [(logprob, t), (logprob - margin, t + 1)]) for t in tokens]


def test_identical_outputs_pass():
    ref = [steps([5, 6, 7]), steps([8, 9])]
    res = cmp.compare("b", ref, "c", ref)
    s = res.summary()
    assert res.ok and s["identical_prompts"] == 2 and s["positions_agreed"] == 5 and s["max_logprob_diff"] == 0


def test_difference_at_a_near_tie_is_allowed_and_stops_the_prompt():
    ref = steps([5, 6, 7, 8])
    ref[2] = cmp.Step(7, -0.70, [(-0.70, 7), (-0.74, 99)])   # reference nearly undecided at position 2
    cand = steps([5, 6, 99, 1])
    res = cmp.compare("b", [cand], "c", [ref], margin=0.1)
    p = res.prompts[0]
    assert res.ok and p.first_difference == 2 and p.difference_allowed and p.compared == 3 and p.agreed == 2
    assert p.reference_margin_at_difference == pytest.approx(0.04)


def test_difference_at_a_clear_position_fails():
    ref = steps([5, 6, 7], margin=1.0)
    cand = steps([5, 42, 7])
    res = cmp.compare("b", [cand], "c", [ref], margin=0.1)
    assert not res.ok and res.summary()["disallowed_differences"] == 1


def test_logprob_outside_tolerance_fails():
    ref = steps([5, 6, 7], logprob=-0.5)
    cand = steps([5, 6, 7], logprob=-0.5)
    cand[1] = cmp.Step(6, -0.75, cand[1].top)
    res = cmp.compare("b", [cand], "c", [ref], logprob_tol=0.1)
    assert not res.ok and res.prompts[0].logprob_violations == [1]
    assert res.summary()["max_logprob_diff"] == pytest.approx(0.25)


def test_short_output_fails_and_no_prompts_is_not_a_pass():
    assert not cmp.compare("b", [steps([5, 6])], "c", [steps([5, 6, 7])]).ok
    assert not cmp.compare("b", [], "c", []).ok


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="prompts"):
        cmp.compare("b", [steps([1])], "c", [])
    with pytest.raises(ValueError, match="margin"):
        cmp.compare("b", [], "c", [], margin=0)


def test_steps_from_sglang_meta_info():
    meta = {"output_token_logprobs": [[-0.1, 11, None], [-0.2, 12, None]],
            "output_top_logprobs": [[[-0.1, 11, None], [-2.0, 3, None]], [[-0.2, 12, None], [-0.3, 4, None]]]}
    s = cmp.steps_from_meta(meta)
    assert [x.token for x in s] == [11, 12] and s[1].margin == pytest.approx(0.1)
    with pytest.raises(ValueError, match="positions"):
        cmp.steps_from_meta({"output_token_logprobs": [[-0.1, 1, None]], "output_top_logprobs": []})


def test_outputs_without_logprobs_compare_tokens_only():
    nan = float("nan")
    ref = steps([5, 6, 7])
    cand = [cmp.Step(t, nan, []) for t in (5, 6, 7)]
    assert cmp.compare("mtp", [cand], "c", [ref]).ok
    assert not cmp.compare("mtp", [[cmp.Step(t, nan, []) for t in (5, 9, 7)]], "c", [ref]).ok


def test_closeness_summarises_prefix_first_token_and_logprob_diffs():
    ref = [steps([5, 6, 7, 8]), steps([1, 2, 3, 4])]
    cand = [steps([5, 6, 9, 8], logprob=-0.7), steps([9, 2, 3, 4])]
    k = cmp.compare("b", cand, "c", ref, margin=0.1, logprob_tol=0.1).summary()["closeness"]
    assert k["mean_agreed_prefix"] == 1.0 and k["first_token_differences"] == 1
    assert k["median_logprob_diff"] == pytest.approx(0.2)


def test_forced_scores_compare_position_by_position():
    ref = [{"token_logprobs": [[None, 5], [-0.5, 6], [-1.0, 7]], "top_logprobs": [[], [[-0.5, 6]], [[-1.0, 7]]]}]
    cand = [{"token_logprobs": [[None, 5], [-0.7, 6], [-1.0, 7]], "top_logprobs": [[], [[-0.7, 6]], [[-0.9, 8]]]}]
    f = cmp.forced("b", cand, "c", ref)
    assert f["positions"] == 2 and f["max_logprob_diff"] == pytest.approx(0.2) and f["same_top_token"] == 0.5

"""Token-for-token agreement of two setups' greedy outputs (pure Python: the CI tests run it on synthetic data).

A prompt's output is a list of steps; each step is (chosen token id, its logprob, [(logprob, token id) of the top 2]).
Against the reference (setup c), a candidate agrees at a position when it chose the same token; there the chosen
token's logprobs must agree within ``logprob_tol``. At the first position where the tokens differ, the difference
is allowed only if the reference itself was nearly undecided there: its top-2 logprobs within ``margin``. After the
first difference the contexts differ, so the rest of that prompt is not compared.

``closeness`` condenses a comparison into what can be set against another pair's: the mean agreed prefix (tokens
before the first difference), the prompts whose first token already differs (that token comes from the prefill of
the same prompt: identical inputs) and the median chosen-token logprob difference at agreed positions. The report
sets (b) vs (c) against (a) vs (c), SGLang's own SM120 path, and both against the native noise floor (c) vs (c)
under another batching (graphs vs eager): with random weights a greedy run amplifies rounding differences that
DeepSeek's own kernels show between their own two modes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

DEFAULT_MARGIN = 0.1       # nats: (c)'s top-1 minus top-2 logprob below this makes a position a near tie
DEFAULT_LOGPROB_TOL = 0.1  # nats: |candidate - reference| logprob of the same chosen token


@dataclass
class Step:
    token: int
    logprob: float
    top: List[Tuple[float, int]]  # the top-2 (logprob, token id), best first

    @property
    def margin(self) -> Optional[float]:
        if len(self.top) < 2:
            return None
        return self.top[0][0] - self.top[1][0]


@dataclass
class PromptResult:
    prompt: int
    compared: int = 0                 # positions checked (up to and including a first difference)
    agreed: int = 0                   # positions with the same token
    first_difference: Optional[int] = None
    difference_allowed: Optional[bool] = None
    reference_margin_at_difference: Optional[float] = None
    max_logprob_diff: float = 0.0
    logprob_diffs: List[float] = field(default_factory=list)      # |candidate - reference| at agreed positions
    logprob_violations: List[int] = field(default_factory=list)  # positions over the tolerance
    length_mismatch: bool = False

    @property
    def ok(self) -> bool:
        return (not self.logprob_violations and not self.length_mismatch
                and (self.first_difference is None or bool(self.difference_allowed)))


@dataclass
class Comparison:
    candidate: str
    reference: str
    margin: float
    logprob_tol: float
    prompts: List[PromptResult]

    @property
    def ok(self) -> bool:
        return bool(self.prompts) and all(p.ok for p in self.prompts)

    def summary(self) -> Dict[str, object]:
        diffs = [p for p in self.prompts if p.first_difference is not None]
        return {
            "candidate": self.candidate, "reference": self.reference, "pass": self.ok,
            "margin": self.margin, "logprob_tol": self.logprob_tol,
            "prompts": len(self.prompts),
            "identical_prompts": sum(1 for p in self.prompts if p.first_difference is None and not p.length_mismatch),
            "positions_compared": sum(p.compared for p in self.prompts),
            "positions_agreed": sum(p.agreed for p in self.prompts),
            "allowed_differences": sum(1 for p in diffs if p.difference_allowed),
            "disallowed_differences": sum(1 for p in diffs if not p.difference_allowed),
            "logprob_violations": sum(len(p.logprob_violations) for p in self.prompts),
            "max_logprob_diff": max((p.max_logprob_diff for p in self.prompts), default=0.0),
            "closeness": closeness([asdict(p) for p in self.prompts]),
            "per_prompt": [asdict(p) | {"ok": p.ok} for p in self.prompts],
        }


def closeness(per_prompt: Sequence[Dict[str, object]]) -> Dict[str, object]:
    """Mean agreed prefix, first-token differences and the median agreed-position logprob difference of a
    comparison's per-prompt records (also of older records without logprob_diffs: that entry is then None)."""
    n = len(per_prompt)
    diffs = sorted(d for p in per_prompt for d in (p.get("logprob_diffs") or []))
    return {
        "prompts": n,
        "mean_agreed_prefix": sum(p["agreed"] for p in per_prompt) / n if n else None,
        "first_token_differences": sum(1 for p in per_prompt if p.get("first_difference") == 0),
        "median_logprob_diff": diffs[len(diffs) // 2] if diffs else None,
    }


def steps_from_meta(meta: Dict[str, object]) -> List[Step]:
    """Steps from SGLang's /generate meta_info with return_logprob and top_logprobs_num=2: output_token_logprobs is
    [[logprob, token id, text], ...]; output_top_logprobs is, per position, [[logprob, token id, text], ...]."""
    chosen = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs")
    if tops is None:  # top_logprobs_num not asked for
        tops = [[] for _ in chosen]
    if len(tops) != len(chosen):
        raise ValueError(f"output_top_logprobs has {len(tops)} positions, output_token_logprobs {len(chosen)}")
    steps = []
    for (lp, tok, *_), top in zip(chosen, tops):
        steps.append(Step(int(tok), float(lp), [(float(t[0]), int(t[1])) for t in (top or [])]))
    return steps


def compare_prompt(index: int, candidate: Sequence[Step], reference: Sequence[Step], margin: float,
                   logprob_tol: float) -> PromptResult:
    res = PromptResult(prompt=index)
    res.length_mismatch = len(candidate) != len(reference)
    for pos, (c, r) in enumerate(zip(candidate, reference)):
        res.compared += 1
        if c.token != r.token:
            res.first_difference = pos
            res.reference_margin_at_difference = r.margin
            res.difference_allowed = r.margin is not None and r.margin < margin
            res.length_mismatch = False  # lengths after a difference say nothing
            break
        res.agreed += 1
        if math.isnan(c.logprob) or math.isnan(r.logprob):
            continue  # an output without logprobs (speculative decoding may not give them): tokens only
        diff = abs(c.logprob - r.logprob)
        res.logprob_diffs.append(round(diff, 6))
        res.max_logprob_diff = max(res.max_logprob_diff, diff)
        if diff > logprob_tol:
            res.logprob_violations.append(pos)
    return res


def compare(candidate_name: str, candidate: Sequence[Sequence[Step]], reference_name: str,
            reference: Sequence[Sequence[Step]], margin: float = DEFAULT_MARGIN,
            logprob_tol: float = DEFAULT_LOGPROB_TOL) -> Comparison:
    if margin <= 0 or logprob_tol <= 0:
        raise ValueError(f"margin and logprob_tol must be > 0, got {margin} and {logprob_tol}")
    if len(candidate) != len(reference):
        raise ValueError(f"{candidate_name} has {len(candidate)} prompts, {reference_name} {len(reference)}")
    prompts = [compare_prompt(i, c, r, margin, logprob_tol) for i, (c, r) in enumerate(zip(candidate, reference))]
    return Comparison(candidate_name, reference_name, margin, logprob_tol, prompts)


def forced(candidate_name: str, candidate: Sequence[dict], reference_name: str,
           reference: Sequence[dict]) -> Dict[str, object]:
    """Two setups' teacher-forced scores of the same token sequences (workloads.run_forced): per position the
    difference of the forced token's logprob, and whether both put the same token on top."""
    diffs: List[float] = []
    same_top = positions = 0
    for c, r in zip(candidate, reference):
        for (clp, ctok), (rlp, rtok), ctop, rtop in zip(c["token_logprobs"], r["token_logprobs"],
                                                        c["top_logprobs"], r["top_logprobs"]):
            if ctok != rtok or clp is None or rlp is None:
                continue   # the first scored position may carry no logprob (nothing before it)
            positions += 1
            diffs.append(abs(float(clp) - float(rlp)))
            same_top += bool(ctop and rtop and ctop[0][1] == rtop[0][1])
    diffs.sort()
    pick = lambda q: diffs[min(len(diffs) - 1, int(q * len(diffs)))] if diffs else None  # noqa: E731
    return {"candidate": candidate_name, "reference": reference_name, "positions": positions,
            "median_logprob_diff": pick(0.5), "p90_logprob_diff": pick(0.9), "max_logprob_diff": diffs[-1] if diffs
            else None, "same_top_token": same_top / positions if positions else None}

"""How a harness call spends its minutes (pure): servers per round from their memory, SGLang's static memory fraction
for a round, and the seconds a ready session's requests take (the run stage starts measuring a session only when
they fit before the call's deadline; otherwise the server is left running for the next call).

Rates are the 2026-11-29 H200 run's (benchmarks/results/e2e.json, 4 layers, TP 1), scaled by depth: prefill work is
per layer, so a server of L layers prefills at 4 / L of the 4-layer rate.
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Sequence

import step_model as sm

PREFILL_TOK_S_4_LAYERS = {"a": 4284.0, "b": 43183.0, "c": 66671.0}   # 2K prompts
SAFETY = 1.3                 # on every rate-derived time
CORRECTNESS_FIXED_S = 10.0   # decode of 32 greedy tokens for the prompts, 4 at a time, and HTTP
PROFILE_FIXED_S = 7.0        # per concurrency: settle, trace export, writer check, stream teardown
THROUGHPUT_4_LAYERS_S = 120.0
SOAK_S = 300.0
STARTUP_S = {"cold": 300.0, "warm": 90.0}   # ready after start: cold JIT caches / the class's caches filled


def prefill_rate(setup: str, layers: int) -> float:
    return PREFILL_TOK_S_4_LAYERS[setup] * 4.0 / max(1, layers)


def correctness_tokens(lengths: Sequence[int], new_tokens: int, forced: bool = True) -> int:
    """Prompt tokens a session prefills: the prompts, and (teacher-forced scoring) each prompt with the reference's
    tokens once more."""
    return sum(lengths) + (sum(lengths) + len(lengths) * new_tokens if forced else 0)


def work_s(setup: str, layers: int, *, correctness_lengths: Sequence[int], new_tokens: int, throughput: bool,
           profile: bool, profile_concurrencies: Iterable[int], profile_prompt_tokens: int,
           profile_window_s: float, soak: bool = False, timed: bool = True) -> float:
    """Seconds the requests of a ready session take (an upper estimate)."""
    if soak:
        return SOAK_S
    rate = prefill_rate(setup, layers)
    need = CORRECTNESS_FIXED_S + SAFETY * correctness_tokens(correctness_lengths, new_tokens) / rate
    if timed and throughput:
        need += THROUGHPUT_4_LAYERS_S * max(1.0, layers / 4.0)
    if timed and profile:
        for conc in profile_concurrencies:
            need += PROFILE_FIXED_S + profile_window_s + SAFETY * conc * profile_prompt_tokens / rate
    return need


def servers_per_round(config: Mapping, reference_config: Mapping, setups: Iterable[str], tp: int = 1) -> Dict:
    """The round size that fits the GPU and the static fraction each server of such a round gets."""
    keys = sorted(set(setups)) or ["b"]
    footprints = {k: sm.server_gib(config, k, reference_config, tp) for k in keys}
    n = sm.servers_at_once(list(footprints.values()))
    return {"servers_at_once": n, "mem_fraction_static": sm.mem_fraction_static(n, max(footprints.values())),
            "server_gib": {k: round(v, 1) for k, v in footprints.items()}, "gpu_gib": sm.GPU_GIB}

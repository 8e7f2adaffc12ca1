"""What the harness sends to a running server: seeded prompts (token ids), the correctness requests, the throughput
measurements, the per-op profile of a decode step and the soak."""

from __future__ import annotations

import glob
import math
import os
import random
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

import server as srv

VOCAB = 129280
TOKEN_LOW, TOKEN_HIGH = 100, VOCAB - 1000  # clear of bos (0), eos (1) and the tail of the vocabulary
# correctness prompts: short to past 2K compressed tokens (C4 x top-512 selects sparsely from 2048 tokens on)
CORRECTNESS_LENGTHS = (17, 64, 129, 300, 513, 1000, 2100, 3000, 4100, 5000, 6000, 7000, 8200, 9000, 12000, 16500)


def prompt(seed: int, length: int) -> List[int]:
    rng = random.Random(seed * 1000003 + length)
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(length)]


def correctness_prompts(seed: int, n: int = 16) -> List[List[int]]:
    lengths = (CORRECTNESS_LENGTHS * (n // len(CORRECTNESS_LENGTHS) + 1))[:n]
    return [prompt(seed + i, length) for i, length in enumerate(lengths)]


def run_correctness(url: str, prompts: Sequence[List[int]], new_tokens: int, concurrency: int = 4,
                    logprobs: bool = True) -> List[dict]:
    """Greedy outputs with chosen-token and top-2 logprobs (meta_info as SGLang returns it), in prompt order;
    without logprobs, the chosen tokens carry NaN logprobs (compared as tokens only)."""
    def one(ids):
        out = srv.generate(url, srv.generate_request(ids, new_tokens, logprobs=logprobs))
        meta = out.get("meta_info", {})
        if not logprobs:
            ids_out = out.get("output_ids") or []
            return {"output_ids": ids_out, "output_token_logprobs": [[float("nan"), t] for t in ids_out],
                    "output_top_logprobs": [[] for _ in ids_out],
                    "completion_tokens": meta.get("completion_tokens"), "prompt_tokens": meta.get("prompt_tokens")}
        return {"output_ids": out.get("output_ids"),
                "output_token_logprobs": [[lp, tok] for lp, tok, *_ in meta.get("output_token_logprobs", [])],
                "output_top_logprobs": [[[t[0], t[1]] for t in (top or [])]
                                        for top in meta.get("output_top_logprobs", [])],
                "completion_tokens": meta.get("completion_tokens"), "prompt_tokens": meta.get("prompt_tokens")}
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def run_forced(url: str, prompts: Sequence[List[int]], reference_ids: Sequence[List[int]],
               concurrency: int = 4) -> List[dict]:
    """Teacher-forced scoring: each prompt followed by the reference's greedy tokens, one prefill that returns the
    logprob of every reference token and the top-2 there (input_token_logprobs from logprob_start_len = the prompt's
    length). Every setup scores the same token sequences, so no divergence cuts the comparison short."""
    def one(args):
        ids, ref = args
        body = srv.generate_request(list(ids) + list(ref), 1, logprobs=True)
        body["logprob_start_len"] = len(ids)
        meta = srv.generate(url, body).get("meta_info", {})
        chosen = meta.get("input_token_logprobs") or []
        tops = meta.get("input_top_logprobs") or [[] for _ in chosen]
        return {"token_logprobs": [[lp, tok] for lp, tok, *_ in chosen],
                "top_logprobs": [[[t[0], t[1]] for t in (top or [])] for top in tops]}
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, zip(prompts, reference_ids)))


def _stream_timed(url: str, ids: List[int], new_tokens: int) -> dict:
    """One streamed request: time to first token, and decode rate from the first to the last token."""
    t0 = time.time()
    first = last = None
    tokens = 0
    for t, chunk in srv.generate_stream(url, srv.generate_request(ids, new_tokens)):
        n = int(chunk.get("meta_info", {}).get("completion_tokens", 0))
        if n > 0 and first is None:
            first = t
        if n > tokens:
            tokens, last = n, t
    if first is None or tokens == 0:
        raise srv.ServerError("streamed request produced no tokens")
    decode_s = (last - first) if last and last > first else float("nan")
    return {"ttft_s": first - t0, "tokens": tokens, "decode_s": decode_s,
            "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else float("nan"),
            "total_s": (last or first) - t0}


def decode_rate(url: str, seed: int, context: int, concurrency: int, new_tokens: int) -> dict:
    """``concurrency`` simultaneous streams of ``context``-token prompts: per-stream and aggregate decode tok/s."""
    prompts = [prompt(seed + 7919 * i, context) for i in range(concurrency)]
    with ThreadPoolExecutor(concurrency) as pool:
        runs = list(pool.map(lambda p: _stream_timed(url, p, new_tokens), prompts))
    rates = [r["decode_tok_s"] for r in runs if not math.isnan(r["decode_tok_s"])]
    return {"context": context, "concurrency": concurrency, "new_tokens": new_tokens,
            "per_stream_tok_s": statistics.median(rates) if rates else None,
            "aggregate_tok_s": sum(rates) if rates else None,
            "median_ttft_s": statistics.median(r["ttft_s"] for r in runs)}


def prefill_rate(url: str, seed: int, length: int, repeats: int = 3) -> dict:
    """Prompts of ``length`` tokens, one at a time (distinct, so the radix cache never hits), one output token:
    prefill tok/s = length / time to first token."""
    times = []
    for i in range(repeats):
        t0 = time.time()
        srv.generate(url, srv.generate_request(prompt(seed + 104729 * (i + 1), length), 1))
        times.append(time.time() - t0)
    best = statistics.median(times)
    return {"prompt_tokens": length, "repeats": repeats, "median_s": best, "prefill_tok_s": length / best}


def throughput(url: str, seed: int, quick: bool = False) -> Dict[str, object]:
    """The issue's table for one setup: decode at concurrency 1/8/32 (2K context), prefill at 2K and 32K,
    decode at 64K context against 2K."""
    new = 32 if quick else 128
    srv.generate(url, srv.generate_request(prompt(seed + 1, 2048), 8))  # warm-up (graph shapes, JIT)
    out: Dict[str, object] = {"decode": [], "prefill": []}
    for conc in (1, 8, 32):
        decode_rate(url, seed + 50 + conc, 2048, conc, 8)  # warm-up of this batch size
        out["decode"].append(decode_rate(url, seed + 100 + conc, 2048, conc, new))
    for length in (2048, 32768):
        prefill_rate(url, seed + 200, length, repeats=1)  # warm-up of this chunking
        out["prefill"].append(prefill_rate(url, seed + 300 + length, length, repeats=2 if quick else 3))
    long_ctx = decode_rate(url, seed + 400, 65536, 1, new)
    short = out["decode"][0]
    out["decode_64k"] = long_ctx
    if long_ctx["per_stream_tok_s"] and short["per_stream_tok_s"]:
        out["decode_64k_vs_2k"] = long_ctx["per_stream_tok_s"] / short["per_stream_tok_s"]
    return out


# --------------------------------------------------------------------------------------------- per-op profile
PROFILE_CONCURRENCIES = (1, 8, 32)
PROFILE_PROMPT_TOKENS = 2048


def _rate(marks: List[tuple], t0: float, t1: float) -> Optional[float]:
    """Tokens per second of one stream between its first and last token arrival inside [t0, t1]."""
    inside = [(t, n) for t, n in marks if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def profile_decode(url: str, seed: int, out_dir: str, concurrency: int = 8, steps: int = 20,
                   new_tokens: int = 2048, prompt_tokens: int = PROFILE_PROMPT_TOKENS, window_s: float = 1.0,
                   first_token_timeout_s: float = 300.0) -> Dict[str, object]:
    """One decode batch of ``concurrency`` streams (``prompt_tokens``-token prompts, long generations), measured twice:
    (1) unprofiled: each stream's token rate over ``window_s`` once every stream decodes, which gives the wall time of
    a step (one token per stream per step); (2) torch.profiler over ``steps`` scheduler steps through SGLang's
    /start_profile (ProfileReq: output_dir, num_steps, activities; CPU activity for the cudaGraphLaunch calls that
    delimit the steps, no stacks or shapes; the trace stops by itself), which gives each op's GPU time and the GPU's
    busy time per step (kernel_ops.analyse). The profile starts after the window, so the profiled steps decode only;
    the streams are dropped afterwards (SGLang aborts a request whose client left)."""
    import kernel_ops

    os.makedirs(out_dir, exist_ok=True)
    decoding = threading.Semaphore(0)
    stop = threading.Event()
    marks: List[List[tuple]] = [[] for _ in range(concurrency)]

    def stream(i: int) -> None:
        first = False
        try:
            body = srv.generate_request(prompt(seed + 600 + 7919 * i, prompt_tokens), new_tokens)
            for t, chunk in srv.generate_stream(url, body):
                n = int(chunk.get("meta_info", {}).get("completion_tokens", 0))
                if n > 0:
                    marks[i].append((t, n))
                    if not first:
                        first = True
                        decoding.release()
                if stop.is_set():
                    return
        except Exception:  # noqa: BLE001 - a failed stream shows as a missing rate
            pass
        finally:
            if not first:
                decoding.release()   # a failed stream must not hold the profile back

    workers = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(concurrency)]
    for w in workers:
        w.start()
    deadline = time.time() + first_token_timeout_s
    for _ in range(concurrency):
        decoding.acquire(timeout=max(0.0, deadline - time.time()))
    time.sleep(0.3)
    t0 = time.time()
    time.sleep(window_s)
    t1 = time.time()
    at_start = [m[-1][1] if m else 0 for m in marks]
    code, raw = srv.http("POST", url + "/start_profile",
                         {"output_dir": out_dir, "num_steps": steps, "activities": ["CPU", "GPU"],
                          "with_stack": False, "record_shapes": False}, timeout=120)
    deadline = time.time() + 120
    traces: List[str] = []
    while time.time() < deadline and not traces:
        time.sleep(1)
        traces = sorted(glob.glob(os.path.join(out_dir, "**", "*.json*"), recursive=True))
    size = -1
    while traces and time.time() < deadline:   # the writer is done once the file stops growing
        now = sum(os.path.getsize(t) for t in traces)
        if now == size:
            break
        size = now
        time.sleep(1)
    stop.set()
    for w in workers:
        w.join(timeout=300)
    rates = [r for r in (_rate(m, t0, t1) for m in marks) if r]
    out: Dict[str, object] = {
        "concurrency": concurrency, "requested_steps": steps, "prompt_tokens": prompt_tokens,
        "streams_decoding": len(rates),
        "context_tokens": prompt_tokens + (statistics.mean(at_start) if at_start else 0) + steps / 2,
        "decode_tok_s_per_stream": statistics.median(rates) if rates else None,
        "decode_tok_s": sum(rates) if rates else None,
        "wall_us_per_step": 1e6 / statistics.median(rates) if rates else None,
        "window_s": t1 - t0,
    }
    if code != 200 or not traces:
        out["error"] = f"/start_profile answered {code} ({raw[:120]!r}); traces found: {len(traces)}"
        return out
    try:
        out.update(kernel_ops.analyse_files(traces, steps))
    except Exception as e:  # noqa: BLE001 - a trace that cannot be read is a result too
        out["error"] = f"trace {traces[0]}: {type(e).__name__}: {e}"[:500]
        return out
    out["traces"] = [os.path.basename(t) for t in traces]
    if out.get("wall_us_per_step") and out.get("gpu_busy_us_per_step") is not None:
        out["gpu_busy_fraction"] = out["gpu_busy_us_per_step"] / out["wall_us_per_step"]
    return out


def profile_concurrencies(url: str, seed: int, out_dir: str, concurrencies=PROFILE_CONCURRENCIES, steps: int = 20,
                          prompt_tokens: int = PROFILE_PROMPT_TOKENS, window_s: float = 1.0) -> Dict[str, dict]:
    """profile_decode at each concurrency, one after another (a batch ends before the next starts): {"1": {...}}."""
    out = {}
    for conc in concurrencies:
        out[str(conc)] = profile_decode(url, seed + conc, os.path.join(out_dir, f"c{conc}"), concurrency=conc,
                                        steps=steps, prompt_tokens=prompt_tokens, window_s=window_s)
        time.sleep(1.0)   # the dropped streams are aborted before the next batch arrives
    return out


# --------------------------------------------------------------------------------------------- soak
def gpu_memory_mib() -> Optional[List[int]]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return [int(x) for x in out.split()]
    except Exception:
        return None


def group_rss_mib(pgid: int) -> Optional[float]:
    """Resident memory of every process in the server's process group (from /proc)."""
    total = 0
    try:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.getpgid(int(pid)) != pgid:
                    continue
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError):
                continue
    except OSError:
        return None
    return total / 2 ** 20


def soak(url: str, pgid: int, seed: int, requests: int, concurrency: int, min_len: int = 16,
         max_len: int = 16384, max_new: int = 512, deadline: Optional[float] = None) -> Dict[str, object]:
    """``requests`` requests, ``concurrency`` at a time, prompt and output lengths log-uniform; memory sampled."""
    rng = random.Random(seed)
    plan = [(int(math.exp(rng.uniform(math.log(min_len), math.log(max_len)))),
             int(math.exp(rng.uniform(0, math.log(max_new))))) for _ in range(requests)]
    samples: List[dict] = []
    failures: List[str] = []
    done = [0]
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append({"t": time.time(), "done": done[0], "gpu_mib": gpu_memory_mib(), "rss_mib": group_rss_mib(pgid)})
            stop.wait(5)

    def one(i):
        if deadline and time.time() > deadline:
            return "skipped"
        length, new = plan[i]
        try:
            out = srv.generate(url, srv.generate_request(prompt(seed + 10 * i, length), new), timeout=900)
            got = out.get("meta_info", {}).get("completion_tokens")
            if got != new:
                failures.append(f"request {i}: {got} tokens, expected {new}")
        except Exception as e:  # noqa: BLE001 - every failure is counted and named
            failures.append(f"request {i}: {type(e).__name__}: {str(e)[:200]}")
        done[0] += 1
        return "done"

    t0 = time.time()
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    with ThreadPoolExecutor(concurrency) as pool:
        states = list(pool.map(one, range(requests)))
    stop.set()
    thread.join(timeout=10)
    return {"requests": requests, "completed": states.count("done"), "skipped": states.count("skipped"),
            "failed": len(failures), "failures": failures[:20], "concurrency": concurrency,
            "prompt_tokens": sum(p for p, _ in plan), "output_tokens": sum(n for _, n in plan),
            "wall_s": time.time() - t0, "memory": memory_trend(samples), "samples": samples[::max(1, len(samples) // 60)]}


def memory_trend(samples: List[dict], warmup_fraction: float = 0.2) -> Dict[str, object]:
    """Growth between the first and the last fifth of the samples after warm-up (GPU: summed over GPUs)."""
    usable = samples[int(len(samples) * warmup_fraction):]
    if len(usable) < 4:
        return {"enough_samples": False}
    fifth = max(1, len(usable) // 5)
    head, tail = usable[:fifth], usable[-fifth:]

    def med(rows, key):
        vals = [sum(r[key]) if isinstance(r[key], list) else r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    out = {"enough_samples": True}
    for key in ("gpu_mib", "rss_mib"):
        a, b = med(head, key), med(tail, key)
        out[key] = {"after_warmup": a, "end": b, "growth_mib": (b - a) if a is not None and b is not None else None}
    return out

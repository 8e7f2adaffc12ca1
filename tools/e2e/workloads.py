"""What the harness sends to a running server: seeded prompts (token ids), the correctness requests, the throughput
measurements, the per-op profile of a decode step and the soak."""

from __future__ import annotations

import glob
import gzip
import json
import math
import os
import random
import re
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
OP_PATTERNS = (  # kernel name -> op of the breakdown, first match wins; the rest is "other"
    ("sparse_mla", r"sparse_decode|flash_?mla|sparse_mla|_sm120_flashmla|mla_decode|dsv4_attn|flash_fwd|"
                   r"sparse_attn"),
    # our Triton kernels by name: the indexer's (ops/indexer_logits.py), hc_prenorm's fn split (ops/hc_prenorm)
    ("indexer_logits", r"mqa_logits|indexer|paged_mqa|^_paged_kernel$|^_flat_kernel$"),
    ("hc_prenorm", r"hc_prenorm|prenorm|mhc|sinkhorn|hc_pre|hc_post|^_fn_split_kernel$"),
    # our MoE's Triton kernels (ops/fp4_moe/kernels.py: _gemm1_kernel, _gemm2_kernel, _route_*, _swiglu_*, ...)
    ("moe_experts", r"fp4_moe|fp4moe|moe|marlin|expert|fused_experts|grouped|^_gemm[12]_kernel$|"
                    r"^_route_small_kernel$|^_swiglu_kernel$|^_count_kernel$|^_layout_kernel$|^_reduce_kernel$"),
    ("fp8_linear", r"w8a8|fp8_gemm|block_fp8|gemm|matmul|cutlass|cublas|sm90_xmma|nvjet"),
    ("quant_norm_rope", r"quant|rmsnorm|norm|rope|rotary"),
    ("communication", r"nccl|allreduce|all_reduce|all_gather|cross_device"),
)


def classify_kernel(name: str) -> str:
    low = name.lower()
    for op, pattern in OP_PATTERNS:
        if re.search(pattern, low):
            return op
    return "other"


def kernel_times(trace_path: str) -> Dict[str, float]:
    """Sum of GPU kernel durations (us) per kernel name in a torch.profiler Chrome trace (.json or .json.gz)."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        trace = json.load(f)
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    out: Dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset"):
            out[e.get("name", "?")] = out.get(e.get("name", "?"), 0.0) + float(e.get("dur", 0.0))
    return out


def op_shares(times: Dict[str, float]) -> Dict[str, object]:
    total = sum(times.values())
    by_op: Dict[str, float] = {}
    for name, us in times.items():
        by_op[classify_kernel(name)] = by_op.get(classify_kernel(name), 0.0) + us
    top = sorted(times.items(), key=lambda kv: -kv[1])[:25]
    return {"total_kernel_us": total,
            "share": {op: us / total for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])} if total else {},
            "top_kernels": [{"name": n[:160], "us": us, "op": classify_kernel(n)} for n, us in top]}


def profile_decode(url: str, seed: int, out_dir: str, concurrency: int = 8, steps: int = 20,
                   new_tokens: int = 2048) -> Dict[str, object]:
    """torch.profiler over ``steps`` scheduler steps of a decode batch, through SGLang's /start_profile
    (ProfileReq: output_dir, num_steps, activities; the trace stops by itself after num_steps). ``concurrency``
    streams of 2K-token prompts start together; the profile starts once every stream has its first token, so the
    prefill of the batch is over and the profiled steps decode only (long generations: the batch cannot end and
    refill during the profile); the streams are dropped afterwards (SGLang aborts a request whose client left)."""
    os.makedirs(out_dir, exist_ok=True)
    decoding = threading.Semaphore(0)
    stop = threading.Event()

    def stream(i: int) -> None:
        first = False
        try:
            for _, chunk in srv.generate_stream(url, srv.generate_request(prompt(seed + 600 + 7919 * i, 2048),
                                                                          new_tokens)):
                if not first and int(chunk.get("meta_info", {}).get("completion_tokens", 0)) > 0:
                    first = True
                    decoding.release()
                if stop.is_set():
                    return
        finally:
            if not first:
                decoding.release()   # a failed stream must not hold the profile back

    workers = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(concurrency)]
    for w in workers:
        w.start()
    deadline = time.time() + 120
    for _ in range(concurrency):
        decoding.acquire(timeout=max(0.0, deadline - time.time()))
    time.sleep(0.2)
    code, raw = srv.http("POST", url + "/start_profile",
                         {"output_dir": out_dir, "num_steps": steps, "activities": ["CPU", "GPU"]}, timeout=120)
    deadline = time.time() + 120
    traces: List[str] = []
    while time.time() < deadline and not traces:
        time.sleep(3)
        traces = sorted(glob.glob(os.path.join(out_dir, "**", "*.json*"), recursive=True))
    time.sleep(3)  # let the writer finish
    stop.set()
    for w in workers:
        w.join(timeout=300)
    if code != 200 or not traces:
        return {"error": f"/start_profile answered {code} ({raw[:120]!r}); traces found: {len(traces)}"}
    times: Dict[str, float] = {}
    for path in traces:
        for name, us in kernel_times(path).items():
            times[name] = times.get(name, 0.0) + us
    result = op_shares(times)
    # GPU kernel time per op and decode step (the profiled steps all decode ``concurrency`` streams)
    result["us_per_step"] = {op: share * result["total_kernel_us"] / steps for op, share in result["share"].items()}
    result.update({"steps": steps, "concurrency": concurrency, "traces": [os.path.basename(t) for t in traces]})
    return result


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

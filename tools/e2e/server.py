"""Start, wait for, talk to and stop one ``python3 -m sglang.launch_server`` (standard library only)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, List, Optional, Tuple


class ServerError(RuntimeError):
    pass


class Server:
    """One server in its own process group. ``state()`` / ``adopt()`` let a later call of the harness (a new process)
    take over a server an earlier call left running: its process group outlives the call while the machine is
    warm."""

    def __init__(self, cmd: List[str], env: Dict[str, str], log_path: str, port: int, cwd: Optional[str] = None):
        self.cmd, self.env, self.log_path, self.port, self.cwd = cmd, env, log_path, port, cwd
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None  # the process group's leader (the launcher)
        self.started_at = 0.0
        self.ready_s: Optional[float] = None
        self._log = None

    def state(self) -> Dict[str, object]:
        return {"cmd": self.cmd, "log_path": self.log_path, "port": self.port, "pid": self.pid,
                "started_at": self.started_at, "ready_s": self.ready_s}

    @classmethod
    def adopt(cls, state: Dict[str, object]) -> "Server":
        s = cls(list(state["cmd"]), {}, str(state["log_path"]), int(state["port"]))
        s.pid, s.started_at, s.ready_s = int(state["pid"]), float(state["started_at"]), state.get("ready_s")
        return s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self._log = open(self.log_path, "w")
        self._log.write("$ " + " ".join(self.cmd) + "\n")
        self._log.flush()
        self.started_at = time.time()
        # its own process group: stop() ends the launcher, scheduler, TP workers and detokenizer together
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def exited(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is not None
        return self.pid is None or not group_members(self.pid)

    def exit_code(self) -> Optional[int]:
        return self.proc.returncode if self.proc is not None else None

    def poll_ready(self) -> bool:
        """True once /health answers 200; raises ServerError if the server is gone."""
        if self.ready_s is not None:
            return True
        if self.exited():
            raise ServerError(f"server exited with code {self.exit_code()} during start-up; "
                              f"log tail:\n{self.log_tail()}")
        try:
            code, _ = http("GET", self.url + "/health", timeout=5)
        except (OSError, urllib.error.URLError):
            return False
        if code == 200:
            self.ready_s = time.time() - self.started_at
            return True
        return False

    def wait_ready(self, timeout_s: float) -> float:
        """Block until /health answers 200 (the model is loaded and warmed); returns the seconds it took."""
        deadline = self.started_at + timeout_s
        while time.time() < deadline:
            if self.poll_ready():
                return self.ready_s
            time.sleep(2)
        raise ServerError(f"server not ready after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.pid is None:
            return
        if not self.exited():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            end = time.time() + grace_s
            while time.time() < end and not self.exited():
                time.sleep(0.5)
        try:  # whatever of the group is left (workers that ignored SIGTERM)
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        # the next server needs the GPU memory: wait until no process of the group is left
        deadline = time.time() + 30
        while time.time() < deadline and group_members(self.pid):
            time.sleep(0.5)
        if self._log is not None:
            self._log.close()

    def alive(self) -> bool:
        return not self.exited()

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def group_members(pgid: int) -> List[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def http(method: str, url: str, body: Optional[dict] = None, timeout: float = 600) -> Tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def generate_request(input_ids: List[int], max_new_tokens: int, *, logprobs: bool = False, top_logprobs: int = 2,
                     stream: bool = False) -> dict:
    """A /generate body for SGLang 0.5.17 (io_struct.py GenerateReqInput): token ids in, greedy, fixed length."""
    body = {"input_ids": input_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            "stream": stream}
    if logprobs:
        body.update({"return_logprob": True, "top_logprobs_num": top_logprobs, "logprob_start_len": -1})
    return body


def generate(url: str, body: dict, timeout: float = 600) -> dict:
    code, raw = http("POST", url + "/generate", body, timeout)
    if code != 200:
        raise ServerError(f"/generate answered {code}: {raw[:300]!r}")
    return json.loads(raw)


def generate_stream(url: str, body: dict, timeout: float = 900) -> Iterator[Tuple[float, dict]]:
    """(arrival time, chunk) for each server-sent event of a streamed /generate."""
    body = dict(body, stream=True)
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        if resp.status != 200:
            raise ServerError(f"/generate (stream) answered {resp.status}")
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            yield time.time(), json.loads(payload)


STARTUP_LINE = re.compile(r"\[deepseek_v4_kernel [^\]]*\] (active|inactive): .*")
PATCHED_LINE = re.compile(r"deepseek_v4_kernel: (?:patched (\S+) -> (\S+)|set (\S+)=(\S+) \((\w+)\)( again)?)")
HANDBACK_LINE = re.compile(r"deepseek_v4_kernel: (\w+): handing this call back to the original (\S+): (.*)")
KEPT_LINE = re.compile(r"deepseek_v4_kernel: (\w+): keeping (?:the original \S+|SGLang's \S+ pre-GEMM) for this size: (.*)")
# the start-up line's part under DSV4_KERNEL_PREFER=measured (patch/__init__.start_up_line): the file read, or why none
MEASURED_LINE = re.compile(r"\] active: .*?; DSV4_KERNEL_PREFER=measured: (.*?)(?:; details: |$)", re.M)
RAN_LINE = re.compile(r"deepseek_v4_kernel: (\w+): first call ran (\S+)")   # ops/_stats.count, once per (op, impl)
SHIM_LINE = re.compile(r"\[dsv4-e2e-shim\] pid (\d+) \(([^)]*)\): (.*)")
WEIGHTS_LINE = re.compile(r"\[dsv4-e2e-shim\] pid (\d+): seeded dummy weights")
KV_LINE = re.compile(r"KV [Cc]ache (?:is )?allocated\. .*?#tokens: (\d+).*?avail mem=([\d.]+) GB")
WEIGHTS_MEM_LINE = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|CUDA error|RuntimeError|Exception in ")


def parse_log(text: str) -> Dict[str, object]:
    """What a server log says about the shim, our patch and errors."""
    shim = [m.groups() for m in SHIM_LINE.finditer(text)]
    starts = [m.group(0) for m in STARTUP_LINE.finditer(text)]
    patched, env_set = set(), set()
    for m in PATCHED_LINE.finditer(text):
        if m.group(1):
            patched.add(m.group(1))
        else:
            env_set.add(f"{m.group(3)}={m.group(4)}")
    handbacks: Dict[str, int] = {}
    for m in HANDBACK_LINE.finditer(text):
        key = f"{m.group(1)}: {m.group(3)[:120]}"
        handbacks[key] = handbacks.get(key, 0) + 1
    return {
        "shim_processes": len({pid for pid, _, _ in shim}),
        "shim_lines": [f"{prog}: {what}" for _, prog, what in shim][:8],
        "dsv4_startup_lines": len(starts),
        "dsv4_startup_examples": sorted(set(starts))[:3],
        "patched": sorted(patched),
        "env_set": sorted(env_set),
        "handback_warnings": handbacks,
        "kept": sorted({f"{op}: {why[:120]}" for op, why in KEPT_LINE.findall(text)}),
        "ran": sorted({f"{op}:{impl}" for op, impl in RAN_LINE.findall(text)}),
        "measured": sorted(set(MEASURED_LINE.findall(text)))[:4],
        "weights_seeded_processes": len(set(WEIGHTS_LINE.findall(text))),
        "error_lines": len(ERROR_LINE.findall(text)),
        # the KV pool's tokens and the GPU memory left after it, as each TP worker logged them (last sizing wins)
        "weights_gb": [float(g) for g in WEIGHTS_MEM_LINE.findall(text)][-8:],
        "kv_pool": [{"tokens": int(t), "avail_gb": float(g)} for t, g in KV_LINE.findall(text)][-8:],
    }

"""Structured-output floods against a real vLLM 0.32 (CPU, tiny model), unguarded and behind the guard.

    python bench/guided_vllm.py [--case outlines|auto|both] [--attacks 7] [--observe-s 45]

Two cases (issue 16):

- ``outlines``: vLLM started with ``--structured-outputs-config '{"backend":"outlines"}'``; the
  attacks are ``(a|b)*a(a|b){16}``, ``(a|b)*a(a|b){20}`` and a bare ``maxLength`` 64 string
  schema, ~60 bytes each. The guard runs with ``limits.guided.backends: [outlines]``.
- ``auto``: stock vLLM (backend ``auto``); the attack is the 324-byte schema ``auto`` routes to
  outlines through its ``patternProperties`` fallback, sent first after the start (the engine's
  backend is sticky). The guard runs with its default policy.

For each case, twice (a fresh vLLM each time): the attacks straight to vLLM, then through the
guard (``schedguard serve``). Recorded: each attack's status and seconds, the engine-core
process's RSS and CPU% sampled every second for ``--observe-s`` seconds after the flood, and
the median latency of a plain benign chat before and after. Everything stays on 127.0.0.1;
vLLM runs under the upstream script's ``RLIMIT_AS`` (6 GiB per process), every request has a
client timeout, and the whole run a wall clock (``--wall-s``). Prints one JSON document (also
written to ``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
UPSTREAMS = ROOT / "scripts" / "upstreams" / "upstreams.py"
sys.path.insert(0, str(ROOT))

from fuzz.targets.backends_corpus import ROUTED_324, request_body  # noqa: E402

CASES: dict[str, dict[str, Any]] = {
    "outlines": {
        "vllm_args": ["--structured-outputs-config", '{"backend":"outlines"}'],
        "policy": "limits:\n  guided:\n    backends: [outlines]\n    vocab_size: 4096\n",
        "attacks": [
            ("regex", "(a|b)*a(a|b){16}"),
            ("regex", "(a|b)*a(a|b){20}"),
            ("json", {"type": "string", "maxLength": 64}),
        ],
    },
    "auto": {
        "vllm_args": [],
        "policy": "limits:\n  guided:\n    vocab_size: 4096\n",
        "attacks": [("json", ROUTED_324)],
    },
}
BENIGN_CHAT = {
    "model": "tiny-llama",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 4,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, float, str]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status, time.perf_counter() - t0, ""
    except urllib.error.HTTPError as e:
        text = e.read()[:400].decode("utf-8", "replace")
        code = ""
        try:
            err = json.loads(text).get("error", {})
            code = err.get("code") or err.get("message", "")[:80]
        except (ValueError, AttributeError):
            code = text[:80]
        return e.code, time.perf_counter() - t0, str(code)
    except (TimeoutError, OSError) as e:
        return 0, time.perf_counter() - t0, type(e).__name__


def _latency(url: str, n: int = 5) -> float:
    times = [_post(url, BENIGN_CHAT, 60)[1] for _ in range(n)]
    return round(statistics.median(times), 3)


def _engine_core(server_pid: int) -> psutil.Process | None:
    try:
        procs = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return None
    for p in procs:
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


def _sample(proc: psutil.Process | None) -> dict[str, float]:
    if proc is None:
        return {"rss_mb": -1.0, "cpu_pct": -1.0}
    try:
        return {
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
            "cpu_pct": round(proc.cpu_percent(interval=None), 1),
        }
    except psutil.Error:
        return {"rss_mb": -1.0, "cpu_pct": -1.0}


def _start_vllm(port: int, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, str(UPSTREAMS), "start", "vllm", "--port", str(port)]
    cmd += ["--background", "--json"]
    if extra:
        cmd += ["--", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=True)
    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return info


def _stop_vllm(port: int) -> None:
    subprocess.run(
        [sys.executable, str(UPSTREAMS), "stop", "vllm", "--port", str(port)],
        capture_output=True,
        timeout=120,
        check=False,
    )


def _start_guard(upstream: str, policy: str, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    os.write(fd, policy.encode())
    os.close(fd)
    env = dict(os.environ, SCHEDGUARD_UPSTREAM__URL=upstream)
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "schedguard"), "serve", "--upstream", upstream,
         "--policy", path, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                break
        except (OSError, urllib.error.URLError):
            time.sleep(0.3)
    return proc, Path(path)


def run_case(name: str, attacks_n: int, observe_s: float, guarded: bool) -> dict[str, Any]:
    case = CASES[name]
    port = _free_port()
    info = _start_vllm(port, case["vllm_args"])
    base = info["base_url"]
    guard: subprocess.Popen[bytes] | None = None
    policy_path: Path | None = None
    try:
        engine = _engine_core(int(info["pid"]))
        _sample(engine)  # primes cpu_percent
        target = base
        if guarded:
            gport = _free_port()
            guard, policy_path = _start_guard(base, case["policy"], gport)
            target = f"http://127.0.0.1:{gport}"
        url = f"{target}/v1/chat/completions"
        latency_before = _latency(url)
        before = _sample(engine)
        bodies = [request_body(k, s) for k, s in case["attacks"]]
        bodies = [bodies[i % len(bodies)] for i in range(attacks_n)]
        # sticky backend: nothing structured before the attacks (benign latency is plain chat)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            results = list(pool.map(lambda b: _post(url, b, 60), bodies))
        flood_s = time.perf_counter() - t0
        samples = []
        end = time.monotonic() + observe_s
        while time.monotonic() < end:
            time.sleep(1.0)
            samples.append(_sample(engine))
        latency_after = _latency(url)
        statuses: dict[str, int] = {}
        for status, _, code in results:
            key = f"{status} {code}".strip()
            statuses[key] = statuses.get(key, 0) + 1
        rss = [s["rss_mb"] for s in samples if s["rss_mb"] >= 0]
        cpu = [s["cpu_pct"] for s in samples if s["cpu_pct"] >= 0]
        return {
            "case": name,
            "guarded": guarded,
            "vllm_start_rss_mb": info.get("rss_mb"),
            "engine_core_rss_mb_before": before["rss_mb"],
            "engine_core_rss_mb_max": max(rss, default=-1),
            "engine_core_rss_mb_end": rss[-1] if rss else -1,
            "engine_core_cpu_pct_mean": round(statistics.mean(cpu), 1) if cpu else -1,
            "engine_core_cpu_pct_last10": round(statistics.mean(cpu[-10:]), 1) if cpu else -1,
            "attacks": attacks_n,
            "attack_statuses": statuses,
            "attack_seconds": [round(t, 2) for _, t, _ in results],
            "flood_s": round(flood_s, 2),
            "benign_latency_before_s": latency_before,
            "benign_latency_after_s": latency_after,
            "engine_alive": engine is not None and engine.is_running(),
        }
    finally:
        if guard is not None:
            with_pg = os.getpgid(guard.pid)
            os.killpg(with_pg, signal.SIGTERM)
            guard.wait(timeout=30)
        if policy_path is not None:
            policy_path.unlink(missing_ok=True)
        _stop_vllm(port)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=("outlines", "auto", "both"), default="both")
    ap.add_argument("--attacks", type=int, default=7, help="attack requests per flood")
    ap.add_argument("--observe-s", type=float, default=45.0, help="sampling after the flood")
    ap.add_argument("--wall-s", type=float, default=1500.0, help="the whole run's wall clock")
    ap.add_argument("--out", default=str(ROOT / "build" / "guided_vllm.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("wall clock")))
    signal.alarm(int(args.wall_s))
    names = ["outlines", "auto"] if args.case == "both" else [args.case]
    report: dict[str, Any] = {"runs": []}
    for name in names:
        for guarded in (False, True):
            run = run_case(name, args.attacks, args.observe_s, guarded)
            print(json.dumps(run), file=sys.stderr, flush=True)
            report["runs"].append(run)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The seed payload on the hardened reference scheduler, and the throughput of the checks it relies on.

Prints, in one run, beside the seed write-up's "after" figures (127 ms, 312 MB):

(a) ``"{{" * 1024 + "system_prompt}}" * 512`` as the ``prompt_template`` of ``/v1/completions``
    against ``schedguard ref --profile hardened`` (a child under ``RLIMIT_AS``, warmed up first):
    - server-side latency: the server's own ``schedguard_request_duration_seconds`` histogram
      (ASGI middleware, first byte in to last byte out), its ``_sum`` read from ``/metrics``
      after every request, so each request's exact duration is a difference of two sums;
    - client latency over loopback HTTP (keep-alive), and the same request in-process through
      ``httpx.ASGITransport`` (no socket, no uvicorn) in a capped child, as a cross-check;
    - server RSS before and after the runs, and its peak (the kernel's VmHWM, reset first);
    median and p99 of ``--runs`` requests. Targets: a 4xx with one stable code in <= 2 ms
    server-side, RSS growth <= 5 MB.
(b) MB/s of the depth scan (``guard.template_scan.check_template``, depth 8) beside a per-char
    Python loop, and of the token-limit decision (``guard.tokens._counter``, via ``bench/tokens.py``)
    beside tiktoken encoding the whole input, on adversarial inputs; median of several runs, in a
    capped child. Target: >= 50 MB/s.
(c) with ``--vulnerable``: the vulnerable profile on the seed under a 1 GiB cap (the demo's
    machinery; ``schedguard demo`` shows the same).

    .venv/bin/python bench/seed.py [--runs 200] [--quick] [--vulnerable] [--json PATH]

Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import json
import math
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from guard.errors import GuardError  # noqa: E402
from guard.isolation import PeakRssSampler, run_limited, spawn_limited_server, stop_server  # noqa: E402
from guard.template_scan import check_template  # noqa: E402

SEED_TEMPLATE = "{{" * 1024 + "system_prompt}}" * 512
# The seed write-up's figures after its patch (docs/SEED.md): mean response time, peak memory.
REFERENCE_LATENCY_MS = 127.0
REFERENCE_PEAK_RSS_MB = 312.0
TARGET_SERVER_MS = 2.0
TARGET_RSS_GROWTH_MB = 5.0
TARGET_MB_S = 50.0
HARDENED_DEPTH = 8
MEM_LIMIT = 1 << 30
MiB = 1 << 20
_DURATION_SUM = re.compile(
    r'^schedguard_request_duration_seconds_sum\{endpoint="/v1/completions"\} (\S+)$', re.M
)


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ms(seconds: list[float]) -> dict[str, float]:
    """Median and p99 (nearest rank) in milliseconds."""
    ordered = sorted(seconds)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {
        "median": round(statistics.median(ordered) * 1e3, 3),
        "p99": round(p99 * 1e3, 3),
        "min": round(ordered[0] * 1e3, 3),
    }


def _seed_body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt_template": SEED_TEMPLATE, "max_tokens": 16}).encode()


def _error_code(response: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        code = response.json()["error"]["code"]
        return str(code) if code is not None else None
    return None


# ------------------------------------------------------------------ (a) over HTTP, live server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(proc: subprocess.Popen[bytes], client: httpx.Client, log: IO[bytes]) -> None:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace")
            raise RuntimeError(f"server exited with {proc.returncode} while starting:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if client.get("/health").status_code == 200:
                return
        time.sleep(0.05)  # polling a child's start-up
    raise RuntimeError("server not ready after 60 s")


def _duration_sum(client: httpx.Client) -> float:
    """Seconds spent in ``/v1/completions`` so far, by the server's own clock."""
    m = _DURATION_SUM.search(client.get("/metrics").text)
    if m is None:  # never silently report 0 ms
        raise RuntimeError("/metrics has no schedguard_request_duration_seconds for completions")
    return float(m.group(1))


def bench_server(runs: int, warmup: int) -> dict[str, Any]:
    port = _free_port()
    argv = [sys.executable, "-m", "schedguard", "ref", "--profile", "hardened",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    with tempfile.TemporaryFile(prefix="schedguard-bench-") as log:
        proc = spawn_limited_server(argv, mem_limit_bytes=MEM_LIMIT, stdout=log.fileno(),
                                    stderr=log.fileno())  # fmt: skip
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
                progress(f"[seed] hardened server pid {proc.pid} on port {port}, starting ...")
                _wait_ready(proc, client, log)
                model = str(client.get("/v1/models").json()["data"][0]["id"])
                body = _seed_body(model)
                headers = {"content-type": "application/json"}
                progress(f"[seed] warming up ({warmup} requests) ...")
                for _ in range(warmup):
                    client.post("/v1/completions", content=body, headers=headers)
                sampler = PeakRssSampler(proc.pid, include_children=True)
                rss_before = sampler.reset_peak()
                progress(f"[seed] {runs} seed requests ...")
                client_s: list[float] = []
                server_s: list[float] = []
                outcomes: dict[str, int] = {}
                before = _duration_sum(client)
                for _ in range(runs):
                    start = time.perf_counter()
                    response = client.post("/v1/completions", content=body, headers=headers)
                    client_s.append(time.perf_counter() - start)
                    after = _duration_sum(client)
                    server_s.append(after - before)
                    before = after
                    key = f"{response.status_code} {_error_code(response)}"
                    outcomes[key] = outcomes.get(key, 0) + 1
                rss_after = sampler.current_bytes()
                rss_peak = sampler.sample_now()
        finally:
            stop_server(proc)
    (only, _), *rest = sorted(outcomes.items(), key=lambda kv: -kv[1])
    status_text, code = only.split(" ", 1)
    return {
        "payload_bytes": len(SEED_TEMPLATE),
        "runs": runs,
        "warmup": warmup,
        "status": int(status_text),
        "code": code,
        "outcomes": outcomes,
        "stable": not rest,
        "server_ms": _ms(server_s),
        "client_ms": _ms(client_s),
        "rss_before_mb": round(rss_before / MiB, 2),
        "rss_after_mb": round(rss_after / MiB, 2),
        "rss_peak_mb": round(rss_peak / MiB, 2),
        "rss_growth_mb": round((rss_after - rss_before) / MiB, 2),
        "rss_peak_growth_mb": round(max(0, rss_peak - rss_before) / MiB, 2),
    }


# ---------------------------------------------------------- (a') in-process, no socket (child)


def asgi_in_process(runs: int, warmup: int) -> dict[str, Any]:
    """Runs in a capped child: the hardened app called through ``httpx.ASGITransport``."""
    import psutil

    from scheduler_ref.profiles import HARDENED
    from scheduler_ref.server import create_app

    app = create_app(HARDENED)
    body = _seed_body("schedguard-ref")
    headers = {"content-type": "application/json"}

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                for _ in range(warmup):
                    await client.post("/v1/completions", content=body, headers=headers)
                rss_before = psutil.Process().memory_info().rss
                times: list[float] = []
                codes: set[str] = set()
                for _ in range(runs):
                    start = time.perf_counter()
                    response = await client.post("/v1/completions", content=body, headers=headers)
                    times.append(time.perf_counter() - start)
                    codes.add(f"{response.status_code} {_error_code(response)}")
                rss_after = psutil.Process().memory_info().rss
        return {
            "ms": _ms(times),
            "outcomes": sorted(codes),
            "rss_growth_mb": round((rss_after - rss_before) / MiB, 2),
        }

    return asyncio.run(main())


# ----------------------------------------------------------------- (b) throughput (child)


def naive_depth_scan(text: str, max_depth: int) -> bool:
    """The obvious per-character loop (same tokenisation: leftmost ``{{``/``}}``)."""
    depth = 0
    i = 0
    n = len(text) - 1
    while i < n:
        pair = text[i : i + 2]
        if pair == "{{":
            depth += 1
            if depth > max_depth:
                return False
            i += 2
        elif pair == "}}":
            if depth == 0:
                return False
            depth -= 1
            i += 2
        else:
            i += 1
    return depth == 0


def scan_inputs(size: int) -> list[tuple[str, str]]:
    """Dense adversarial templates of about ``size`` characters (plus the seed itself)."""
    deep8 = "{{" * 8 + "a" + "}}" * 8
    return [
        ("{{}} repeated", "{{}}" * (size // 4)),
        ("nested 8 deep, repeated", deep8 * (size // len(deep8))),
        ("{{{a}}} repeated", "{{{a}}}" * (size // 7)),
        ("single braces in one placeholder", "{{" + "{a}" * (size // 3) + "}}"),
        ("8 deep, never closed", "{{" * 8 + "{a}" * (size // 3)),
        ("stray closer at the end", "{{}}" * (size // 4) + "}}"),
        ("seed payload (stops at byte 16)", SEED_TEMPLATE),
    ]


def _median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _check(text: str) -> str:
    try:
        check_template(text, max_depth=HARDENED_DEPTH)
    except GuardError as exc:
        return exc.code
    return "ok"


def _load_tokens_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_tokens", Path(__file__).with_name("tokens.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def throughput(runs: int, scan_size: int) -> dict[str, Any]:
    """Runs in a capped child: the depth scan and the token decision, each beside its baseline."""
    _check("{{a}}")  # compile the scan's patterns outside the timings
    scan_rows: list[dict[str, Any]] = []
    for name, text in scan_inputs(scan_size):
        n = len(text.encode())
        t_scan = _median_s(functools.partial(_check, text), runs)
        # The loop is ~5x slower; fewer runs keep the bench short.
        loop = functools.partial(naive_depth_scan, text, HARDENED_DEPTH)
        t_naive = _median_s(loop, max(1, runs // 3))
        scan_rows.append(
            {
                "input": name,
                "bytes": n,
                "outcome": _check(text),
                "stops_early": name.startswith("seed"),
                "scan_ms": round(t_scan * 1e3, 4),
                "scan_mb_s": round(n / t_scan / 1e6, 1),
                "naive_mb_s": round(n / t_naive / 1e6, 1),
                "speedup": round(t_naive / t_scan, 1),
            }
        )
    tokens = _load_tokens_bench().run(runs)
    # Within the limit is what a legitimate client sends: its speed is the tokenizer's own.
    token_rows: list[dict[str, Any]] = [
        {**row, "adversarial": not row["within_limit"]} for row in tokens["rows"]
    ]
    full = [r for r in scan_rows if not r["stops_early"]]
    adversarial = [r for r in token_rows if r["adversarial"]]
    worst_scan = min(full, key=lambda r: r["scan_mb_s"])
    worst_tokens = min(adversarial, key=lambda r: r["decision_mb_s"])
    return {
        "runs": runs,
        "target_mb_s": TARGET_MB_S,
        "depth_scan": {"max_depth": HARDENED_DEPTH, "rows": scan_rows},
        "token_count": {
            "limit": tokens["limit"],
            "tokenizer": tokens["tokenizer"],
            "rows": token_rows,
        },
        "worst": {
            "depth_scan": {"input": worst_scan["input"], "mb_s": worst_scan["scan_mb_s"]},
            "token_count": {"input": worst_tokens["input"], "mb_s": worst_tokens["decision_mb_s"]},
        },
    }


# ------------------------------------------------------------------ (c) vulnerable (optional)


def bench_vulnerable(timeout_s: float) -> dict[str, Any]:
    from schedguard.demo import SEED, DemoConfig, Deployment, ref_server, run_demo

    deployment = Deployment("scheduler_ref", "vulnerable", (ref_server("vulnerable"),))
    config = DemoConfig(mem_limit_bytes=MEM_LIMIT, timeout_s=timeout_s)
    (row,) = run_demo(config, deployments=(deployment,), payloads=(SEED,), progress=progress)
    return row.to_json()


# ----------------------------------------------------------------------------------- report


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if result["seed"] is not None:
        lines += _seed_lines(result["seed"], result.get("in_process"))
    if result["throughput"] is not None:
        lines += ["", *_throughput_lines(result["throughput"])]
    lines.append("")
    lines.append(_vulnerable_line(result["vulnerable"]))
    return "\n".join(lines)


def _seed_lines(seed: dict[str, Any], inproc: dict[str, Any] | None) -> list[str]:
    """(a): the seed payload's outcome, latencies and RSS against the write-up and the targets."""
    srv, cli = seed["server_ms"], seed["client_ms"]
    growth = max(seed["rss_growth_mb"], seed["rss_peak_growth_mb"])
    lines = [
        f"(a) seed payload ({seed['payload_bytes']} B) on the hardened profile, "
        f"{seed['runs']} runs after {seed['warmup']} warm-up",
        f"    outcome: {seed['status']} {seed['code']}"
        + ("" if seed["stable"] else f"  (NOT stable: {seed['outcomes']})"),
        f"    {'':30s} {'median':>9s} {'p99':>9s}   seed write-up   ratio",
        f"    {'server-side latency (ms)':30s} {srv['median']:9.3f} {srv['p99']:9.3f}   "
        f"{REFERENCE_LATENCY_MS:9.0f} ms   {REFERENCE_LATENCY_MS / srv['median']:7.0f}x",
        f"    {'client latency, HTTP (ms)':30s} {cli['median']:9.3f} {cli['p99']:9.3f}   "
        f"{REFERENCE_LATENCY_MS:9.0f} ms   {REFERENCE_LATENCY_MS / cli['median']:7.0f}x",
    ]
    if inproc is not None:
        ip = inproc["ms"]
        lines.append(
            f"    {'in-process, ASGITransport (ms)':30s} {ip['median']:9.3f} {ip['p99']:9.3f}"
            f"   (no socket, no uvicorn; RSS growth {inproc['rss_growth_mb']:.2f} MB)"
        )
    lines += [
        f"    server peak RSS: {seed['rss_peak_mb']:.1f} MB   seed write-up: "
        f"{REFERENCE_PEAK_RSS_MB:.0f} MB   ratio {REFERENCE_PEAK_RSS_MB / seed['rss_peak_mb']:.1f}x",
        f"    server RSS: {seed['rss_before_mb']:.1f} MB before, {seed['rss_after_mb']:.1f} MB "
        f"after -> growth {seed['rss_growth_mb']:+.2f} MB (peak {seed['rss_peak_growth_mb']:+.2f} MB)",
        f"    target 4xx, stable code, <= {TARGET_SERVER_MS:g} ms server-side (median): "
        + _mark(400 <= seed["status"] < 500 and seed["stable"]
                and srv["median"] <= TARGET_SERVER_MS),
        f"    target RSS growth <= {TARGET_RSS_GROWTH_MB:g} MB: "
        + _mark(growth <= TARGET_RSS_GROWTH_MB),
    ]  # fmt: skip
    return lines


def _throughput_lines(tp: dict[str, Any]) -> list[str]:
    """(b): the depth scan's and the token-limit decision's MB/s, each row, the worst."""
    lines = [f"(b) throughput, median of {tp['runs']} runs (MB/s = input bytes / time)"]
    lines.append(
        f"    depth scan, check_template(max_depth={tp['depth_scan']['max_depth']}) "
        "vs a per-char Python loop"
    )
    lines.append(
        f"    {'input':36s} {'bytes':>9s} {'outcome':>24s} {'scan MB/s':>10s} "
        f"{'loop MB/s':>10s} {'speedup':>8s}"
    )
    for r in tp["depth_scan"]["rows"]:
        lines.append(
            f"    {r['input']:36s} {r['bytes']:9d} {r['outcome']:>24s} {r['scan_mb_s']:10.1f} "
            f"{r['naive_mb_s']:10.1f} {r['speedup']:7.1f}x"
        )
    tc = tp["token_count"]
    lines.append(
        f"    token-limit decision ({tc['tokenizer']}, limit {tc['limit']}) vs tiktoken "
        "encoding the whole input"
    )
    lines.append(
        f"    {'input':40s} {'bytes':>9s} {'decided by':>11s} {'MB/s':>10s} "
        f"{'tiktoken':>10s} {'speedup':>9s}"
    )
    for r in tc["rows"]:
        note = "" if r["adversarial"] else "  (within the limit)"
        lines.append(
            f"    {r['input']:40s} {r['bytes']:9d} {r['decided_by']:>11s} "
            f"{r['decision_mb_s']:10.1f} {r['tiktoken_mb_s']:10.1f} {r['speedup']:8.1f}x{note}"
        )
    for part, label in (("depth_scan", "depth scan"), ("token_count", "token counting")):
        w = tp["worst"][part]
        lines.append(
            f"    target {label} >= {TARGET_MB_S:g} MB/s on adversarial input: worst "
            f"{w['mb_s']:.1f} MB/s ({w['input']}): {_mark(w['mb_s'] >= TARGET_MB_S)}"
        )
    return lines


def _vulnerable_line(vuln: dict[str, Any] | None) -> str:
    """(c): what the seed payload did to the vulnerable profile, if it was run."""
    if vuln is None:
        return "(c) vulnerable profile: skipped (pass --vulnerable, or run `schedguard demo`)"
    what = f"{vuln['status']} {vuln['code']}" if vuln["status"] is not None else vuln["outcome"]
    return (
        f"(c) vulnerable profile, seed payload, {MEM_LIMIT // MiB} MiB cap: {what} after "
        f"{vuln['latency_ms']:.0f} ms, server peak RSS {vuln['peak_rss_mb']:.0f} MB "
        f"{vuln['detail']}".rstrip()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="seed requests (default 200)")
    parser.add_argument("--throughput-runs", type=int, default=None, help="default 5")
    parser.add_argument("--quick", action="store_true", help="few runs, small inputs (smoke)")
    parser.add_argument(
        "--vulnerable", action="store_true", help="also run (c): up to ~20 s, 1 GiB"
    )
    parser.add_argument("--vulnerable-timeout-s", type=float, default=20.0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    runs = args.runs or (20 if args.quick else 200)
    tp_runs = args.throughput_runs or (1 if args.quick else 5)
    warmup = 5 if args.quick else 30  # >= 1: the latency histogram exists after the first
    if runs < 1 or tp_runs < 1:
        parser.error("runs must be >= 1")

    result: dict[str, Any] = {
        "reference": {"latency_ms": REFERENCE_LATENCY_MS, "peak_rss_mb": REFERENCE_PEAK_RSS_MB},
        "targets": {
            "server_ms": TARGET_SERVER_MS,
            "rss_growth_mb": TARGET_RSS_GROWTH_MB,
            "mb_s": TARGET_MB_S,
        },
        "quick": args.quick,
    }
    result["seed"] = bench_server(runs, warmup)
    progress("[seed] the same request in-process (ASGITransport, capped child) ...")
    inproc = run_limited(asgi_in_process, runs, warmup, mem_limit_bytes=MEM_LIMIT, timeout_s=120.0)
    result["in_process"] = inproc.value if inproc.ok else None
    if not inproc.ok:
        progress(f"[seed] in-process run failed: {inproc.outcome} {inproc.error_message}")
    progress("[seed] throughput of the depth scan and token counting (capped child) ...")
    scan_size = (256 << 10) if args.quick else (4 << 20)
    tp = run_limited(throughput, tp_runs, scan_size, mem_limit_bytes=2 << 30, timeout_s=600.0)
    if not tp.ok:
        progress(f"[seed] throughput run failed: {tp.outcome} {tp.error_type} {tp.error_message}")
        return 1
    result["throughput"] = tp.value
    result["vulnerable"] = None
    if args.vulnerable:
        progress("[seed] vulnerable profile on the seed payload (1 GiB cap) ...")
        result["vulnerable"] = bench_vulnerable(args.vulnerable_timeout_s)

    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        progress(f"[seed] results written to {args.json}")
    return 0 if result["seed"]["stable"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A fair share of the upstream (issue 25 item 4): one tenant floods long streams, some never
read, while another sends ordinary chats; on 127.0.0.1 only.

``python bench/fair_share.py [--upstream URL | (default) the embedded reference] [--json PATH]``
starts ``schedguard serve`` (a capped child process) with the load tests' policy
(loadtests/policy.yaml: the chat tenant's key ``sk-load-benign`` and the flood's
``sk-load-flood``, rates unlimited, so that what is measured is the queue, not a budget), then:

1. **solo**: the chat tenant alone, one request at a time (a short chat, ``--chat-tokens``
   output tokens), for ``--solo`` seconds: its baseline latency;
2. **flood**: ``--streams`` flood workers each keep one long stream open (``max_tokens``
   ``--flood-tokens``, ``n`` ``--flood-n``), of which ``--unread`` never read a byte of their
   answer and hold the connection ``--hold`` seconds before closing it, while the chat tenant
   does as in the solo phase, for ``--duration`` seconds.

It prints each tenant's latency percentiles in both phases, the ratio of the chat tenant's p99
under flood to its solo p99, the chat requests not answered (an error, or no answer within
``--timeout``), the flood's statuses, the guard's capacity in force (``/readyz``) and the
latency over time (``--window`` second buckets). ``--max-p99-ratio R`` exits 1 when the ratio
is above R or any chat request was not answered: the gate the e2e tests run.

``--src DIR`` puts DIR first on the guard's ``PYTHONPATH`` (``git archive <commit> guard
schedguard scheduler_ref | tar -x -C DIR``), to measure another version of the guard side by
side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtests import fairshare  # noqa: E402
from loadtests.target import BENIGN_KEY as CHAT_KEY  # noqa: E402
from loadtests.target import FLOOD_KEY  # noqa: E402
from schedguard.servers import RunningServer, ServerSpec, free_port, schedguard_argv  # noqa: E402

HOST = "127.0.0.1"
POLICY = ROOT / "loadtests" / "policy.yaml"  # holds both keys, tenants benign and flood
VERSION = "1"


@dataclass
class Sample:
    tenant: str
    phase: str
    sent: float  # seconds since the run began
    latency: float | None  # None: not answered
    status: int | None
    error: str | None = None


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    readyz: dict[str, Any] = field(default_factory=dict)
    model: str = ""

    def latencies(self, tenant: str, phase: str) -> list[float]:
        return sorted(
            s.latency
            for s in self.samples
            if s.tenant == tenant and s.phase == phase and s.latency is not None and s.error is None
        )

    def unanswered(self, tenant: str, phase: str) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.tenant == tenant and s.phase == phase and (s.latency is None or s.error)
        ]

    def summary(self) -> dict[str, Any]:
        solo = self.latencies("chat", "solo")
        flood = self.latencies("chat", "flood")
        ratio = percentile(flood, 99) / percentile(solo, 99) if solo and flood else float("nan")
        statuses = Counter(
            str(s.status if s.error is None else s.error)
            for s in self.samples
            if s.tenant == "flood"
        )
        return {
            "model": self.model,
            "chat_solo": stats(solo),
            "chat_flood": stats(flood),
            "p99_ratio": round(ratio, 3),
            "chat_unanswered": len(self.unanswered("chat", "flood"))
            + len(self.unanswered("chat", "solo")),
            "flood_requests": dict(statuses),
            "capacity": {k: self.readyz.get(k) for k in ("capacity", "capacity_source")},
        }

    def timeline(self, window: float) -> list[dict[str, Any]]:
        rows: dict[int, dict[str, list[float]]] = {}
        for s in self.samples:
            if s.latency is None:
                continue
            bucket = int(s.sent // window)
            rows.setdefault(bucket, {}).setdefault(f"{s.tenant}_{s.phase}", []).append(s.latency)
        out = []
        for bucket in sorted(rows):
            row: dict[str, Any] = {"t": bucket * window}
            for key, values in sorted(rows[bucket].items()):
                values.sort()
                row[key] = {"n": len(values), "p50": round(percentile(values, 50), 3),
                            "max": round(values[-1], 3)}  # fmt: skip
            out.append(row)
        return out


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    if not values:
        return float("nan")
    rank = max(1, math.ceil(pct / 100 * len(values)))
    return values[rank - 1]


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(values[-1], 3),
    }


async def _repeat(
    result: Result, tenant: str, phase: str, t0: float, until: float,
    one: Callable[[Sample, float], Awaitable[None]],
) -> None:  # fmt: skip
    """``one(sample, sent)`` again and again until ``until``, each recorded as a sample."""
    while time.monotonic() < until:
        sent = time.monotonic()
        sample = Sample(tenant, phase, sent - t0, None, None)
        try:
            await one(sample, sent)
        except httpx.HTTPError as exc:
            sample.error = type(exc).__name__
        result.samples.append(sample)
        if sample.error is not None:
            await asyncio.sleep(0.2)  # an error comes back at once: do not spin on it


async def _chat_loop(
    client: httpx.AsyncClient, result: Result, phase: str, model: str, args: Any, t0: float,
    until: float,
) -> None:  # fmt: skip
    body = fairshare.chat_body(model, args.chat_tokens)
    headers = {"authorization": f"Bearer {CHAT_KEY}", "content-type": "application/json"}

    async def one(sample: Sample, sent: float) -> None:
        resp = await client.post(
            fairshare.CHAT_PATH, content=body, headers=headers, timeout=args.timeout
        )
        sample.status = resp.status_code
        sample.latency = time.monotonic() - sent
        if resp.status_code != 200:
            sample.error = f"{resp.status_code}:{_code(resp)}"

    await _repeat(result, "chat", phase, t0, until, one)


def _code(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("error", {}).get("code"))
    except ValueError:
        return "?"


async def _flood_worker(
    client: httpx.AsyncClient, result: Result, model: str, args: Any, t0: float, until: float,
    unread: bool,
) -> None:  # fmt: skip
    body = fairshare.flood_body(model, args.flood_tokens, args.flood_n)
    headers = {"authorization": f"Bearer {FLOOD_KEY}", "content-type": "application/json"}

    async def one(sample: Sample, sent: float) -> None:
        async with client.stream(
            "POST", fairshare.CHAT_PATH, content=body, headers=headers, timeout=args.timeout
        ) as resp:
            sample.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                sample.error = f"{resp.status_code}:{_code(resp)}"
            elif unread:  # the answer's bytes pile up in the socket buffers
                await asyncio.sleep(min(args.hold, max(0.0, until - time.monotonic())))
            else:
                async for _ in resp.aiter_raw():
                    pass
            sample.latency = time.monotonic() - sent

    await _repeat(result, "flood", "flood", t0, until, one)


async def measure(base_url: str, args: Any) -> Result:
    """Both phases against the guard at ``base_url``."""
    result = Result()
    limits = httpx.Limits(max_connections=args.streams + 8, max_keepalive_connections=8)
    async with httpx.AsyncClient(base_url=base_url, limits=limits) as client:
        model = args.model
        if model is None:
            models = (await client.get("/v1/models", headers={
                "authorization": f"Bearer {CHAT_KEY}"})).json()  # fmt: skip
            model = models["data"][0]["id"]
        result.model = model
        t0 = time.monotonic()
        _progress(f"solo: the chat tenant alone for {args.solo:g} s")
        await _chat_loop(client, result, "solo", model, args, t0, t0 + args.solo)
        start = time.monotonic()
        until = start + args.duration
        _progress(
            f"flood: {args.streams} long streams ({args.unread} unread) and the chat tenant "
            f"for {args.duration:g} s"
        )
        flood_client = httpx.AsyncClient(base_url=base_url, limits=limits)
        try:
            workers = [
                asyncio.create_task(
                    _flood_worker(flood_client, result, model, args, t0, until, i < args.unread)
                )
                for i in range(args.streams)
            ]
            await asyncio.sleep(min(1.0, args.duration / 10))  # the flood is under way first
            await _chat_loop(client, result, "flood", model, args, t0, until)
            result.readyz = await _readyz(client, args.timeout)
            # Flood workers finish the stream they are in; an unread one is closed by its hold.
            _, pending = await asyncio.wait(workers, timeout=args.timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await flood_client.aclose()
    return result


async def _readyz(client: httpx.AsyncClient, timeout: float) -> dict[str, Any]:
    """The guard's /readyz (its capacity in force); {} when it does not say in time (it asks
    the upstream, which may be busy)."""
    try:
        answer = (await client.get("/readyz", timeout=timeout)).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return answer if isinstance(answer, dict) else {}


def _progress(message: str) -> None:
    print(f"[fair_share] {message}", file=sys.stderr, flush=True)


def start_guard(upstream: str | None, policy: Path, src: str | None) -> RunningServer:
    def argv(ports: Any, host: str) -> list[str]:
        args = ["serve", "--policy", str(policy), "--host", host, "--port", str(ports["guard"]),
                "--log-level", "warning"]  # fmt: skip
        args += ["--upstream", upstream] if upstream else ["--embedded-reference"]
        argv = schedguard_argv(*args)
        # -P: the working directory (this checkout) does not go before --src on sys.path.
        return [argv[0], "-P", *argv[1:]] if src else argv

    if src:  # the child inherits this process's environment
        os.environ["PYTHONPATH"] = f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    spec = ServerSpec("guard", argv, health_path="/readyz")
    return RunningServer(spec, {"guard": free_port(HOST)}, HOST, mem_limit_bytes=2 << 30)


def render(summary: dict[str, Any], timeline: list[dict[str, Any]]) -> str:
    solo, flood = summary["chat_solo"], summary["chat_flood"]
    lines = [
        f"model {summary['model']}; capacity in force {summary['capacity']}",
        f"chat alone:      n={solo.get('n')} p50={solo.get('p50')} s p99={solo.get('p99')} s",
        f"chat with flood: n={flood.get('n')} p50={flood.get('p50')} s p99={flood.get('p99')} s",
        f"p99 ratio {summary['p99_ratio']}; chat unanswered {summary['chat_unanswered']}; "
        f"flood requests {summary['flood_requests']}",
        "latency over time (s since start: tenant_phase n/p50/max):",
    ]
    for row in timeline:
        cells = [f"{key} {v['n']}/{v['p50']}/{v['max']}" for key, v in row.items() if key != "t"]
        lines.append(f"  {row['t']:6.1f}  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fair_share.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--upstream", metavar="URL", help="the LLM server behind the guard "
                        "(default: the embedded reference scheduler)")  # fmt: skip
    parser.add_argument("--guard", metavar="URL", help="measure a guard already running at "
                        "URL (its policy must hold this script's two keys) instead of starting "
                        "one")  # fmt: skip
    parser.add_argument("--model", help="model id (default: the first of /v1/models)")
    parser.add_argument("--solo", type=float, default=10.0, help="seconds of the solo phase "
                        "(default: 10)")  # fmt: skip
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of the flood "
                        "phase (default: 30)")  # fmt: skip
    parser.add_argument("--streams", type=int, default=8, help="flood streams open at once "
                        "(default: 8)")  # fmt: skip
    parser.add_argument("--unread", type=int, default=4, help="of them, never read (default: 4)")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds an unread stream is "
                        "held open before its client closes it (default: 30)")  # fmt: skip
    parser.add_argument("--flood-tokens", type=int, default=2048, help="max_tokens of a flood "
                        "stream (default: 2048)")  # fmt: skip
    parser.add_argument("--flood-n", type=int, default=16, help="n of a flood stream "
                        "(default: 16)")  # fmt: skip
    parser.add_argument("--chat-tokens", type=int, default=16, help="max_tokens of a chat "
                        "(default: 16)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a chat may take "
                        "before it counts as unanswered (default: 20)")  # fmt: skip
    parser.add_argument("--window", type=float, default=5.0, help="seconds per row of the "
                        "timeline (default: 5)")  # fmt: skip
    parser.add_argument("--max-p99-ratio", type=float, default=None, help="exit 1 when the "
                        "chat p99 under flood is above this multiple of its solo p99, or a chat "
                        "went unanswered")  # fmt: skip
    parser.add_argument("--src", metavar="DIR", help="put DIR first on the guard's PYTHONPATH")
    parser.add_argument("--json", metavar="PATH", help="write the summary, timeline and "
                        "samples as JSON")  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    args = parser.parse_args(argv)
    if not 0 <= args.unread <= args.streams:
        parser.error("--unread must be between 0 and --streams")

    guard: RunningServer | None = None
    try:
        url = args.guard
        if url is None:
            guard = start_guard(args.upstream, POLICY, args.src)
            guard.wait_ready(120)
            url = guard.url
        result = asyncio.run(measure(url, args))
    finally:
        if guard is not None:
            guard.stop()
    summary = result.summary()
    timeline = result.timeline(args.window)
    print(render(summary, timeline))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "summary": summary, "timeline": timeline,
            "samples": [asdict(s) for s in result.samples]}, indent=1))  # fmt: skip
    if args.max_p99_ratio is not None:
        ratio = summary["p99_ratio"]
        if summary["chat_unanswered"] or not ratio <= args.max_p99_ratio:
            print(f"FAIL: p99 ratio {ratio} (limit {args.max_p99_ratio}), "
                  f"{summary['chat_unanswered']} chat requests unanswered")  # fmt: skip
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

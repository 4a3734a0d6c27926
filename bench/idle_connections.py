"""Idle connections from one peer against the guard (issue 14, item 1), on 127.0.0.1 only.

``python bench/idle_connections.py [--connections 20000] [--src DIR] [--json PATH]`` starts the
mock upstream (``bench/_mock_upstream.py``) and ``schedguard serve`` in front of it (one worker,
``RLIMIT_AS`` 2 GiB, ``RLIMIT_NOFILE`` from ``--guard-nofile``), then:

1. opens ``--connections`` TCP connections to the guard from 127.0.0.1, in two child processes
   (each with its own ``RLIMIT_NOFILE``, raised for the purpose), that send nothing and hold
   them;
2. right after, sends a benign chat completion from 127.0.0.1 (the flooding address), one from
   127.0.0.2 (another peer: loopback too on Linux) and ``/healthz`` from both, each with a 30 s
   timeout, and records status and time (or what went wrong: reset, empty reply, timeout);
3. counts the idle sockets the guard has closed, then, if the benign request from 127.0.0.1 was
   not answered, retries it every 0.5 s for up to 60 s (how long until it is);
4. reports the guard's RSS before, after the flood, and its peak.

``--src DIR`` puts DIR first on the guard's ``PYTHONPATH`` (e.g. ``git archive <commit> guard
schedguard scheduler_ref | tar -x -C DIR``), to measure another version of the guard.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
OTHER = "127.0.0.2"
CHAT = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _limits(mem: int, nofile: tuple[int, int]) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    return apply


def wait_ready(port: int, path: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"port {port} not ready on {path}")


def request(port: int, source: str, method: str, path: str, body: bytes | None) -> dict[str, Any]:
    """One request on a new connection from ``source``: status and seconds, or the error."""
    start = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=30, source_address=(source, 0))
        headers = {"content-type": "application/json"} if body else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        out: dict[str, Any] = {"status": resp.status, "s": round(time.perf_counter() - start, 3)}
        if resp.status >= 400:
            out["code"] = json.loads(data).get("error", {}).get("code")
        return out
    except (OSError, http.client.HTTPException) as exc:
        return {"error": type(exc).__name__, "s": round(time.perf_counter() - start, 3)}


# -- the flood, in a child process ----------------------------------------------------------------


def flood_child(port: int, count: int) -> None:
    """Open ``count`` idle connections; on each line of stdin print how many are still open."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (count + 256, count + 256))
    socks: list[socket.socket] = []
    failed = 0
    errors: dict[str, int] = {}
    for _ in range(count):
        # Blocking connects, one after the other: each is established (the guard's accept
        # queue has room) before the next, at the pace the kernel and the guard take them.
        sock = socket.socket()
        sock.settimeout(10)
        try:
            sock.connect((HOST, port))
        except OSError as exc:
            failed += 1
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            sock.close()
            continue
        sock.setblocking(False)
        socks.append(sock)
    # Let the connects finish (the kernel completes them; the guard may accept or not).
    time.sleep(1)
    print(json.dumps({"opened": len(socks), "failed": failed, **errors}), flush=True)
    for _line in sys.stdin:
        open_ = 0
        for sock in socks:
            if sock.fileno() < 0:
                continue
            if _closed_by_peer(sock):
                sock.close()
                continue
            open_ += 1
        print(json.dumps({"open": open_}), flush=True)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the guard has closed this (non-blocking) socket; what it sent is discarded."""
    while True:
        try:
            if sock.recv(65536) == b"":
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True


class Flood:
    def __init__(self, port: int, total: int, parts: int = 2) -> None:
        each = total // parts
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--flood-child", str(port), str(each)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=_limits(1 << 30, (each + 256, each + 256)),
            )
            for _ in range(parts)
        ]

    def opened(self) -> dict[str, int]:
        rows = [json.loads(p.stdout.readline()) for p in self.procs]  # type: ignore[union-attr]
        keys = {k for r in rows for k in r}
        return {k: sum(r.get(k, 0) for r in rows) for k in sorted(keys)}

    def still_open(self) -> int:
        for p in self.procs:
            p.stdin.write("\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        return sum(json.loads(p.stdout.readline())["open"] for p in self.procs)  # type: ignore[union-attr]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


# -- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    up_port, guard_port = free_port(), free_port()
    soft, hard = (int(x) for x in args.guard_nofile.split(":"))
    upstream = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "_mock_upstream.py"), "--port", str(up_port)],
        preexec_fn=_limits(1 << 30, (4096, 4096)),
    )
    log = open(args.guard_log, "wb")  # noqa: SIM115
    guard = _start_guard(args, up_port, guard_port, (soft, hard), log)
    flood: Flood | None = None
    peak = [0]
    stop = threading.Event()
    try:
        wait_ready(up_port, "/health")
        wait_ready(guard_port, "/readyz")
        proc = psutil.Process(guard.pid)
        threading.Thread(target=_sample_peak_rss, args=(proc, peak, stop), daemon=True).start()
        warm = request(guard_port, HOST, "POST", "/v1/chat/completions", CHAT)
        rss_before = proc.memory_info().rss
        t0 = time.monotonic()
        flood = Flood(guard_port, args.connections)
        opened = flood.opened()
        flooded_s = round(time.monotonic() - t0, 1)
        after: dict[str, Any] = {
            "chat_same_peer": request(guard_port, HOST, "POST", "/v1/chat/completions", CHAT),
            "chat_other_peer": request(guard_port, OTHER, "POST", "/v1/chat/completions", CHAT),
            "healthz_same_peer": request(guard_port, HOST, "GET", "/healthz", None),
            "healthz_other_peer": request(guard_port, OTHER, "GET", "/healthz", None),
        }
        rss_flooded = proc.memory_info().rss
        open_now = flood.still_open()
        retry = None
        if after["chat_same_peer"].get("status") != 200:
            retry = _retry_same_peer(guard_port, 60.0)
        time.sleep(args.hold_s)
        open_later = flood.still_open()
        return {
            "connections": args.connections,
            "guard_nofile": [soft, hard],
            "src": args.src or "working tree",
            "warm_request": warm,
            "flood": {**opened, "seconds": flooded_s},
            "after_flood": after,
            "idle_open_after_requests": open_now,
            f"idle_open_after_{args.hold_s:g}s_more": open_later,
            "same_peer_retry": retry,
            "guard_alive": guard.poll() is None,
            "rss_mb": {
                "before": round(rss_before / 2**20, 1),
                "flooded": round(rss_flooded / 2**20, 1),
                "peak": round(peak[0] / 2**20, 1),
                "growth": round((rss_flooded - rss_before) / 2**20, 1),
            },
        }
    finally:
        stop.set()
        if flood is not None:
            flood.stop()
        _stop_servers(guard, upstream)
        log.close()


def _start_guard(
    args: argparse.Namespace, up_port: int, port: int, nofile: tuple[int, int], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """``schedguard serve`` in front of the upstream (from ``--src`` if given), logging to log."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([args.src, env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "schedguard", "serve", "--upstream", f"http://{HOST}:{up_port}",
            "--host", HOST, "--port", str(port), "--log-level", "warning"]  # fmt: skip
    return subprocess.Popen(
        argv,
        env=env,
        cwd=args.src or ROOT,  # `python -m` puts the working directory first on sys.path
        stdout=log,
        stderr=log,
        preexec_fn=_limits(2 << 30, nofile),
    )


def _sample_peak_rss(proc: psutil.Process, peak: list[int], stop: threading.Event) -> None:
    """Keep ``peak[0]`` at the process's highest RSS, every 50 ms, until stop or it is gone."""
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], proc.memory_info().rss)
        except psutil.Error:
            return
        time.sleep(0.05)


def _retry_same_peer(port: int, within_s: float) -> dict[str, Any]:
    """Send the chat request from the flooding address every 0.5 s until it is answered."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        got = request(port, HOST, "POST", "/v1/chat/completions", CHAT)
        if got.get("status") == 200:
            return {"answered_after_s": round(time.monotonic() - start, 1)}
        time.sleep(0.5)
    return {"answered_after_s": None}


def _stop_servers(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--flood-child":
        flood_child(int(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--connections",
        type=int,
        default=20_000,
        help="idle sockets opened from one peer (default 20000; the process's own open-file "
        "limit is raised to fit)",
    )
    parser.add_argument("--src", help="a directory with another version of the guard")
    parser.add_argument(
        "--guard-nofile",
        default="20000:20000",
        help="the guard's open-file limit, SOFT:HARD (default 20000:20000)",
    )
    parser.add_argument(
        "--hold-s",
        type=float,
        default=12.0,
        help="seconds to wait after the benign requests before counting the open sockets again "
        "(default 12: past the head timeout)",
    )
    parser.add_argument(
        "--guard-log",
        default="/tmp/schedguard-idle-guard.log",
        help="where the guard's own log goes (default /tmp/schedguard-idle-guard.log)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON here")
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()

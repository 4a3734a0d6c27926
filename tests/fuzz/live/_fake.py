"""The scripted OpenAI-compatible server the live campaigns' tests run against
(tests/_fake_openai.py: its faults, its guard dry run), and a corpus and options for them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fuzz.live import LiveOptions
from tests._support import REPO_ROOT, free_port

FAKE = REPO_ROOT / "tests" / "_fake_openai.py"
CHAT = "/v1/chat/completions"
HELLO = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}


def start_fake(
    port: int, pidfile: Path | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(FAKE), str(port)] + ([str(pidfile)] if pidfile else [])
    if log is None:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:  # its log, with the Python stack of a fatal signal (what a real upstream's shows)
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        with log.open("ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake server did not start")


class Fake:
    """The fake server on a free port, and the copies a restart command starts."""

    def __init__(self, tmp: Path, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pidfile = tmp / "fake.pid"
        self.log = log
        self.procs = [start_fake(self.port, self.pidfile, log)]

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    @property
    def restart_cmd(self) -> str:
        # Detached, so the campaign's subprocess.run returns at once.
        out = f">>{self.log}" if self.log is not None else ">/dev/null"
        return f"{sys.executable} {FAKE} {self.port} {self.pidfile} {out} 2>&1 &"

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        if self.pidfile.exists():  # a copy started by a restart command
            pid = int(self.pidfile.read_text() or 0)
            if pid and pid not in {p.pid for p in self.procs}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def make_corpus(
    root: Path, attacks: dict[str, dict[str, Any]], benign: dict[str, dict[str, Any]]
) -> Path:
    """A payload corpus with these bodies (chat endpoint)."""
    for pid, body in attacks.items():
        d = root / "attacks" / "volume"
        d.mkdir(parents=True, exist_ok=True)
        doc = {"id": pid, "class": "volume", "description": "test", "target_field": "body",
               "endpoint": CHAT, "body": body, "expect": {"status": 400, "code": "x_y"}}  # fmt: skip
        (d / f"{pid}.yaml").write_text(yaml.safe_dump(doc))
    for pid, body in benign.items():
        d = root / "benign"
        d.mkdir(parents=True, exist_ok=True)
        doc = {"id": pid, "class": "benign", "description": "test", "target_field": "body",
               "endpoint": CHAT, "body": body, "expect": {"status": 200}}  # fmt: skip
        (d / f"{pid}.yaml").write_text(yaml.safe_dump(doc))
    return root


def live_options(fake: Fake, tmp: Path, corpus: Path, **kw: Any) -> LiveOptions:
    base: dict[str, Any] = {
        "target": fake.url,
        "duration_s": 6.0,
        "seed": 1,
        "out_dir": tmp / "out",
        "corpus": corpus,
        "minimise_s": 5.0,
        "dead_wait_s": 1.0,
        "timeout_s": 5.0,
        "progress": None,
    }
    base.update(kw)
    return LiveOptions(**base)

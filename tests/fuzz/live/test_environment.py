"""What a campaign records about the server: its model, its command line and the Python
packages of its own interpreter (asked in a child process), this tool's version and policy."""

from __future__ import annotations

import sys

from fuzz.live import HttpClient, RequestPacer, capture_environment
from tests.fuzz.live._fake import Fake


def test_the_servers_process_model_and_packages_are_recorded(fake: Fake) -> None:
    client = HttpClient(fake.url, limiter=RequestPacer(50))
    try:
        env = capture_environment(client, [fake.pid])
    finally:
        client.close()
    assert env["models"] == [{"id": "fake-model"}]
    assert "server_version" not in env  # no /version: not guessed
    proc = env["process"]
    assert proc["cmdline"][1].endswith("_fake_openai.py")
    # The interpreter is argv[0] (a venv's python), not /proc/PID/exe's base interpreter.
    assert proc["interpreter"] == sys.executable
    assert "PyYAML" in proc["packages"]
    assert env["kind"] is None
    assert len(env["tool"]["policy_sha256"]) == 64

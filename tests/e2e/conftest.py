"""Real LLM servers (vLLM, llama-cpp-python) as session fixtures for end-to-end tests.

The servers, their venvs and tiny models come from scripts/upstreams/upstreams.py (`make e2e`
sets them up). Tests here run only when asked for, so `make test` stays fast and needs none
of that: with SCHEDGUARD_E2E=1, or when tests/e2e (or a file or test in it) is named on the
pytest command line. Otherwise they are skipped with that reason.

An upstream that is not set up skips its tests, unless SCHEDGUARD_E2E_REQUIRED=1, which turns
that into a failure (for CI that set them up on purpose).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._support import free_port

E2E_DIR = Path(__file__).resolve().parent
ROOT = E2E_DIR.parents[1]
SCRIPT = ROOT / "scripts" / "upstreams" / "upstreams.py"
HOST = "127.0.0.1"
# vLLM takes 40-90 s to start on 2 cores, more when the machine is busy.
READY_TIMEOUT_S = 360
# The first test of a session pays for the server's start: the project-wide 120 s is too short.
TEST_TIMEOUT_S = READY_TIMEOUT_S + 120


def _explicitly_selected(config: pytest.Config) -> bool:
    invoked_in = config.invocation_params.dir
    for arg in config.invocation_params.args:
        if arg.startswith("-"):
            continue
        path = (invoked_in / arg.split("::", 1)[0]).resolve()
        if path == E2E_DIR or E2E_DIR in path.parents:
            return True
    return False


def _enabled(config: pytest.Config) -> bool:
    return os.environ.get("SCHEDGUARD_E2E") == "1" or _explicitly_selected(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs real LLM servers (scripts/upstreams)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    enabled = _enabled(config)
    skip = pytest.mark.skip(
        reason="e2e: needs SCHEDGUARD_E2E=1 or tests/e2e named on the command line (make e2e)"
    )
    for item in items:
        if E2E_DIR not in item.path.parents:
            continue
        item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))
        if not enabled:
            item.add_marker(skip)


@dataclass(frozen=True)
class RunningUpstream:
    name: str
    base_url: str  # http://127.0.0.1:PORT, what `schedguard serve --upstream` takes
    openai_base_url: str  # base_url + /v1, what the openai client takes
    pid: int
    port: int
    model: str  # the served model name
    model_path: Path  # the HF dir (vllm) or the .gguf file (llamacpp)
    tokenizer_json: Path  # the model's vocabulary in Hugging Face form
    log: Path
    start_s: float
    rss_mb: int


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_upstream(name: str, *extra: str, variant: str | None = None) -> Iterator[RunningUpstream]:
    """Start `name` via the script on a free port (serving its model ``variant`` when given),
    yield it, stop it."""
    status = _script("status", name, "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)["upstreams"][name]
    if not info["set_up"]:
        message = (
            f"the {name} upstream is not set up in {info['path']}: "
            f"run scripts/upstreams/upstreams.py setup {name}"
        )
        if os.environ.get("SCHEDGUARD_E2E_REQUIRED") == "1":
            pytest.fail(message + " (SCHEDGUARD_E2E_REQUIRED=1)")
        pytest.skip(message)
    port = free_port(HOST)
    args = ["start", name, "--port", str(port), "--host", HOST, "--background", "--json",
            "--ready-timeout", str(READY_TIMEOUT_S)]  # fmt: skip
    if variant is not None:
        args += ["--model-variant", variant]
    if extra:
        args += ["--", *extra]
    started = _script(*args, timeout=READY_TIMEOUT_S + 60)
    if started.returncode != 0:
        pytest.fail(f"{name} did not start (exit {started.returncode}):\n{started.stderr[-6000:]}")
    record = json.loads(started.stdout.strip().splitlines()[-1])
    model_path = Path(info["model"])
    tokenizer_json = (model_path if model_path.is_dir() else model_path.parent) / "tokenizer.json"
    try:
        yield RunningUpstream(
            name=name,
            base_url=record["base_url"],
            openai_base_url=record["openai_base_url"],
            pid=record["pid"],
            port=port,
            model=record["model"],
            model_path=model_path,
            tokenizer_json=tokenizer_json,
            log=Path(record["log"]),
            start_s=record["start_s"],
            rss_mb=record["rss_mb"],
        )
    finally:
        stopped = _script("stop", name, "--port", str(port), timeout=120)
        sys.stderr.write(stopped.stdout)


@pytest.fixture(scope="session")
def vllm_upstream() -> Iterator[RunningUpstream]:
    """vLLM's OpenAI server (tiny Llama, pythonic tool parser, auto tool choice)."""
    yield from start_upstream("vllm")


@pytest.fixture(scope="session")
def llamacpp_upstream() -> Iterator[RunningUpstream]:
    """llama-cpp-python's server (the same tiny Llama as GGUF, n_ctx 4096)."""
    yield from start_upstream("llamacpp")


@pytest.fixture(scope="module")
def llamacpp_text_upstream() -> Iterator[RunningUpstream]:
    """llama-cpp-python serving the tiny Llama whose text decodes token by token, as a real
    model's does (the default one's mostly does not, which llama-cpp-python streams in
    superlinear time: docs/findings/llamacpp-undecodable-stream-superlinear.yaml)."""
    yield from start_upstream("llamacpp", variant="text")

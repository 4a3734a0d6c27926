"""The schedguard command line: parsing, help, and `schedguard ref` serving for real."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from typing import Any

import httpx
import pytest

from guard.isolation import run_limited, spawn_limited_server, stop_server
from schedguard.cli import build_parser, main
from schedguard.demo import ref_server
from schedguard.servers import RunningServer, ServerStartError, free_port, schedguard_argv

HAS_SERVER = importlib.util.find_spec("scheduler_ref.server") is not None
needs_server = pytest.mark.skipif(not HAS_SERVER, reason="scheduler_ref.server not written yet")


def test_top_level_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "ref" in out and "demo" in out


@pytest.mark.parametrize("command", ["ref", "demo"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "default:" in capsys.readouterr().out


def test_ref_defaults() -> None:
    args = build_parser().parse_args(["ref"])
    assert (args.profile, args.host, args.port, args.log_level) == (
        "hardened",
        "127.0.0.1",
        8000,
        "info",
    )


def test_demo_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.mem_limit_mb, args.timeout_s, args.json, args.port_base) == (1024, 20.0, None, 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["ref", "--profile", "nope"],
        ["ref", "--port", "70000"],
        ["demo", "--timeout-s", "0"],
        ["demo", "--mem-limit-mb", "-1"],
        [],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


# ExitOnMemoryError: runs in an isolated child because it ends the process.
def _memory_error_through_middleware() -> str:
    from schedguard._oom import ExitOnMemoryError

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise MemoryError

    async def noop(*_: Any) -> Any:
        return {}

    asyncio.run(ExitOnMemoryError(app)({"type": "http"}, noop, noop))
    return "survived"


def _other_error_through_middleware() -> str:
    from schedguard._oom import ExitOnMemoryError

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("boom")

    async def noop(*_: Any) -> Any:
        return {}

    asyncio.run(ExitOnMemoryError(app)({"type": "http"}, noop, noop))
    return "survived"


def _memory_error_in_endpoint_with_app_handler() -> int:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from schedguard._oom import exit_on_memory_error

    async def endpoint(_: Request) -> JSONResponse:
        raise MemoryError

    async def app_handler(_: Request, __: Exception) -> JSONResponse:  # what the server does
        return JSONResponse({"error": {"code": "out_of_memory"}}, status_code=500)

    app = Starlette(routes=[Route("/", endpoint)])
    app.add_exception_handler(MemoryError, app_handler)
    exit_on_memory_error(app)

    async def call() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get("/")).status_code

    return asyncio.run(call())


def test_memory_error_in_endpoint_overrides_app_500() -> None:
    r = run_limited(_memory_error_in_endpoint_with_app_handler, timeout_s=10)
    assert (r.outcome, r.error_type) == ("error", "ExitCode"), r
    assert "137" in (r.error_message or "")


def test_memory_error_exits_like_oom_kill() -> None:
    r = run_limited(_memory_error_through_middleware, timeout_s=10)
    assert (r.outcome, r.error_type) == ("error", "ExitCode")
    assert "137" in (r.error_message or "")


def test_other_errors_pass_through_middleware() -> None:
    r = run_limited(_other_error_through_middleware, timeout_s=10)
    assert (r.outcome, r.error_type, r.error_message) == ("error", "ValueError", "boom")


@needs_server
@pytest.mark.parametrize("profile", ["vulnerable", "hardened"])
def test_ref_serves_health_and_models(profile: str) -> None:
    port = free_port("127.0.0.1")
    server = RunningServer(ref_server(profile), {"scheduler_ref": port}, "127.0.0.1",
                           mem_limit_bytes=1 << 30)  # fmt: skip
    try:
        server.wait_ready(30.0)
        with httpx.Client(timeout=5.0) as client:
            assert client.get(server.url + "/health").status_code == 200
            models = client.get(server.url + "/v1/models").json()
        assert models["object"] == "list" and models["data"]
    finally:
        server.stop()
    assert not server.alive()


def test_start_failure_reports_log_tail() -> None:
    port = free_port("127.0.0.1")
    spec = ref_server("hardened")
    broken = type(spec)(
        "broken", lambda ports, host: [sys.executable, "-c", "import sys; sys.exit('no luck')"]
    )
    server = RunningServer(broken, {"broken": port}, "127.0.0.1", mem_limit_bytes=1 << 30)
    try:
        with pytest.raises(ServerStartError, match="no luck"):
            server.wait_ready(10.0)
    finally:
        server.stop()


def test_python_m_schedguard_runs_the_cli() -> None:
    proc = spawn_limited_server(
        [*schedguard_argv("--help")], mem_limit_bytes=1 << 30, stdout=-1, stderr=-1
    )
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        stop_server(proc)
    assert proc.returncode == 0
    assert b"usage: schedguard" in out

"""Who may read ``/metrics`` (issue 14, item 4), over real HTTP: open without keys, closed to
others once keys exist (the admin token or an allowed address opens it), and the separate
admin listener (``admin.listen``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from guard.app import create_app
from guard.policy import PolicyError, policy_from_yaml
from schedguard.servers import ServerSpec, schedguard_argv
from tests._guard_harness import fake_upstream, serve
from tests._guard_process import start
from tests._support import free_port

KEY = "sk-tenant-key-123456"
ADMIN_TOKEN = "admin-token-abcdef123"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


KEYS = f"keys: [{{key: {KEY}, tenant: team-secret}}]\n"


@contextlib.asynccontextmanager
async def guard(policy_yaml: str) -> AsyncIterator[str]:
    async with fake_upstream() as fake:
        app = create_app(policy_from_yaml(policy_yaml), upstream_url=fake.url)
        async with serve(app) as url:
            yield url


def client(url: str, source: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    return httpx.AsyncClient(base_url=url, timeout=30, transport=transport)


def code(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"])


async def test_without_keys_metrics_stay_open() -> None:
    async with guard("") as url, client(url) as c:
        resp = await c.get("/metrics")
        assert resp.status_code == 200
        assert "schedguard_guard_requests_total" in resp.text


async def test_with_keys_metrics_are_refused_even_to_a_tenant_key() -> None:
    async with guard(KEYS) as url, client(url) as c:
        served = await c.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}
        )
        assert served.status_code == 200
        for headers in ({}, {"authorization": f"Bearer {KEY}"}):
            resp = await c.get("/metrics", headers=headers)
            assert resp.status_code == 403 and code(resp) == "metrics_forbidden"
            assert "team-secret" not in resp.text
        # Health and readiness stay public.
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200


async def test_the_admin_token_opens_metrics() -> None:
    policy = KEYS + f"admin: {{metrics_key_sha256: {sha(ADMIN_TOKEN)}}}\n"
    async with guard(policy) as url, client(url) as c:
        auth = {"authorization": f"Bearer {KEY}"}
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=auth)).status_code == 200
        for headers in ({}, auth, {"authorization": "Bearer wrong-token-000"}):
            resp = await c.get("/metrics", headers=headers)
            assert resp.status_code == 401 and code(resp) == "admin_key_required"
        resp = await c.get("/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert resp.status_code == 200
        assert 'tenant="team-secret"' in resp.text


async def test_an_allowed_address_reads_metrics_and_others_do_not() -> None:
    policy = KEYS + "admin: {metrics_allow: [127.0.0.2/32]}\n"
    async with guard(policy) as url:
        async with client(url, "127.0.0.1") as c:
            resp = await c.get("/metrics")
            assert resp.status_code == 403 and code(resp) == "metrics_forbidden"
        async with client(url, "127.0.0.2") as c:
            assert (await c.get("/metrics")).status_code == 200


async def test_metrics_open_true_keeps_them_public_with_keys() -> None:
    async with guard(KEYS + "admin: {metrics_open: true}\n") as url, client(url) as c:
        assert (await c.get("/metrics")).status_code == 200


async def test_the_admin_listener_serves_health_and_metrics_and_nothing_else() -> None:
    port = free_port()
    policy = KEYS + f"admin: {{listen: '127.0.0.1:{port}'}}\n"
    async with guard(policy) as url, client(url) as public:
        auth = {"authorization": f"Bearer {KEY}"}
        assert (
            await public.post("/v1/chat/completions", json=CHAT, headers=auth)
        ).status_code == 200
        resp = await public.get("/metrics")
        assert resp.status_code == 404 and code(resp) == "not_found"
        assert (await public.get("/healthz")).status_code == 200
        async with client(f"http://127.0.0.1:{port}") as admin:
            assert (await admin.get("/healthz")).json() == {"status": "ok"}
            assert (await admin.get("/readyz")).status_code == 200
            resp = await admin.get("/metrics")
            assert resp.status_code == 200 and 'tenant="team-secret"' in resp.text
            for path in ("/v1/chat/completions", "/v1/models", "/guard/v1/check"):
                resp = await admin.get(path)
                assert resp.status_code == 404 and code(resp) == "not_found"
            resp = await admin.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert resp.status_code in (404, 405)
    # Stopped with the app: the port is free again.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("admin: {listen: 'nohost'}", "admin.listen"),
        ("admin: {listen: '127.0.0.1:70000'}", "admin.listen"),
        ("admin: {metrics_allow: [not-an-address]}", "admin.metrics_allow"),
        ("admin: {metrics_key_sha256: abc}", "admin.metrics_key_sha256"),
    ],
)
def test_admin_settings_are_validated(text: str, where: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(text)
    assert any(problem.startswith(where) for problem in info.value.problems), info.value.problems


@pytest.mark.timeout(240)
async def test_serve_with_workers_and_an_admin_port(tmp_path: Path) -> None:
    """``schedguard serve --workers 2 --admin-port P`` as deployed: every worker binds the admin
    port, each scrape there counts both workers' requests, the public port refuses /metrics."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(KEYS)
    admin_port = free_port()
    async with fake_upstream() as fake:

        def argv(ports: Mapping[str, int], host: str) -> list[str]:
            return schedguard_argv(
                "serve", "--upstream", fake.url, "--policy", str(policy), "--host", host,
                "--port", str(ports["guard"]), "--workers", "2", "--log-level", "warning",
                "--admin-port", str(admin_port),
            )  # fmt: skip

        guard = start(ServerSpec("guard", argv, health_path="/healthz"))
        try:
            await asyncio.to_thread(guard.wait_ready, 120)
            auth = {"authorization": f"Bearer {KEY}"}
            sent = 6
            for _ in range(sent):
                async with client(guard.url) as c:  # a fresh connection: either worker
                    resp = await c.get("/v1/models", headers=auth)
                    assert resp.status_code == 200
            async with client(guard.url) as c:
                resp = await c.get("/metrics")
                assert resp.status_code == 404 and code(resp) == "not_found"
            pattern = re.compile(
                r'^schedguard_guard_requests_total\{route="/v1/models",status="200"\} (\S+)$',
                re.M,
            )
            async with asyncio.timeout(60):  # the other worker's numbers are a second old
                while True:
                    async with client(f"http://127.0.0.1:{admin_port}") as admin:
                        resp = await admin.get("/metrics")
                    assert resp.status_code == 200
                    match = pattern.search(resp.text)
                    if match and float(match.group(1)) == sent:
                        break
                    await asyncio.sleep(0.2)
            async with client(f"http://127.0.0.1:{admin_port}") as admin:
                assert (await admin.get("/healthz")).status_code == 200
        finally:
            guard.stop()

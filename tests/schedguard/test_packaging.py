"""The wheel as users and the image get it, without a Docker engine.

The Docker build is replayed here: the files its build stage COPYs (less ``.dockerignore``) go
into a build context, and its ``RUN`` line (``pip wheel`` then ``scripts/install.sh`` with the
dependencies and ``--extras redis --no-pip``) runs there with the paths moved under a temporary
directory. The same wheel is also installed the plain way (``pip install WHEEL``, no extras) into
another fresh environment. Both install from pip's configured indexes (local mirrors here).

In each environment every ``schedguard`` command (walked from the parser) answers ``--help`` and
``--version``; the quick ones run for real (``policy show``, ``fuzz list``, a one-second ``fuzz
run``, ``fuzz replay``, ``ref`` and ``serve`` until ready, and in the plain environment one short
``demo``); a command that needs an extra says which in one line and exits 2.
"""

from __future__ import annotations

import fnmatch
import http.client
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from schedguard import __version__
from schedguard.cli import build_parser, iter_parsers
from tests._support import REPO_ROOT, free_port
from tests.schedguard.test_dockerfile import DOCKERFILE, parse

ROOT = REPO_ROOT
REPLAY = ROOT / "payloads" / "attacks" / "fan_out" / "fo-n-million.yaml"
pytestmark = [
    pytest.mark.skipif(
        shutil.which("sh") is None or sys.platform != "linux", reason="needs a POSIX shell (Linux)"
    ),
    # Building the wheel and two venvs falls in the first test's time: ~85 s quiet, ~150 s with
    # the other core busy. An outer bound, not a speed check.
    pytest.mark.timeout(900),
]


# ------------------------------------------------------------------------- the build context


def _ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def docker_ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (a path in the context) is left out by ``patterns`` (the subset of
    .dockerignore's syntax this repository uses: names, globs and a leading ``**/``)."""
    for pat in patterns:
        if fnmatch.fnmatchcase(rel, pat):
            return True
        if pat.startswith("**/") and fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pat[3:]):
            return True
    return False


def build_stage_copies() -> list[tuple[str, str]]:
    """(source, destination) of each COPY of the build stage that reads the context."""
    _, stages = parse(DOCKERFILE.read_text())
    out: list[tuple[str, str]] = []
    for ins in stages[0].ops("COPY"):
        words = [w for w in ins.args.split() if not w.startswith("--")]
        *sources, dest = words
        out.extend((src, dest) for src in sources)
    return out


def make_context(dest: Path) -> None:
    """The build stage's /src: what its COPYs take from the context, as Docker would."""
    patterns = _ignore_patterns()

    def ignore(directory: str, names: list[str]) -> list[str]:
        rel_dir = os.path.relpath(directory, ROOT)
        prefix = "" if rel_dir == "." else rel_dir + "/"
        return [n for n in names if docker_ignored(prefix + n, patterns)]

    for src, target in build_stage_copies():
        assert not docker_ignored(src, patterns), f"COPY {src}: .dockerignore leaves it out"
        path = ROOT / src
        assert path.exists(), f"COPY {src}: not in the repository"
        to = dest / target
        if path.is_dir():  # Docker copies a directory's contents into the destination
            shutil.copytree(path, to, ignore=ignore, dirs_exist_ok=True)
        else:
            if target.endswith("/") or target == ".":
                to = to / path.name
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, to)


def test_dockerignore_matching() -> None:
    pats = ["build", "**/__pycache__", "*.egg-info", "tests"]
    assert docker_ignored("build", pats) and not docker_ignored("guard/build.py", pats)
    assert docker_ignored("guard/http/__pycache__", pats)
    assert docker_ignored("schedguard.egg-info", pats) and docker_ignored("tests", pats)
    assert not docker_ignored("fuzz", pats)


# ------------------------------------------------------------------------------ environments


@dataclass(frozen=True)
class Env:
    name: str
    prefix: Path
    install_s: float

    @property
    def schedguard(self) -> str:
        return str(self.prefix / "bin" / "schedguard")

    def run(
        self, *args: str, timeout: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.schedguard, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=_clean_env(),
        )


def _clean_env() -> dict[str, str]:
    """The environment without this virtual environment or SCHEDGUARD_* settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SCHEDGUARD_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bindir)
    return env


def _start(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["sh", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], what: str, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Env]:
    """The Dockerfile's build stage replayed (its context, then its RUN line: the wheel, then
    install.sh into "image"), and beside install.sh the same wheel installed the plain way into
    "plain" (``pip install WHEEL``, no extras)."""
    build_dir = tmp_path_factory.mktemp("docker-build")
    context = build_dir / "src"
    make_context(context)
    _, stages = parse(DOCKERFILE.read_text())
    (run,) = (r.args for r in stages[0].ops("RUN") if "install.sh" in r.args)
    dist, image = build_dir / "dist", build_dir / "opt-schedguard"
    command = run.replace("/opt/schedguard", str(image)).replace("/dist", str(dist))
    assert command.startswith("python ")
    command = shlex.quote(sys.executable) + command[len("python") :]
    build_wheel, install = (step.strip() for step in command.split(" && "))
    # Byte-compiling the dependencies is not under test: skipped, it is a quarter of the time.
    env = {**_clean_env(), "PYTHON": sys.executable, "PIP_NO_CACHE_DIR": "1", "PIP_NO_COMPILE": "1"}
    start = time.monotonic()
    _finish(_start(build_wheel, context, env), "the wheel's build")
    built = time.monotonic()
    (wheel,) = dist.glob("schedguard-*.whl")
    plain = build_dir / "plain"
    plain_install = (
        f"{shlex.quote(sys.executable)} -m venv {shlex.quote(str(plain))} && "
        f"{shlex.quote(str(plain / 'bin' / 'python'))} -m pip install --quiet "
        f"{shlex.quote(str(wheel))}"
    )
    procs = {"image": _start(install, context, env), "plain": _start(plain_install, context, env)}
    out = {name: _finish(proc, f"the {name} install") for name, proc in procs.items()}
    installed = time.monotonic() - built
    assert f"schedguard {__version__}" in out["image"]  # install.sh's check printed the version
    print(f"\nwheel built in {built - start:.1f} s; both installs (side by side) {installed:.1f} s")
    return {"image": Env("image", image, installed), "plain": Env("plain", plain, installed)}


@pytest.fixture(scope="module")
def image_env(envs: dict[str, Env]) -> Env:
    return envs["image"]


@pytest.fixture(scope="module")
def plain_env(envs: dict[str, Env]) -> Env:
    return envs["plain"]


@pytest.fixture(scope="module", params=["image", "plain"])
def env(request: pytest.FixtureRequest, envs: dict[str, Env]) -> Env:
    return envs[request.param]


def _commands() -> list[list[str]]:
    """Every command's words, from the parser: [], ["ref"], ..., ["fuzz", "run"], ..."""
    return [prog.split()[1:] for prog, _ in iter_parsers(build_parser())]


# -------------------------------------------------------------------------------- the tests


def test_the_image_has_every_package_of_the_wheel(image_env: Env) -> None:
    site = next(image_env.prefix.glob("lib/python*/site-packages"))
    for package in ("guard", "scheduler_ref", "schedguard", "payloads", "fuzz", "loadtests"):
        assert (site / package / "__init__.py").is_file(), f"{package} is not in the image"
    assert not (site / "pip").exists()  # --no-pip
    assert (site / "redis").is_dir()  # --extras redis
    assert not (site / "httpx").exists()  # nothing of schedguard needs it


def test_plain_install_has_no_extras(plain_env: Env) -> None:
    site = next(plain_env.prefix.glob("lib/python*/site-packages"))
    for extra_module in ("locust", "hypothesis", "redis", "httpx", "atheris"):
        assert not (site / extra_module).exists(), extra_module


def test_help_and_version(env: Env) -> None:
    """``--help`` and ``--version`` of every command (side by side: each is a process start)."""

    def check(words: list[str]) -> list[str]:
        wrong = []
        helped = env.run(*words, "--help")
        usage = f"usage: schedguard {' '.join(words)}".rstrip()
        if helped.returncode != 0 or not helped.stdout.startswith(usage):
            wrong.append(f"{words} --help: {helped.returncode} {helped.stderr[-500:]}")
        version = env.run(*words, "--version")
        if (version.returncode, version.stdout) != (0, f"schedguard {__version__}\n"):
            wrong.append(f"{words} --version: {version.returncode} {version.stdout!r}")
        return wrong

    commands = _commands()
    assert len(commands) >= 11
    with ThreadPoolExecutor(max_workers=4) as pool:
        wrong = [w for found in pool.map(check, commands) for w in found]
    assert wrong == []


def test_policy_show(env: Env) -> None:
    proc = env.run("policy", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"upstream"' in proc.stdout and '"limits"' in proc.stdout


def test_fuzz_list_run_and_replay(env: Env, tmp_path: Path) -> None:
    listed = env.run("fuzz", "list")
    assert listed.returncode == 0, listed.stderr
    assert "placeholder-hardened" in listed.stdout
    ran = env.run(
        "fuzz", "run", "--target", "placeholder-hardened", "--engine", "search",
        "--duration", "1", "--no-save", "--quiet", "--out", str(tmp_path / "out"),
        cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "execs in" in ran.stdout
    replayed = env.run("fuzz", "replay", str(REPLAY), "--target", "guard-pipeline", cwd=tmp_path)
    assert replayed.returncode in (0, 1), replayed.stderr  # 1: a finding, which is an answer
    assert REPLAY.name in replayed.stdout


def _one_line_naming(proc: subprocess.CompletedProcess[str], extra: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and f"schedguard[{extra}]" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_load_says_which_extra(env: Env, tmp_path: Path) -> None:
    _one_line_naming(env.run("load", "--duration", "1", "--out", str(tmp_path)), "load")


def test_redis_says_which_extra(plain_env: Env) -> None:
    proc = plain_env.run("serve", "--redis", "redis://127.0.0.1:1", "--upstream", "http://x:1")
    _one_line_naming(proc, "redis")


def test_atheris_says_which_extra(env: Env, tmp_path: Path) -> None:
    proc = env.run(
        "fuzz", "run", "--target", "placeholder-hardened", "--engine", "atheris",
        "--duration", "1", "--no-save", "--out", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    _one_line_naming(proc, "fuzz")


def test_hypothesis_says_which_extra(plain_env: Env, tmp_path: Path) -> None:
    proc = plain_env.run(
        "fuzz", "run", "--target", "placeholder-hardened", "--engine", "hypothesis",
        "--duration", "1", "--no-save", "--out", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    _one_line_naming(proc, "fuzz")


def _status(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _serve_until(
    env: Env, started: list[subprocess.Popen[bytes]], args: list[str], port: int, path: str
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [env.schedguard, *args, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_clean_env(),
    )
    started.append(proc)
    deadline = time.monotonic() + 60
    while _status(port, path) != 200:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{args} not ready on {path}"
        time.sleep(0.1)  # polling a child's startup
    return proc


def test_ref_and_serve_run(env: Env, started: list[subprocess.Popen[bytes]]) -> None:
    """``ref`` answers /health; ``serve --embedded-reference`` starts the embedded reference
    scheduler and is ready; SIGTERM stops both cleanly."""
    ref_port, guard_port = free_port(), free_port()
    _serve_until(env, started, ["ref"], ref_port, "/health")
    guard = _serve_until(env, started, ["serve", "--embedded-reference"], guard_port, "/readyz")
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(timeout=20) in (0, 128 + signal.SIGTERM)


def test_demo_runs_from_a_plain_install(plain_env: Env, tmp_path: Path) -> None:
    """The command that needed httpx: a short run, every row measured."""
    out = tmp_path / "demo.json"
    proc = plain_env.run(
        "demo", "--mem-limit-mb", "384", "--timeout-s", "6", "--steady-requests", "5",
        "--json", str(out), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "steady" in proc.stdout and out.is_file()

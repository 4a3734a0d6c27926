"""The project's own upstreams (``scripts/upstreams/upstreams.py``) as a live campaign sees them.

When ``--target`` is a server the upstream scripts started (their pid file for that port says
so), the campaign knows how to restart it (``stop`` then ``start --background``: the
default ``--restart-cmd``) and where its log is (the campaign then reads the server's own
account of each finding: :mod:`fuzz.live._evidence`). The scripts are loaded from the source
tree; an installed wheel has none, and then nothing is known.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["ProjectUpstream", "find_project_upstream"]

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upstreams" / "upstreams.py"


@dataclass(frozen=True)
class ProjectUpstream:
    """One running upstream of the scripts: ``name`` (vllm, llamacpp), ``port``, its ``log``,
    and the command that restarts it."""

    name: str
    port: int
    log: Path
    restart_cmd: str


def _scripts() -> ModuleType | None:
    if not _SCRIPT.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_schedguard_upstreams", _SCRIPT)
    if spec is None or spec.loader is None:
        return None
    cached = sys.modules.get(spec.name)
    if cached is not None:
        return cached
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def find_project_upstream(port: int) -> ProjectUpstream | None:
    """The scripts' upstream serving ``port`` on this machine, if one does."""
    scripts = _scripts()
    if scripts is None:
        return None
    for name in scripts.UPSTREAMS:
        pid_file = scripts.paths_for(name).pid_file(port)
        try:
            record = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            continue
        script = shlex.quote(str(_SCRIPT))
        py = shlex.quote(sys.executable)
        restart = (
            f"{py} {script} stop {name} --port {port} && "
            f"{py} {script} start {name} --port {port} --background"
        )
        return ProjectUpstream(name, port, Path(record.get("log", "")), restart)
    return None

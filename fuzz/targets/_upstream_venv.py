"""A library the project's own upstream venvs hold, imported into the fuzz worker.

``scripts/upstreams/upstreams.py setup vllm|llamacpp`` installs vLLM (with xgrammar and torch)
and llama-cpp-python in venvs of their own, of the same CPython as the project's (3.11), so a
target can import what they hold rather than the main venv carrying ~2 GB of torch:
:func:`site_packages` finds the venv's ``site-packages`` holding a distribution, and
:func:`import_from` puts it at the end of ``sys.path`` (what the worker has itself wins) and
imports. Only the fuzz worker does this: it is a child process of its own.
:func:`findable` and :func:`load_module` do it for the modules in :data:`FROM_UPSTREAMS` (the
ones a target uses where the worker has none of its own: xgrammar, from vLLM's venv).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = [
    "FROM_UPSTREAMS",
    "SitePackages",
    "findable",
    "import_from",
    "load_module",
    "site_packages",
    "upstreams_root",
]

# module -> (upstream, distribution, version): where a module the worker lacks may be found.
FROM_UPSTREAMS: dict[str, tuple[str, str, str]] = {"xgrammar": ("vllm", "xgrammar", "0.2.8")}


def upstreams_root() -> Path:
    """scripts/upstreams/upstreams.py's cache root, read the same way (that script is not a
    package: it runs on any python3)."""
    explicit = os.environ.get("SCHEDGUARD_UPSTREAMS_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "schedguard" / "upstreams"


@dataclass(frozen=True)
class SitePackages:
    """The upstream's venv ``site-packages`` holding the distribution (None: ``problem`` says
    why not)."""

    path: Path | None
    problem: str | None


def site_packages(upstream: str, dist: str, version: str) -> SitePackages:
    """The ``site-packages`` of upstream ``upstream``'s venv (``vllm``, ``llamacpp``) where
    ``dist`` (its ``.dist-info`` name, ``llama_cpp_python``) is installed at ``version``."""
    root = upstreams_root() / upstream
    setup = f"python3 scripts/upstreams/upstreams.py setup {upstream}"
    sites = sorted((root / "venv").glob("lib/python3*/site-packages"))
    site = next((s for s in sites if (s / f"{dist}-{version}.dist-info").is_dir()), None)
    if site is None:
        return SitePackages(None, f"{dist} {version} is not set up in {root}: {setup}")
    ours = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if site.parent.name != ours:
        return SitePackages(
            None,
            f"{upstream}'s venv ({site}) is for {site.parent.name}, this is {ours}: "
            f"run the fuzz worker with {site.parent.name}",
        )
    return SitePackages(site, None)


def import_from(site: Path, module: str) -> ModuleType:
    """Import ``module``, with ``site`` searched after everything the worker has."""
    if str(site) not in sys.path:
        sys.path.append(str(site))
    return importlib.import_module(module)


def _upstream_site(module: str) -> Path | None:
    where = FROM_UPSTREAMS.get(module)
    if where is None:
        return None
    site = site_packages(*where).path
    if site is None or not ((site / module).is_dir() or (site / f"{module}.py").is_file()):
        return None
    return site


def findable(module: str) -> bool:
    """Whether ``module`` is installed here or in the upstream venv :data:`FROM_UPSTREAMS` names
    (nothing is imported, ``sys.path`` unchanged)."""
    return importlib.util.find_spec(module) is not None or _upstream_site(module) is not None


def load_module(module: str) -> ModuleType:
    """``module``, imported from here or else from its upstream venv."""
    if importlib.util.find_spec(module) is None:
        site = _upstream_site(module)
        if site is not None:
            return import_from(site, module)
    return importlib.import_module(module)

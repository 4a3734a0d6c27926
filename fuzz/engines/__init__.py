"""The engine registry: engine name -> run function.

Every engine has the signature of :class:`EngineFn` (the campaign calls it the same way for all):
``search`` (cost-guided hill climbing, :mod:`fuzz.search`), ``atheris`` (libFuzzer with the cost
fed back as coverage, :mod:`fuzz.engines.atheris_engine`) and ``hypothesis`` (grammar strategies
with ``target()`` on the cost, :mod:`fuzz.engines.hypothesis_engine`).

Engine modules are imported when first asked for, not here: the atheris harness imports this
package before it starts instrumenting, so nothing of the targets may be imported by it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fuzz.findings import EngineResult, FindingSet, Progress
    from fuzz.oracle import Oracle
    from fuzz.targets._base import Target

__all__ = [
    "ENGINE_NAMES",
    "EngineFn",
    "EngineUnavailable",
    "available_engines",
    "get_engine",
    "register",
]


class EngineFn(Protocol):
    """Run one engine on one target for ``duration_s`` seconds and report what it found.

    ``oracle_factory`` makes the oracle that judges (and minimises) findings; ``findings`` is
    the campaign's shared, deduplicating set; ``save``/``save_root`` say where payload files go;
    ``out_dir`` is the engine's scratch space (corpora, logs, databases). Engines accept and
    ignore keyword arguments they do not know.
    """

    def __call__(
        self,
        target: Target,
        oracle_factory: Callable[[], Oracle],
        *,
        duration_s: float,
        jobs: int = 1,
        out_dir: Path | None = None,
        seed: int | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        findings: FindingSet | None = None,
        save_root: Path | None = None,
        save: bool = True,
        minimise_s: float = 20.0,
        **kwargs: Any,
    ) -> EngineResult: ...


class EngineUnavailable(RuntimeError):
    """The engine exists but cannot run here (e.g. atheris is not installed)."""


# name -> module that defines ``run_engine`` (or calls :func:`register`).
_MODULES: dict[str, str] = {
    "search": "fuzz.engines.search_engine",
    "atheris": "fuzz.engines.atheris_engine",
    "hypothesis": "fuzz.engines.hypothesis_engine",
}
ENGINE_NAMES: tuple[str, ...] = tuple(_MODULES)
_REGISTERED: dict[str, EngineFn] = {}


def register(name: str, fn: EngineFn, *, module: str | None = None) -> None:
    """Add (or replace) an engine; ``module`` lets :func:`get_engine` import it lazily."""
    _REGISTERED[name] = fn
    if module is not None:
        _MODULES[name] = module


def get_engine(name: str) -> EngineFn:
    """The run function of engine ``name``.

    Raises ``KeyError`` for an unknown name and :class:`EngineUnavailable` when its module
    cannot be imported here (the message says what to install).
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    module_name = _MODULES.get(name)
    if module_name is None:
        raise KeyError(f"unknown fuzz engine {name!r}; choose one of {sorted(_MODULES)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineUnavailable(f"fuzz engine {name!r} cannot be loaded: {exc}") from exc
    if name not in _REGISTERED:
        fn = getattr(module, "run_engine", None)
        if fn is None:
            raise EngineUnavailable(f"{module_name} defines no run_engine()")
        _REGISTERED[name] = fn
    available = getattr(module, "engine_available", None)
    if available is not None and not available():
        hint = getattr(module, "INSTALL_HINT", "")
        raise EngineUnavailable(f"fuzz engine {name!r} is not available here. {hint}".strip())
    return _REGISTERED[name]


def available_engines() -> list[str]:
    """The engines that can run in this environment, in registry order."""
    out = []
    for name in _MODULES:
        try:
            get_engine(name)
        except (EngineUnavailable, KeyError):
            continue
        out.append(name)
    return out

"""The fuzz engines and their registry: engine name -> run function.

Every engine is called the same way (:class:`EngineFn`): with an :class:`EngineRun`, the run
context that holds the target, the oracle factory, the options, the progress events and the
findings, and returns the :class:`EngineResult` the run builds. Engine-specific keywords may
follow (atheris' ``mode``, hypothesis' ``round_examples``). The engines: ``search``
(cost-guided hill climbing, :mod:`fuzz.engines.search_engine`), ``atheris`` (libFuzzer with
the cost fed back as coverage, :mod:`fuzz.engines.atheris_engine`) and ``hypothesis`` (grammar
strategies with ``target()`` on the cost, :mod:`fuzz.engines.hypothesis_engine`).

This module imports no engine, target or oracle: the atheris harness imports this package
before it starts instrumenting, so engine modules are imported when first asked for and the run
context's names resolve on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from fuzz._exceptions import EngineUnavailable

if TYPE_CHECKING:
    from fuzz.engines._run import EngineResult, EngineRun, Progress, RunOptions

__all__ = [
    "ENGINE_NAMES",
    "EngineFn",
    "EngineResult",
    "EngineRun",
    "EngineUnavailable",
    "Progress",
    "RunOptions",
    "available_engines",
    "get_engine",
    "register",
]


class EngineFn(Protocol):
    """Run one engine for the run's duration and report what it found."""

    def __call__(self, run: EngineRun, /) -> EngineResult: ...


# name -> module that defines ``run_engine`` (or calls :func:`register`).
_MODULES: dict[str, str] = {
    "search": "fuzz.engines.search_engine",
    "atheris": "fuzz.engines.atheris_engine",
    "hypothesis": "fuzz.engines.hypothesis_engine",
}
ENGINE_NAMES: tuple[str, ...] = tuple(_MODULES)
# The extra of pyproject.toml that installs what an engine imports (named when it is missing).
_EXTRAS: dict[str, str] = {"atheris": "fuzz", "hypothesis": "fuzz"}
_REGISTERED: dict[str, EngineFn] = {}
_RUN_NAMES = frozenset({"EngineResult", "EngineRun", "Progress", "RunOptions"})


def __getattr__(name: str) -> Any:
    if name in _RUN_NAMES:
        from fuzz.engines import _run

        return getattr(_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        raise EngineUnavailable(_unloadable(name, exc)) from exc
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


def _unloadable(name: str, exc: ImportError) -> str:
    """One line: what is missing and, for an engine from an extra, the command that installs
    it."""
    extra = _EXTRAS.get(name)
    if extra is None or exc.name is None:
        return f"fuzz engine {name!r} cannot be loaded: {exc}"
    return (
        f"fuzz engine {name!r} needs {exc.name.partition('.')[0]}, which is not installed: "
        f"pip install 'schedguard[{extra}]'"
    )


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

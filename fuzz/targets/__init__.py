"""The registry of fuzz targets: name -> target, with what each exercises, its kind and budgets.

Targets are cheap to construct; each imports what it runs on first use (or in ``warmup``), so
listing them, or starting a worker for one, loads only that one's dependencies.
"""

from __future__ import annotations

import importlib

from fuzz.targets._base import Budgets, Cost, FuzzTarget, TargetKind
from fuzz.targets._common import TargetBase
from fuzz.targets._mutate import json_mutate
from fuzz.targets._vocab import load_vocab
from fuzz.targets.gateway import GuardApp, GuardPipeline
from fuzz.targets.scheduler import SchedulerState
from fuzz.targets.templates import (
    ChatTemplateHardened,
    ChatTemplateVulnerable,
    PlaceholderHardened,
    PlaceholderVulnerable,
)

__all__ = [
    "BACKEND_TARGETS",
    "FAILS_CI",
    "REGISTRY",
    "Budgets",
    "Cost",
    "FuzzTarget",
    "TargetBase",
    "TargetKind",
    "get_target",
    "json_mutate",
    "load_vocab",
]

REGISTRY: dict[str, FuzzTarget] = {
    t.name: t
    for t in (
        PlaceholderVulnerable(),
        PlaceholderHardened(),
        ChatTemplateVulnerable(),
        ChatTemplateHardened(),
        GuardPipeline(),
        GuardApp(),
        SchedulerState(),
    )
}

# Kinds whose findings fail a campaign (exit status 1): the code that is supposed to be safe.
FAILS_CI: frozenset[str] = frozenset({"hardened", "guard"})


_LOADED: dict[str, FuzzTarget] = {}

# The structured-output backend targets (fuzz/targets/backends.py): named like the built-in
# ones, but kept out of REGISTRY (CI layouts, in-process property tests) because they run
# native backends from an optional extra, only in the isolated worker.
BACKEND_TARGETS: dict[str, str] = {
    "backend-outlines": "fuzz.targets.backends:OutlinesBackend",
    "backend-xgrammar": "fuzz.targets.backends:XgrammarBackend",
    "backend-guidance": "fuzz.targets.backends:GuidanceBackend",
    # the backends against each other (fuzz/targets/backends_diff.py)
    "backend-diff": "fuzz.targets.backends_diff:DiffBackends",
    # llama.cpp's grammar code against the guard's GBNF reading (llama-cpp-python's venv)
    "backend-llamacpp-grammar": "fuzz.targets.llamacpp_grammar:LlamaCppGrammarBackend",
}


def get_target(name: str) -> FuzzTarget:
    """The registered target ``name``, or ``package.module:Class`` (instantiated once and cached
    under that name: how tests and plugins add targets the worker can import). Loaded targets
    stay out of :data:`REGISTRY`, which lists only the built-in ones (CI layouts, ``fuzz list``)."""
    target = REGISTRY.get(name) or _LOADED.get(name)
    if target is not None:
        return target
    if name in BACKEND_TARGETS:
        _LOADED[name] = get_target(BACKEND_TARGETS[name])
        return _LOADED[name]
    module_name, colon, attr = name.partition(":")
    if colon and module_name and attr:
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"cannot load fuzz target {name!r}: {exc}") from None
        made: FuzzTarget = cls()
        _LOADED[name] = made
        return made
    raise KeyError(
        f"unknown fuzz target {name!r}; choose one of {sorted([*REGISTRY, *BACKEND_TARGETS])}"
    )

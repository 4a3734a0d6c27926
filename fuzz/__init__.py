"""Fuzzing schedguard's targets for resource exhaustion: targets, a resource oracle, engines.

Nothing outside the CLI layer, the benches and the tests imports this package. One vocabulary
for two kinds of target, an in-process one or a live server (:mod:`fuzz.live`):

- target: :mod:`fuzz.targets` (a ``FuzzTarget``), or :class:`fuzz.live.LiveTarget`;
- oracle (runs an input, judges it): :class:`fuzz.oracle.Oracle` (a limited worker process),
  or :class:`fuzz.live.LiveOracle` (HTTP, a guard's dry run first in a differential campaign);
- campaign: :func:`fuzz.campaign.run_campaign`, or :func:`fuzz.live.run_live_campaign`;
- recording a finding (confirm, minimise, save): :func:`fuzz.findings.record`, or
  :class:`fuzz.live.LiveRecorder` (against the server, bringing it back after a crash);
- replay of saved payload files: :func:`fuzz.replay.replay_paths`, or
  :func:`fuzz.live.replay_live`;

and one model of what they share: a verdict and its cost (:class:`Outcome`, :class:`Cost`,
:class:`Budgets`), the run context every engine and campaign reports through
(:class:`EngineRun`), findings deduplicated by cause and saved as payload files
(:mod:`fuzz.findings`), the minimisers (:mod:`fuzz.minimize`: bytes and JSON bodies) and the
reports (:mod:`fuzz.report`). The engines (:mod:`fuzz.engines`) search in-process targets; a
live campaign is its own engine (``live`` or ``differential``).

The public API is what this module exports. Apart from the exceptions, the names are imported
on first use: the atheris harness imports this package before it instruments the targets, so
importing ``fuzz`` must not import them (or the guard) yet.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fuzz._exceptions import (
    AppInternalError,
    CheckFailed,
    CostFinding,
    EngineUnavailable,
    InvariantViolation,
    RemoteTargetRefused,
    SoftTimeout,
    TargetUnreachable,
    WorkerError,
)

if TYPE_CHECKING:
    from fuzz.campaign import CampaignOptions, run_campaign
    from fuzz.engines import (
        ENGINE_NAMES,
        EngineResult,
        EngineRun,
        Progress,
        RunOptions,
        available_engines,
        get_engine,
    )
    from fuzz.findings import Finding, FindingSet
    from fuzz.live import LiveOptions, run_live_campaign
    from fuzz.minimize import MinimiseStats, ddmin, shrink_json
    from fuzz.oracle import Oracle, Outcome
    from fuzz.replay import ReplayResult, replay_file, replay_paths
    from fuzz.report import CampaignReport, write_reports
    from fuzz.targets import (
        FAILS_CI,
        REGISTRY,
        Budgets,
        Cost,
        FuzzTarget,
        TargetKind,
        get_target,
    )

__all__ = [
    "ENGINE_NAMES",
    "FAILS_CI",
    "REGISTRY",
    "AppInternalError",
    "Budgets",
    "CampaignOptions",
    "CampaignReport",
    "CheckFailed",
    "Cost",
    "CostFinding",
    "EngineResult",
    "EngineRun",
    "EngineUnavailable",
    "Finding",
    "FindingSet",
    "FuzzTarget",
    "InvariantViolation",
    "LiveOptions",
    "MinimiseStats",
    "Oracle",
    "Outcome",
    "Progress",
    "RemoteTargetRefused",
    "ReplayResult",
    "RunOptions",
    "SoftTimeout",
    "TargetKind",
    "TargetUnreachable",
    "WorkerError",
    "available_engines",
    "ddmin",
    "get_engine",
    "get_target",
    "replay_file",
    "replay_paths",
    "run_campaign",
    "run_live_campaign",
    "shrink_json",
    "write_reports",
]

# name -> the module that defines it (imported by __getattr__ when the name is first used).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("CampaignOptions", "run_campaign"), "fuzz.campaign"),
    **dict.fromkeys(("ReplayResult", "replay_file", "replay_paths"), "fuzz.replay"),
    **dict.fromkeys(
        (
            "ENGINE_NAMES",
            "EngineResult",
            "EngineRun",
            "Progress",
            "RunOptions",
            "available_engines",
            "ddmin",
            "get_engine",
        ),
        "fuzz.engines",
    ),
    **dict.fromkeys(("Finding", "FindingSet"), "fuzz.findings"),
    **dict.fromkeys(("LiveOptions", "run_live_campaign"), "fuzz.live"),
    **dict.fromkeys(("MinimiseStats", "ddmin", "shrink_json"), "fuzz.minimize"),
    **dict.fromkeys(("Oracle", "Outcome"), "fuzz.oracle"),
    **dict.fromkeys(("CampaignReport", "write_reports"), "fuzz.report"),
    **dict.fromkeys(
        ("FAILS_CI", "REGISTRY", "Budgets", "Cost", "FuzzTarget", "TargetKind", "get_target"),
        "fuzz.targets",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

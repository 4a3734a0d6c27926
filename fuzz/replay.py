"""Replays of saved payload files against an in-process target (``schedguard fuzz replay``):
what each does now.

Each file runs against a target (the one it records, or another), always in the isolated
worker (these are attack payloads), and its outcome is compared with the cause it records. A
live server's replay is :func:`fuzz.live.replay_live`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz.findings import cause_of
from fuzz.oracle import Oracle, Outcome
from fuzz.targets import get_target

__all__ = ["MAX_REPLAY_BYTES", "ReplayResult", "replay_file", "replay_paths"]

# Larger bodies are refused by the guard's framing before any check sees them (max_body_bytes);
# replaying them against a check or a template engine says nothing.
MAX_REPLAY_BYTES = 8 << 20


@dataclass
class ReplayResult:
    """One payload file replayed: ``outcome`` None when the payload does not apply to the
    target (``note`` says why); ``reproduced``: the recorded cause (if any) happened again."""

    path: str
    target: str
    outcome: Outcome | None
    recorded_cause: str | None
    note: str = ""

    @property
    def is_finding(self) -> bool:
        return self.outcome is not None and self.outcome.is_finding

    @property
    def reproduced(self) -> bool | None:
        if self.recorded_cause is None or self.outcome is None:
            return None
        return self.outcome.is_finding and cause_of(self.outcome) == self.recorded_cause

    def to_dict(self) -> dict[str, Any]:
        out = self.outcome
        return {
            "path": self.path,
            "target": self.target,
            "verdict": None if out is None else out.verdict,
            "cause": None if out is None or not out.is_finding else cause_of(out),
            "error_code": None if out is None else out.error_code,
            "cost": None if out is None else out.cost.to_dict(),
            "recorded_cause": self.recorded_cause,
            "reproduced": self.reproduced,
            "note": self.note,
        }


def replay_file(path: Path, target_name: str | None, oracles: dict[str, Oracle]) -> ReplayResult:
    """Replay one payload file; ``oracles`` caches one oracle per target (the caller closes
    them). The target is ``target_name``, else the one the file records."""
    from payloads.loader import load_payload

    payload = load_payload(path)
    recorded = payload.finding.target if payload.finding is not None else None
    name = target_name or recorded
    if name is None:
        raise ValueError(f"{path}: no target recorded in the file; pass --target")
    target = get_target(name)
    cause = payload.finding.cause if payload.finding is not None and name == recorded else None
    if payload.transport is not None:
        return ReplayResult(str(path), name, None, cause, "needs a transport (HTTP framing)")
    if payload.size_bound > MAX_REPLAY_BYTES:
        return ReplayResult(str(path), name, None, cause, "body over 8 MiB: the HTTP layer's")
    to_input = getattr(target, "input_from_payload", None)
    body = payload.body_bytes()
    headers = payload.header_items()
    data = body if to_input is None else to_input(body, payload.endpoint, headers)
    if data is None:
        return ReplayResult(str(path), name, None, cause, "not applicable to this target")
    oracle = oracles.get(name)
    if oracle is None:
        # Always in the worker: these are attack payloads, whatever the target's default.
        oracle = oracles[name] = Oracle(name, isolate=True)
    return ReplayResult(str(path), name, oracle.run(data), cause)


def replay_paths(paths: Sequence[Path], target_name: str | None = None) -> list[ReplayResult]:
    """Replay payload files (directories: every ``*.yaml`` under them)."""
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.rglob("*.yaml")) if p.is_dir() else [p])
    oracles: dict[str, Oracle] = {}
    try:
        return [replay_file(f, target_name, oracles) for f in files]
    finally:
        for o in oracles.values():
            o.close()

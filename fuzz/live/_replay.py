"""Replaying saved payload files against a live server (and a guard): what each does now.

``schedguard fuzz replay DIR --target http://UPSTREAM [--guard http://GUARD]`` sends every
payload file under DIR once, judged as the campaign that found it judged it
(:class:`fuzz.live._oracle.LiveOracle`): with a guard, an under-count saved before the guard's
counting was fixed replays as ``ok`` (or ``rejected``) after. Payloads judged by the HTTP layer
(``layer: http``) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz.findings import cause_of
from fuzz.live._http import HttpClient, RequestPacer, discover_model, require_loopback
from fuzz.live._monitor import Health
from fuzz.live._oracle import LiveBudgets, LiveOracle, Measured
from fuzz.live._request import LiveRequest

__all__ = ["LiveReplay", "replay_live"]


@dataclass
class LiveReplay:
    """One payload file replayed: ``measured`` None when it was not sent (``note`` says why);
    ``recorded``: the cause its file records."""

    path: str
    measured: Measured | None
    recorded: str | None
    note: str = ""

    @property
    def is_finding(self) -> bool:
        return self.measured is not None and self.measured.outcome.is_finding

    def to_dict(self) -> dict[str, Any]:
        m = self.measured
        out = m.outcome if m is not None else None
        return {
            "path": self.path,
            "verdict": None if out is None else out.verdict,
            "cause": None if out is None or not out.is_finding else cause_of(out),
            "error_code": None if out is None else out.error_code,
            "excess": None if m is None or m.guard is None else m.excess,
            "guard_prompt_tokens": None if m is None else m.extra.get("guard_prompt_tokens"),
            "upstream_prompt_tokens": None if m is None else m.extra.get("upstream_prompt_tokens"),
            "recorded_cause": self.recorded,
            "note": self.note,
        }


def replay_live(
    paths: Sequence[Path],
    target: str,
    *,
    guard: str | None = None,
    model: str | None = None,
    allow_remote: bool = False,
    max_rps: float = 50.0,
    timeout_s: float = 60.0,
    ignore_5xx: Sequence[str] = (),
    headers: Sequence[tuple[str, str]] = (),
) -> list[LiveReplay]:
    """Send each payload file under ``paths`` once to ``target`` (through ``guard``'s dry
    run when given). ``model``: put in every body (default: the server's first model)."""
    from payloads import load_payload

    for url in (target, guard):
        if url is not None:
            require_loopback(url, allow_remote=allow_remote)
    limiter = RequestPacer(max_rps)
    upstream = HttpClient(target, limiter=limiter, timeout_s=timeout_s, headers=dict(headers))
    gclient = (
        HttpClient(guard, limiter=limiter, timeout_s=timeout_s, headers=dict(headers))
        if guard
        else None
    )
    budgets = LiveBudgets(timeout_s=timeout_s, ignore_5xx=tuple(re.compile(p) for p in ignore_5xx))
    oracle = LiveOracle(
        upstream,
        budgets,
        health=Health(upstream),
        guard=gclient,
        guard_health=Health(gclient) if gclient is not None else None,
    )
    if model is None:
        model = discover_model(upstream)
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.rglob("*.yaml")) if p.is_dir() else [p])
    out: list[LiveReplay] = []
    try:
        for f in files:
            payload = load_payload(f)
            recorded = payload.finding.cause if payload.finding is not None else None
            if payload.layer != "pipeline" or payload.method != "POST":
                out.append(LiveReplay(str(f), None, recorded, "judged by the HTTP layer"))
                continue
            req = LiveRequest.from_input(payload.body_bytes())
            req = LiveRequest(payload.endpoint, req.body, req.raw, seed_id=payload.id,
                              benign=payload.kind == "benign")  # fmt: skip
            if model is not None and isinstance(req.body, dict):
                req = req.with_body({**req.body, "model": model})
            out.append(LiveReplay(str(f), oracle.run(req), recorded))
    finally:
        upstream.close()
        if gclient is not None:
            gclient.close()
    return out

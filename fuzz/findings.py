"""Findings: deduplicated by cause, minimised with the oracle, saved as payload files.

A cause is what makes two findings "the same bug" (:func:`cause_of`): a crash's exception type
and innermost frame, or the resource that ran out (time: a timeout or the wall budget; memory:
the ``RLIMIT_AS`` cap or the memory budget; steps; output tokens; cost per byte); for live
servers (:mod:`fuzz.live`) also a 5xx (status and message), an under-count (the request shape
the guard does not count) and a false positive (the guard's code and the benign payload).

One model for both kinds of target: a :class:`Finding` per cause in a campaign's
:class:`FindingSet`, a measured crossing confirmed by a second run (:data:`MEASURED_VERDICTS`),
minimised (:mod:`fuzz.minimize`) with "the oracle still reports the same cause" as the
predicate, and saved as a payload file with the cost before and after minimisation
(:func:`save_finding`; a cause that already has a file is not saved twice). :func:`record` is
that path for an in-process target (its oracle, :func:`fuzz.minimize.ddmin` over its bytes);
a live server's recorder (:class:`fuzz.live.LiveRecorder`) takes it against the server, with
what only a server needs (bringing it back after a crash, naming an under-count by its shape).
"""

from __future__ import annotations

import re
import shlex
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuzz.minimize import MinimiseStats, ddmin

if TYPE_CHECKING:
    from fuzz.oracle import Oracle, Outcome
    from fuzz.targets import Cost, FuzzTarget

__all__ = [
    "MEASURED_VERDICTS",
    "Finding",
    "FindingSet",
    "cause_of",
    "known_causes",
    "payload_cost",
    "record",
    "replay_command",
    "safe_target_name",
    "save_finding",
]


MEASURED_VERDICTS = frozenset({"budget", "cost_per_byte"})
"""Verdicts that come from a measurement near a threshold: a finding only once it reproduces
(a GC pause or a busy machine is not a finding)."""
_MAX_RECORDED_INPUT = 256 << 10
# Oracle runs ddmin may spend on one finding (besides its deadline).
_MAX_TESTS = 2000


def cause_of(outcome: Outcome) -> str:
    """The deduplication key of a finding (and the minimiser's notion of "same cause")."""
    v = outcome.verdict
    if v == "server_error":  # a live server's 5xx: status and the normalised message
        return f"5xx:{outcome.where or '-'}"
    if v in ("undercount", "false_positive"):  # the differential campaign's (fuzz.live)
        return f"{v}:{outcome.where or '-'}"
    if v in ("timeout",) or outcome.where == "budget:wall_s":
        return "time"
    if v == "oom" or outcome.where == "budget:mem_bytes":
        return "memory"
    if v == "budget":
        return outcome.where or "budget"
    if v == "cost_per_byte":
        return "cost_per_byte"
    return f"crash:{outcome.error_type}:{outcome.where or '-'}"


@dataclass
class Finding:
    """One deduplicated finding. ``data`` is the minimised input (``original`` the one found);
    ``path`` the payload file (None when saving was off); ``known`` when a payload file with
    the same cause already existed (then ``path`` is that file). ``replay_command``: the
    command that replays it (:func:`replay_command`); ``evidence``: what a live server itself
    said about it (:mod:`fuzz.live._evidence`: log excerpt, exception, signal, component, its
    memory and CPU before and after); ``occurrences``: how many times the campaign met this
    cause (the first included); ``fresh_only``: it reproduced only on a freshly started
    server (a state the campaign's earlier requests left behind is part of it)."""

    target: str
    engine: str
    cause: str
    outcome: Outcome
    original: bytes
    data: bytes
    cost_before: Cost
    cost_after: Cost
    found_after_s: float
    minimised: bool = False
    minimise_tests: int = 0
    path: str | None = None
    known: bool = False
    seed: int | None = None
    save_error: str | None = None
    replay_command: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    occurrences: int = 1
    fresh_only: bool = False

    @property
    def size_bytes(self) -> int:
        return len(self.data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "engine": self.engine,
            "cause": self.cause,
            "verdict": self.outcome.verdict,
            "error_type": self.outcome.error_type,
            "error_message": self.outcome.error_message,
            "where": self.outcome.where,
            "size_bytes": self.size_bytes,
            "original_size_bytes": len(self.original),
            "cost": self.cost_after.to_dict(),
            "cost_before_minimisation": self.cost_before.to_dict(),
            "minimised": self.minimised,
            "minimise_tests": self.minimise_tests,
            "found_after_s": round(self.found_after_s, 3),
            "path": self.path,
            "known": self.known,
            "seed": self.seed,
            "replay_command": self.replay_command,
            "occurrences": self.occurrences,
            "fresh_only": self.fresh_only,
            **({"evidence": self.evidence} if self.evidence else {}),
            **({"save_error": self.save_error} if self.save_error else {}),
            "input_preview": self.data[:200].decode("utf-8", "replace"),
            # The whole minimised input, what a report's reproduction sends (a larger one is
            # in the payload file).
            **(
                {"input": self.data.decode("utf-8", "replace")}
                if len(self.data) <= _MAX_RECORDED_INPUT
                else {}
            ),
            **(
                {"original_input": self.original.decode("utf-8", "replace")}
                if len(self.original) <= _MAX_RECORDED_INPUT
                else {}
            ),
        }


class FindingSet:
    """The campaign's findings so far, one per cause; safe to share between engine threads."""

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._causes: set[str] = set()
        self.findings: list[Finding] = []
        # cause -> times it was met again after its finding (the triage's group size).
        self.repeats: Counter[str] = Counter()
        # cause -> payload file already in the corpus for it (not saved twice).
        self.known = dict(known or {})

    def has(self, cause: str) -> bool:
        with self._lock:
            return cause in self._causes

    def claim(self, cause: str) -> bool:
        """True the first time ``cause`` is claimed (the caller then records it)."""
        with self._lock:
            if cause in self._causes:
                return False
            self._causes.add(cause)
            return True

    def add(self, finding: Finding) -> None:
        with self._lock:
            self.findings.append(finding)

    def met_again(self, cause: str) -> None:
        """``cause`` came up again after it was recorded (a duplicate)."""
        with self._lock:
            self.repeats[cause] += 1
            for f in self.findings:
                if f.cause == cause:
                    f.occurrences = 1 + self.repeats[cause]

    def __len__(self) -> int:
        return len(self.findings)


def safe_target_name(name: str) -> str:
    """The directory name of a target's findings (``module:Class`` targets included)."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:64] or "target"


def replay_command(path: str | None, target_url: str | None = None) -> str | None:
    """The command that replays a saved finding: ``schedguard fuzz replay FILE`` (the file
    records its in-process target), with ``--target URL`` for a live server's."""
    if path is None:
        return None
    cmd = ["schedguard", "fuzz", "replay", path]
    if target_url is not None:
        cmd += ["--target", target_url]
    return shlex.join(cmd)


def known_causes(target: str, root: Path) -> dict[str, str]:
    """cause -> path of the payload files already saved for ``target`` under ``root``."""
    from payloads import load_payload

    directory = Path(root) / "found" / safe_target_name(target)
    out: dict[str, str] = {}
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.yaml")):
        try:
            p = load_payload(path)
        except Exception:
            continue
        if p.finding is not None:
            out.setdefault(p.finding.cause, str(path))
    return out


def record(
    target: FuzzTarget,
    data: bytes,
    outcome: Outcome,
    engine: str,
    *,
    oracle: Oracle,
    seen: FindingSet,
    found_after_s: float,
    seed: int | None = None,
    minimise: bool = True,
    minimise_s: float = 20.0,
    save_root: Path | None = None,
) -> Finding | None:
    """Deduplicate, minimise, re-measure and save one finding; None when its cause is known
    to this campaign already (or a measured crossing did not reproduce). ``save_root``: the
    corpus root the payload file goes under (None: not saved)."""
    cause = cause_of(outcome)
    if seen.has(cause):
        seen.met_again(cause)
        return None
    if outcome.verdict in MEASURED_VERDICTS:
        # A measured crossing (not a crash, kill or cap) must reproduce: a GC pause or a busy
        # machine is not a finding.
        again = oracle.run(data)
        if not again.is_finding or cause_of(again) != cause:
            return None
    if not seen.claim(cause):
        return None
    small = data
    stats = MinimiseStats()
    if minimise and len(data) > 1:

        def same_cause(candidate: bytes) -> bool:
            out = oracle.run(candidate)
            return out.is_finding and cause_of(out) == cause

        small = ddmin(data, same_cause, max_tests=_MAX_TESTS, deadline_s=minimise_s, stats=stats)
    after = oracle.run(small) if small != data else outcome
    if not after.is_finding or cause_of(after) != cause:
        # Flaky (time near the budget): keep the input as found.
        small, after = data, outcome
    finding = Finding(
        target=target.name,
        engine=engine,
        cause=cause,
        outcome=after,
        original=data,
        data=small,
        cost_before=outcome.cost,
        cost_after=after.cost,
        found_after_s=found_after_s,
        minimised=minimise and small != data,
        minimise_tests=stats.tests,
        seed=seed,
    )
    if save_root is not None:
        try:
            _save(finding, target, seen, save_root)
        except Exception as exc:  # the finding stands; report why it has no file
            finding.save_error = f"{type(exc).__name__}: {exc}"
        finding.replay_command = replay_command(finding.path)
    seen.add(finding)
    return finding


def _save(finding: Finding, target: FuzzTarget, seen: FindingSet, root: Path) -> None:
    to_body = getattr(target, "payload_body", None)
    body, endpoint = to_body(finding.data) if to_body is not None else (finding.data, "/")
    out = finding.outcome
    description = (
        f"Found by the {finding.engine} engine on {target.name}: {out.verdict}"
        f" ({finding.cause}); {len(finding.original)} bytes minimised to {finding.size_bytes}."
    )
    if out.error_message:
        description += f" {out.error_message[:200]}"
    save_finding(
        finding,
        seen,
        root,
        class_=str(getattr(target, "class_", "volume")),
        body=body,
        endpoint=endpoint,
        target_field=str(getattr(target, "target_field", "body")),
        description=description,
    )


def save_finding(
    finding: Finding,
    seen: FindingSet,
    root: Path,
    *,
    class_: str,
    body: bytes,
    endpoint: str,
    target_field: str,
    description: str,
) -> None:
    """Save ``finding`` as a payload file under the corpus root ``root`` and set its ``path``
    (both kinds of target): an attack under ``<root>/found/<target>/``
    (:func:`payloads.save_found`), a false positive, a benign request the guard refuses, under
    ``<root>/benign/`` (:func:`payloads.save_benign_found`), so that a corpus that adopts it
    tests that the guard lets it through. A cause that has a file already is not saved again:
    ``path`` is that file and ``known`` is set. Raises what the writer raises."""
    from payloads import save_benign_found, save_found

    existing = seen.known.get(finding.cause)
    if existing is not None:
        finding.path, finding.known = existing, True
        return
    common: dict[str, Any] = {
        "target": safe_target_name(finding.target),
        "body": body,
        "endpoint": endpoint,
        "target_field": target_field,
        "description": description,
        "engine": finding.engine,
        "cause": finding.cause,
        "cost_before": payload_cost(finding.cost_before, len(finding.original)),
        "cost_after": payload_cost(finding.cost_after, finding.size_bytes),
        "seed": finding.seed,
        "minimised": finding.minimised,
        "root": root,
    }
    if finding.outcome.verdict == "false_positive":
        payload = save_benign_found(**common)
    else:
        payload = save_found(class_=class_, **common)
    finding.path = str(payload.path)
    seen.known[finding.cause] = finding.path


def payload_cost(cost: Cost, size: int) -> dict[str, float]:
    """A cost as the corpus format records it (:data:`payloads.loader.COST_METRICS`)."""
    from payloads.loader import COST_METRICS

    d = cost.to_dict()
    d["size_bytes"] = float(size)
    d["cost_per_byte"] = round(cost.per_byte(size), 6)
    return {k: v for k, v in d.items() if k in COST_METRICS}

"""Triage: a campaign's findings grouped by cause signature, one representative per group.

The signature is the upstream's own evidence when the campaign could read it (a live finding's
server log: the signal or exception and the culprit frame, :mod:`fuzz.live._evidence`); else
what the answer and the request show: the status and error code of the answer (or that none
came) and the request's shape (its fields beyond a plain chat). An in-process finding's cause is
its signature already (exception type and innermost project frame, or the budget crossed).
Each group keeps its smallest minimised finding as the representative and counts every time
the campaign met one of its causes (:attr:`fuzz.findings.Finding.occurrences`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fuzz.findings import Finding

__all__ = ["Group", "signature_of", "triage"]


@dataclass
class Group:
    """Findings with one signature: ``representative`` (the smallest), ``count`` (times met),
    ``causes`` (the findings' dedup keys)."""

    signature: str
    representative: Finding
    findings: list[Finding] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(f.occurrences for f in self.findings)

    @property
    def causes(self) -> list[str]:
        return [f.cause for f in self.findings]

    @property
    def component(self) -> str | None:
        comp = self.representative.evidence.get("component")
        return comp if isinstance(comp, str) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "count": self.count,
            "findings": len(self.findings),
            "causes": self.causes,
            "component": self.component,
            "representative": self.representative.to_dict(),
        }


def signature_of(f: Finding) -> str:
    """The finding's cause signature (see the module docstring)."""
    ev = f.evidence
    sig = ev.get("signature")
    if isinstance(sig, str) and sig:
        return sig
    if not ev:  # an in-process target's finding: its cause names it
        return f.cause
    if f.outcome.verdict in ("undercount", "false_positive"):
        return f.cause
    status = ev.get("status")
    answer = "no answer" if status is None else f"HTTP {status}"
    code = ev.get("error_code") or "-"
    if f.outcome.verdict == "crash":
        answer = f"server died ({answer})"
    return f"{answer}:{code}:{ev.get('request_shape') or '-'}"


def triage(findings: list[Finding]) -> list[Group]:
    """The groups, the most frequent first."""
    groups: dict[str, Group] = {}
    for f in findings:
        sig = signature_of(f)
        g = groups.get(sig)
        if g is None:
            g = groups[sig] = Group(sig, f)
        g.findings.append(f)
        if f.size_bytes < g.representative.size_bytes:
            g.representative = f
    return sorted(groups.values(), key=lambda g: (-g.count, g.signature))

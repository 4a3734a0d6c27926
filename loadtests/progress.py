"""A run's progress while it runs: the numbers the final report will hold, so far.

The locustfile's master builds a :class:`LoadProgress` every few seconds from the SLO report of
the records so far (:func:`loadtests.slo.evaluate` over the same stats the gate reads when the
run ends: one definition of each number) and writes it to ``progress.json`` (:func:`write`, an
atomic replace); ``schedguard load`` reads it (:func:`read`) and shows it (:func:`render`): on
a terminal one line rewritten in place, otherwise a plain line every so often. The gate writes
a last one from its own report, so the last line shown is the summary's numbers.

Plain Python: locust is not imported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["LoadProgress", "of_numbers", "read", "render", "write"]


@dataclass(frozen=True)
class LoadProgress:
    """Where a run is: seconds into it (of ``total_s``), users by kind, and the report's
    numbers so far."""

    elapsed_s: float
    total_s: float | None
    benign_users: int
    attack_users: int
    benign_requests: int
    benign_rps: float
    benign_p50_ms: float | None
    benign_p99_ms: float | None
    benign_errors: int
    attack_requests: int
    # The gate's attack figures (loadtests.outcomes): content attacks a content check refused,
    # of those the checks judged; flood bursts a limit stopped, of those sent.
    content_stopped: int
    content_judged: int
    floods_stopped: int
    floods: int
    final: bool = False


def of_numbers(
    numbers: Mapping[str, Any],
    *,
    elapsed_s: float,
    total_s: float | None,
    users: Mapping[str, int],
    final: bool = False,
) -> LoadProgress:
    """The progress line of a report's ``numbers`` (:func:`loadtests.slo.evaluate`)."""
    attacks = numbers["attacks"]
    return LoadProgress(
        elapsed_s=round(elapsed_s, 1),
        total_s=total_s,
        benign_users=int(users.get("benign", 0)),
        attack_users=int(users.get("attack", 0)),
        benign_requests=int(numbers["benign_requests"]),
        benign_rps=float(numbers["benign_rps"]),
        benign_p50_ms=numbers["benign_p50_ms"],
        benign_p99_ms=numbers["benign_p99_ms"],
        benign_errors=int(numbers["benign_errors"]),
        attack_requests=int(numbers["attack_requests"]),
        content_stopped=int(attacks["content_stopped"]),
        content_judged=int(attacks["content_judged"]),
        floods_stopped=int(attacks["flood_bursts_stopped"]),
        floods=int(attacks["flood_bursts"]),
        final=final,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def render(p: LoadProgress) -> str:
    """One line, e.g. ``[  12/20 s] users 6+2 | benign 41 req 3.4/s p50 180 ms p99 900 ms,
    0 errors | attacks 19: content refused 15/15 judged, floods stopped 1/1`` (the gate's two
    attack checks)."""
    total = "?" if p.total_s is None else f"{p.total_s:g}"
    head = f"{p.elapsed_s:4.0f}/{total} s" + (" done" if p.final else "")
    return (
        f"[{head}] users {p.benign_users}+{p.attack_users} | benign {p.benign_requests} req "
        f"{p.benign_rps:.1f}/s p50 {_ms(p.benign_p50_ms)} ms p99 {_ms(p.benign_p99_ms)} ms, "
        f"{p.benign_errors} errors | attacks {p.attack_requests}: content refused "
        f"{p.content_stopped}/{p.content_judged} judged, "
        f"floods stopped {p.floods_stopped}/{p.floods}"
    )


def write(path: str | Path, p: LoadProgress) -> None:
    """Replace ``path`` with ``p`` at once (a reader never sees half a file)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(asdict(p), sort_keys=True) + "\n")
    os.replace(tmp, target)


def read(path: str | Path) -> LoadProgress | None:
    """The last progress written to ``path``; None before the first."""
    try:
        return LoadProgress(**json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError):
        return None

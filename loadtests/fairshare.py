"""The fair share phase (issue 25 item 4): one tenant floods long streams, some never read,
while another sends ordinary chats; the ordinary tenant must keep its latency and every answer.

Plain Python (no locust): the locustfile's ``--scenario fair-share`` users send what this module
builds and record each answer in the run's timeline (:mod:`loadtests.timeline`, the series
below); the gate (:mod:`loadtests.slo`), the report (:mod:`loadtests.report`) and
``bench/fair_share.py`` read the same records through :func:`summarize`.

Two segments, the ``fair`` shape (:mod:`loadtests.shapes`):

- **solo**: the chat tenant alone (``--benign-key``), short non-streamed chats: its baseline;
- **flood**: the flood tenant (``--flood-key``) joins with long streams (large ``max_tokens``,
  ``n`` > 1 where the upstream honours it), of which some never read a byte of their answer
  and hold the connection, while the chat tenant goes on.

Records, per second of the timeline (``TENANT`` ``chat`` or ``flood``, ``SEGMENT`` ``solo`` or
``flood``), every request counted where it ended:

- ``fair TENANT SEGMENT``: ``STATUS CODE`` -> requests (``0 ERROR`` when none came);
- ``fair lat TENANT SEGMENT``: latency histogram (ms, locust's rounding) of the served ones: a
  chat's full answer, a flood stream's wait for its answer to begin (its head);
- ``fair tokens TENANT SEGMENT``: ``tokens`` -> tokens received (a chat's
  ``usage.completion_tokens``; the content pieces a read stream carried; an unread stream's are
  never read, so not counted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadtests.slo import Check, Report, percentile

__all__ = [
    "CHAT",
    "FLOOD",
    "FLOOD_SEGMENT",
    "PREFIX",
    "SEGMENTS",
    "SOLO",
    "TENANTS",
    "FairRecords",
    "FairThresholds",
    "chat_body",
    "completion_tokens",
    "flood_body",
    "flood_shape",
    "gate",
    "latency_series",
    "records",
    "render",
    "segment_of",
    "series_name",
    "status_label",
    "summarize",
]

CHAT = "chat"
FLOOD = "flood"
TENANTS = (CHAT, FLOOD)
SOLO = "solo"
FLOOD_SEGMENT = "flood"
SEGMENTS = (SOLO, FLOOD_SEGMENT)
PREFIX = "fair"
CHAT_PATH = "/v1/chat/completions"
CHAT_TOKENS = 16
# (max_tokens, n) of a flood stream by upstream kind: long, and several sequences where the
# upstream honours n (llama-cpp-python generates one). Text that does not decode makes
# llama-cpp-python's streams superlinear (docs/findings/llamacpp-undecodable-stream-
# superlinear.yaml): measure it with a model whose text decodes, as a real model's does (the
# upstream scripts' `start llamacpp --model-variant text`).
_FLOOD_SHAPES: dict[str, tuple[int, int]] = {
    "reference": (2048, 4),
    "vllm": (1024, 4),
    "llama_cpp": (1024, 1),
    "other": (1024, 1),
}


def flood_shape(kind: str) -> tuple[int, int]:
    """The default ``(max_tokens, n)`` of a flood stream in front of an upstream ``kind``."""
    return _FLOOD_SHAPES.get(kind, _FLOOD_SHAPES["other"])


def chat_body(model: str, max_tokens: int = CHAT_TOKENS) -> bytes:
    """The chat tenant's request: a short chat, not streamed."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello to the team."}],
        "max_tokens": max_tokens,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def flood_body(model: str, max_tokens: int, n: int) -> bytes:
    """The flood tenant's request: a long stream of ``n`` sequences."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a very long story about queues."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    if n > 1:
        body["n"] = n
    return json.dumps(body, separators=(",", ":")).encode()


def completion_tokens(body: bytes) -> int:
    """``usage.completion_tokens`` of a chat answer; 0 when it has none."""
    try:
        usage = json.loads(body).get("usage") or {}
        return int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0


def segment_of(flood_started: bool) -> str:
    return FLOOD_SEGMENT if flood_started else SOLO


def series_name(kind: str, tenant: str, segment: str) -> str:
    """A timeline series: ``kind`` '' (answers), ``lat`` or ``tokens``."""
    return " ".join(p for p in (PREFIX, kind, tenant, segment) if p)


def status_label(status: int, code: str | None, error: str | None = None) -> str:
    """``STATUS CODE`` of one answer (``0 ERROR`` when none came)."""
    if status == 0:
        return f"0 {(error or 'no response').split(':')[0].replace(' ', '_')}"
    return f"{status} {code or '-'}"


def served(label: str) -> bool:
    return label[:1] == "2"


@dataclass
class FairRecords:
    """The phase's records summed over the run (or part of it): per (tenant, segment) the
    answers by label, the served ones' latency histogram and the tokens received."""

    answers: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    latency_ms: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, series: str, counts: Mapping[str, int]) -> None:
        """Add one bucket's ``counts`` of ``series`` (ignored unless it is the phase's)."""
        parts = series.split(" ")
        if parts[0] != PREFIX:
            return
        if len(parts) == 3:
            row = self.answers.setdefault((parts[1], parts[2]), {})
            for label, n in counts.items():
                row[label] = row.get(label, 0) + int(n)
        elif len(parts) == 4 and parts[1] == "lat":
            hist = self.latency_ms.setdefault((parts[2], parts[3]), {})
            for ms, n in counts.items():
                hist[int(ms)] = hist.get(int(ms), 0) + int(n)
        elif len(parts) == 4 and parts[1] == "tokens":
            key = (parts[2], parts[3])
            self.tokens[key] = self.tokens.get(key, 0) + sum(int(n) for n in counts.values())

    def __bool__(self) -> bool:
        return bool(self.answers)

    def requests(self, tenant: str, segment: str) -> int:
        return sum(self.answers.get((tenant, segment), {}).values())

    def served(self, tenant: str, segment: str) -> int:
        row = self.answers.get((tenant, segment), {})
        return sum(n for label, n in row.items() if served(label))


def records(buckets: Mapping[str, Mapping[str, Mapping[str, int]]]) -> FairRecords:
    """The phase's records of every bucket, summed."""
    out = FairRecords()
    for bucket in buckets.values():
        for series, counts in bucket.items():
            if series.startswith(PREFIX + " "):
                out.add(series, counts)
    return out


def latency_series(bucket: Mapping[str, Mapping[str, int]], tenant: str) -> dict[int, int]:
    """One bucket's latency histogram of ``tenant`` (both segments)."""
    hist: dict[int, int] = {}
    for segment in SEGMENTS:
        for ms, n in (bucket.get(series_name("lat", tenant, segment)) or {}).items():
            hist[int(ms)] = hist.get(int(ms), 0) + int(n)
    return hist


def _latency(rec: FairRecords, tenant: str, segment: str) -> dict[str, Any]:
    hist = rec.latency_ms.get((tenant, segment), {})
    return {
        "requests": rec.requests(tenant, segment),
        "served": rec.served(tenant, segment),
        "p50_ms": percentile(hist, 0.5),
        "p99_ms": percentile(hist, 0.99),
        "tokens": rec.tokens.get((tenant, segment), 0),
        "answers": dict(sorted(rec.answers.get((tenant, segment), {}).items())),
    }


def summarize(rec: FairRecords, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The phase's figures (``numbers.fair_share`` of the report): per tenant and segment the
    requests, served, p50/p99 and tokens; the chat tenant's p99 ratio (flood over solo) and its
    requests not served (refused, failed or unanswered: every segment); each tenant's share of
    the requests served and the tokens received in the flood segment."""
    tenants = {t: {s: _latency(rec, t, s) for s in SEGMENTS} for t in TENANTS}
    solo, flood = tenants[CHAT][SOLO]["p99_ms"], tenants[CHAT][FLOOD_SEGMENT]["p99_ms"]
    ratio = flood / solo if solo and flood is not None else None
    unanswered = sum(tenants[CHAT][s]["requests"] - tenants[CHAT][s]["served"] for s in SEGMENTS)
    served_total = sum(tenants[t][FLOOD_SEGMENT]["served"] for t in TENANTS)
    tokens_total = sum(tenants[t][FLOOD_SEGMENT]["tokens"] for t in TENANTS)
    shares = {
        t: {
            "served": tenants[t][FLOOD_SEGMENT]["served"],
            "tokens": tenants[t][FLOOD_SEGMENT]["tokens"],
            "share_served": _share(tenants[t][FLOOD_SEGMENT]["served"], served_total),
            "share_tokens": _share(tenants[t][FLOOD_SEGMENT]["tokens"], tokens_total),
        }
        for t in TENANTS
    }
    return {
        "config": dict(config or {}),
        "tenants": tenants,
        "chat_p99_ratio": None if ratio is None else round(ratio, 3),
        "chat_unanswered": unanswered,
        "flood_segment_shares": shares,
    }


def _share(part: int, total: int) -> float | None:
    return round(part / total, 4) if total else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(summary: Mapping[str, Any]) -> str:
    """The summary as a Markdown table (as bench/README.md and loadtests/README.md show it)."""
    cfg = summary.get("config") or {}
    ratio = summary.get("chat_p99_ratio")
    lines = [
        f"fair share: solo {cfg.get('solo_s', '?')} s, then {cfg.get('streams', '?')} flood "
        f"streams ({cfg.get('unread', '?')} unread, held {cfg.get('hold_s', '?')} s; max_tokens "
        f"{cfg.get('flood_tokens', '?')}, n {cfg.get('flood_n', '?')}); chat p99 under flood / "
        f"solo: {'-' if ratio is None else f'{ratio:.2f}x'}; chat unanswered: "
        f"{summary.get('chat_unanswered')}",
        "",
        "| tenant | segment | requests | served | p50 ms | p99 ms | tokens | answers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tenant in TENANTS:
        for segment in SEGMENTS:
            row = summary["tenants"][tenant][segment]
            if tenant == FLOOD and segment == SOLO and not row["requests"]:
                continue
            answers = ", ".join(f"{k}: {v}" for k, v in row["answers"].items()) or "-"
            lines.append(
                f"| {tenant} | {segment} | {row['requests']} | {row['served']} | "
                f"{_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | {row['tokens']} | {answers} |"
            )
    lines += ["", "| flood segment | served | share | tokens | share |", "|---|---|---|---|---|"]
    for tenant in TENANTS:
        s = summary["flood_segment_shares"][tenant]
        lines.append(
            f"| {tenant} | {s['served']} | {_pct(s['share_served'])} | {s['tokens']} | "
            f"{_pct(s['share_tokens'])} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class FairThresholds:
    """The phase's SLOs: the chat tenant's p99 under flood at most ``max_p99_ratio`` times its
    solo p99, and at most ``max_unanswered`` of its requests not served."""

    max_p99_ratio: float = 2.0
    max_unanswered: int = 0


RATIO_CHECK = "ordinary tenant p99 under flood / solo"
UNANSWERED_CHECK = "ordinary tenant unanswered"


def gate(
    report: Report,
    rec: FairRecords,
    th: FairThresholds,
    config: Mapping[str, Any] | None = None,
) -> Report:
    """``report`` with the phase's checks and figures (``numbers.fair_share``) added. The
    ratio fails when either segment served no chat (nothing was shown); the flood's own
    answers are recorded in the figures, not judged (refusals are fine for it)."""
    summary = summarize(rec, config)
    summary["thresholds"] = {"max_p99_ratio": th.max_p99_ratio, "max_unanswered": th.max_unanswered}
    chat = summary["tenants"][CHAT]
    solo, flood = chat[SOLO]["p99_ms"], chat[FLOOD_SEGMENT]["p99_ms"]
    ratio = summary["chat_p99_ratio"]
    threshold = f"<= {th.max_p99_ratio:g}x"
    if ratio is None:
        missing = "solo" if not solo else "flood"
        ratio_check = Check(
            RATIO_CHECK, threshold, f"no chat served in the {missing} segment", "fail"
        )
    else:
        ratio_check = Check(
            RATIO_CHECK,
            threshold,
            f"{ratio:.2f}x ({_ms(flood)} ms / {_ms(solo)} ms)",
            "pass" if ratio <= th.max_p99_ratio else "fail",
        )
    sent = sum(chat[s]["requests"] for s in SEGMENTS)
    unanswered = summary["chat_unanswered"]
    not_served = {
        label: n for s in SEGMENTS for label, n in chat[s]["answers"].items() if not served(label)
    }
    detail = (
        "; " + ", ".join(f"{k}: {v}" for k, v in sorted(not_served.items())) if not_served else ""
    )
    unanswered_check = Check(
        UNANSWERED_CHECK,
        f"<= {th.max_unanswered}",
        f"{unanswered} of {sent}{detail}",
        "pass" if sent and unanswered <= th.max_unanswered else "fail",
    )
    numbers = {**report.numbers, "fair_share": summary}
    return Report([*report.checks, ratio_check, unanswered_check], numbers, report.thresholds)

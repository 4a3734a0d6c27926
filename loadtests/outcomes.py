"""What refused an attack request, and whether that is what the attack was meant to meet.

An attack's answer is classified by what refused it: a **content check** (any other refusal:
the guard judged the request itself, docs/ERRORS.md's check codes), a **budget** (a token or
compile budget the request can never or not now pay), a **rate limit**, a **concurrency
limit** (the key's or the server's), or nothing (**served**, **server error**, **no
answer**). The load run's attacks come in two kinds (:func:`intent`):

- content attacks (every payload but floods): each request is malformed or hostile on its own,
  so a content check is what must refuse it. One refused by a limit first (the attacking key
  out of tokens) was never judged by the checks: it is not counted as contained;
- floods (``flood``-tagged payloads, sent as bursts of valid requests): nothing is wrong with
  one request, so a limit is the right refusal and the first requests of a burst are served
  before it (:data:`SERVED_BEFORE_LIMIT`, expected). A burst is stopped when a limit refused
  at least one of its requests.

Records are counts keyed by :func:`key` (``class|intent|answer``), kept per second in the
timeline (:mod:`loadtests.timeline`) and summed for the gate (:mod:`loadtests.slo`) and the
report (:mod:`loadtests.report`): every attack figure is read from the same records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BUDGET",
    "BURST_STOPPED",
    "BURST_THROUGH",
    "CATEGORIES",
    "CONCURRENCY",
    "CONTENT",
    "CONTENT_ATTACK",
    "FLOOD",
    "LIMITS",
    "NO_ANSWER",
    "RATE",
    "REFUSALS",
    "SERVED",
    "SERVED_BEFORE_LIMIT",
    "SERVER_ERROR",
    "AttackCounts",
    "Record",
    "burst_stopped",
    "category",
    "intent",
    "key",
    "parse_key",
    "refused_by",
    "summarize",
]

Intent = Literal["content", "flood"]
CONTENT_ATTACK: Intent = "content"
FLOOD: Intent = "flood"

CONTENT = "content check"
BUDGET = "budget"
RATE = "rate limit"
CONCURRENCY = "concurrency limit"
SERVED = "served"
SERVED_BEFORE_LIMIT = "flood: served before the limit"
SERVER_ERROR = "server error"
NO_ANSWER = "no answer"
LIMITS = (BUDGET, RATE, CONCURRENCY)
# Page order: the refusals, then what got through.
REFUSALS = (CONTENT, BUDGET, RATE, CONCURRENCY)
CATEGORIES = (*REFUSALS, SERVED_BEFORE_LIMIT, SERVED, SERVER_ERROR, NO_ANSWER)

# The guard's (guard.admission) and the reference scheduler's (scheduler_ref) limit codes,
# docs/ERRORS.md. Every other refusal is the request's content being judged.
_BUDGET_CODES = frozenset(
    {
        "request_exceeds_token_budget",
        "guided_compile_budget_exhausted",
        "tenant_burst_exceeded",
        "tenant_tokens_exhausted",
    }
)
_RATE_CODES = frozenset(
    {"rate_limited_requests", "rate_limited_tokens", "rate_limiter_unavailable"}
)
_CONCURRENCY_CODES = frozenset(
    {
        "concurrency_limited",
        "server_busy",
        "too_many_connections",
        "server_connection_limit",
        "guided_compile_pool_busy",
        "queue_full",
        "queue_timeout",
        "waiting_queue_full",
    }
)


def refused_by(status: int, code: str | None) -> str:
    """The category of an answer: what refused it, or how it got through."""
    if status == 0:
        return NO_ANSWER
    if 200 <= status < 300:
        return SERVED
    if code in _BUDGET_CODES:
        return BUDGET
    if code in _RATE_CODES:
        return RATE
    if code in _CONCURRENCY_CODES:
        return CONCURRENCY
    if 400 <= status < 500:
        return CONTENT
    return SERVER_ERROR


def intent(flood: bool, expect_code: str | None) -> Intent:
    """What an attack is meant to be refused by: a limit for a flood (or a payload whose
    expected answer is a limit's code), a content check otherwise."""
    if flood or refused_by(429, expect_code) in LIMITS:
        return FLOOD
    return CONTENT_ATTACK


def key(class_: str, attack_intent: Intent, status: int, code: str | None, error: str = "") -> str:
    """A record's key: ``class|intent|status code`` (``status`` 0: ``no answer: <error>``)."""
    if status:
        answer = f"{status} {code}" if code else str(status)
    else:
        answer = f"no answer: {(error or 'unknown').split(':', 1)[0][:40]}"
    return f"{class_}|{attack_intent}|{answer}"


@dataclass(frozen=True)
class Record:
    """One record's key read back (:func:`parse_key`)."""

    class_: str
    intent: Intent
    status: int
    code: str  # the error code, or the failure's text when there was no answer

    @property
    def answer(self) -> str:
        if not self.status:
            return self.code
        return f"{self.status} {self.code}".strip()


def parse_key(text: str) -> Record:
    class_, attack_intent, answer = text.split("|", 2)
    head, _, rest = answer.partition(" ")
    status = int(head) if head.isdigit() else 0
    code = rest if status else answer
    return Record(class_, FLOOD if attack_intent == FLOOD else CONTENT_ATTACK, status, code)


def category(record: Record) -> str:
    """:func:`refused_by`, with a flood's served requests told apart (they are expected)."""
    got = refused_by(record.status, record.code if record.status else None)
    if got == SERVED and record.intent == FLOOD:
        return SERVED_BEFORE_LIMIT
    return got


@dataclass
class AttackCounts:
    """The records summed: requests by intent, class and category; flood bursts."""

    # intent -> THREATS class -> category -> requests
    table: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    by_answer: dict[str, int] = field(default_factory=dict)  # "429 rate_limited_tokens" -> n
    bursts: int = 0
    bursts_stopped: int = 0

    def of(self, attack_intent: str | None = None, *categories: str) -> int:
        """Requests of ``attack_intent`` (all when ``None``) in ``categories`` (all if none)."""
        total = 0
        for aim, classes in self.table.items():
            if attack_intent is not None and aim != attack_intent:
                continue
            for row in classes.values():
                total += sum(row.get(c, 0) for c in categories) if categories else sum(row.values())
        return total

    @property
    def requests(self) -> int:
        return self.of()

    @property
    def content_sent(self) -> int:
        return self.of(CONTENT_ATTACK)

    @property
    def content_stopped(self) -> int:
        return self.of(CONTENT_ATTACK, CONTENT)

    @property
    def content_limited(self) -> int:
        """Content attacks a limit refused before any check judged them."""
        return self.of(CONTENT_ATTACK, *LIMITS)

    @property
    def content_judged(self) -> int:
        return self.content_sent - self.content_limited

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "by_intent": {
                aim: {cls: dict(sorted(row.items())) for cls, row in sorted(classes.items())}
                for aim, classes in sorted(self.table.items())
            },
            "by_answer": dict(sorted(self.by_answer.items())),
            "content_sent": self.content_sent,
            "content_stopped": self.content_stopped,
            "content_limited": self.content_limited,
            "content_judged": self.content_judged,
            "flood_bursts": self.bursts,
            "flood_bursts_stopped": self.bursts_stopped,
        }


BURST_STOPPED = "stopped"
BURST_THROUGH = "not stopped"


def summarize(records: Mapping[str, int], bursts: Mapping[str, int] | None = None) -> AttackCounts:
    """One pass over the records (``key -> count``) and the flood bursts (``stopped`` /
    ``not stopped`` -> count)."""
    out = AttackCounts()
    for text, n in records.items():
        record = parse_key(text)
        got = category(record)
        row = out.table.setdefault(record.intent, {}).setdefault(record.class_, {})
        row[got] = row.get(got, 0) + n
        out.by_answer[record.answer] = out.by_answer.get(record.answer, 0) + n
    out.bursts = sum((bursts or {}).values())
    out.bursts_stopped = (bursts or {}).get(BURST_STOPPED, 0)
    return out


def burst_stopped(answers: list[tuple[int, str | None]]) -> bool:
    """Whether a limit refused at least one request of a flood burst."""
    return any(refused_by(status, code) in LIMITS for status, code in answers)

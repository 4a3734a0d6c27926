"""Judging one request against a live server: black-box, or differentially against a guard.

Black-box (:meth:`LiveOracle.run` without a guard): the request goes to the target; the
verdict, in precedence order, is ``crash`` (no answer and the server is gone: its health
endpoint does not answer or a watched process died; or the connection dropped without an
answer; or a gateway's 502/503 while a watched process behind it died), ``timeout`` (no
answer within the timeout, or a gateway's 504: a hang), ``server_error`` (a 5xx, unless
its message matches one of the patterns the caller calls this server's way of refusing invalid
input), ``budget`` (latency or resident-memory growth over the budget), ``rejected`` (a 4xx)
and ``ok``.

Differential (with a guard): the request first goes to the guard's dry run
(``POST /guard/v1/check?path=...``), which answers the verdict and the costs the guard
accounts without forwarding. What the guard admits is sent to the upstream directly, as the
guard would forward it (its mutations applied, e.g. an injected ``max_tokens``), and judged as
above; on top of that an answer whose ``usage.prompt_tokens`` is above the guard's
``costs.prompt_tokens`` (or ``usage.completion_tokens`` above ``costs.output_tokens_reserved``)
is an ``undercount``. A benign payload the guard refuses is sent to the upstream too: served
cheaply (2xx within the budgets, and for a token refusal with ``usage.prompt_tokens`` within
the limit the refusal names), it is a ``false_positive``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fuzz.live._evidence import ServerLog, kernel_lines, parse_log, usage_of
from fuzz.live._http import HttpClient, Reply
from fuzz.live._monitor import Health, RssMonitor
from fuzz.live._request import LiveRequest
from fuzz.oracle import Outcome
from fuzz.targets import Cost

__all__ = [
    "CHECK_PATH",
    "LATENCY_PER_TOKEN_S",
    "LiveBudgets",
    "LiveOracle",
    "Measured",
    "apply_mutations",
    "error_signature",
    "extract_usage",
    "output_tokens",
]

CHECK_PATH = "/guard/v1/check"
# Verdicts whose evidence (log, signal, memory and CPU) is collected.
_EVIDENCED = frozenset({"crash", "timeout", "server_error", "budget"})
_LOG_SETTLE_S = 0.5
# Seconds of latency allowed per output token: 50 tokens/s, slower than any server decodes one
# request (the e2e llama-cpp-python model: 1.5-9 ms a token, with the other core busy).
LATENCY_PER_TOKEN_S = 0.02


@dataclass(frozen=True)
class LiveBudgets:
    """``timeout_s``: no answer by then is a hang; ``latency_s``/``rss_bytes``: the cost of one
    admitted request above which it is a finding, ``latency_s`` plus ``latency_per_token_s`` for
    each output token the answer's ``usage`` reports (a long answer asked for is work, not an
    amplification); ``ignore_5xx``: patterns of 5xx messages that are this server's refusals of
    invalid input (llama-cpp-python answers a validation error with 500), counted as
    rejections."""

    timeout_s: float = 60.0
    latency_s: float = 20.0
    rss_bytes: int = 512 << 20
    ignore_5xx: tuple[re.Pattern[str], ...] = ()
    latency_per_token_s: float = LATENCY_PER_TOKEN_S

    def latency_budget(self, reply: Reply) -> tuple[float, str]:
        """The latency allowed for this answer, and how it was reached."""
        tokens = output_tokens(reply) if self.latency_per_token_s else 0
        if not tokens:
            return self.latency_s, f"{self.latency_s:g} s"
        budget = self.latency_s + self.latency_per_token_s * tokens
        how = f"{self.latency_s:g} s + {self.latency_per_token_s:g} s x {tokens} output tokens"
        return budget, f"{budget:.2f} s ({how})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.latency_s,
            "wall_s_per_output_token": self.latency_per_token_s,
            "mem_bytes": self.rss_bytes,
            "timeout_s": self.timeout_s,
            "ignore_5xx": [p.pattern for p in self.ignore_5xx],
        }


@dataclass
class Measured:
    """One request judged: its ``outcome``, the upstream's reply (None when not sent), the
    guard's dry-run verdict (differential), and ``excess``: the upstream's prompt tokens minus
    the guard's bound (0 when not measured)."""

    outcome: Outcome
    reply: Reply | None = None
    guard: dict[str, Any] | None = None
    excess: int = 0
    sent_body: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """How interesting the request is as a parent: its cost per KiB sent (a long prompt
        costs in proportion, what grows faster than its size is the interesting part; and a
        queue of merely slow parents would slow the campaign down), plus its excess over the
        guard's bound; 0 for a request the guard refused (the upstream never saw it)."""
        if self.reply is None:
            return 0.0
        size_kib = len(self.sent_body or b"") / 1024
        return self.outcome.cost.scalar() / (1.0 + size_kib) + 10.0 * max(0, self.excess)


def error_signature(message: str) -> str:
    """A 5xx message without its particulars (numbers, quoted values, addresses): what makes
    two 5xx the same bug."""
    text = message.strip()
    first = text.splitlines()[0] if text else ""
    first = re.sub(r"0x[0-9a-fA-F]+", "#", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", first)
    first = re.sub(r"\d+", "#", first)
    return first[:80].strip() or "-"


def extract_usage(reply: Reply) -> dict[str, int] | None:
    """``usage`` of a JSON answer, or of the last SSE event that has one."""
    doc = reply.json()
    return _usage(doc) if isinstance(doc, dict) else _stream_usage(reply.body)


def _stream_usage(body: bytes) -> dict[str, int] | None:
    usage: dict[str, int] | None = None
    for line in body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line:
            continue
        try:
            event = json.loads(line[5:])
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict):
            usage = _usage(event) or usage
    return usage


def output_tokens(reply: Reply) -> int:
    """The output tokens of an answer: its ``usage.completion_tokens``, else, for a stream
    without usage (llama-cpp-python sends none), its events (each carries a token or more)."""
    doc = reply.json()  # parsed once: the oracle asks this of every admitted answer
    if doc is not None:
        usage = _usage(doc) if isinstance(doc, dict) else None
        return (usage or {}).get("completion_tokens", 0)
    usage = _stream_usage(reply.body)
    if usage is not None and "completion_tokens" in usage:
        return usage["completion_tokens"]
    return sum(
        1
        for line in reply.body.split(b"\n")
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]")
    )


def _usage(doc: dict[str, Any]) -> dict[str, int] | None:
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return None
    out: dict[str, int] = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out or None


def apply_mutations(body: Any, mutations: Sequence[Any]) -> Any:
    """The guard's mutations (``[{"path": [...], "value": ...}]``) applied to ``body``."""
    for m in mutations:
        if not isinstance(m, dict) or not isinstance(m.get("path"), list) or not m["path"]:
            continue
        *parents, last = m["path"]
        node = body
        try:
            for key in parents:
                node = node[key]
            node[last] = m.get("value")
        except (KeyError, IndexError, TypeError):
            continue
    return body


class LiveOracle:
    """Sends requests to ``upstream`` (and asks ``guard`` first, when given) and judges them.

    ``alive``: whether the server still runs (its watched processes and its health endpoint).
    ``server_log``: the server's log, when the campaign can read it: a crash, a hang, a 5xx or
    a crossed budget then carries what the server wrote meanwhile (:mod:`fuzz.live._evidence`)
    in ``Measured.extra["evidence"]``, with the watched processes' memory and CPU before and
    after.
    """

    def __init__(
        self,
        upstream: HttpClient,
        budgets: LiveBudgets,
        *,
        monitor: RssMonitor | None = None,
        health: Health | None = None,
        guard: HttpClient | None = None,
        guard_health: Health | None = None,
        server_log: ServerLog | None = None,
    ) -> None:
        self.server_log = server_log
        self.upstream = upstream
        self.budgets = budgets
        self.monitor = monitor or RssMonitor()
        self.health = health
        self.guard = guard
        self.guard_health = guard_health

    def alive(self) -> bool:
        if not self.monitor.alive():
            return False
        return self.health is None or self.health.ok()

    def run(self, req: LiveRequest) -> Measured:
        if self.guard is None:
            return self.send(req)
        return self._differential(req)

    # --------------------------------------------------------------------------- black box

    def send(self, req: LiveRequest, body: bytes | None = None) -> Measured:
        """Send to the upstream and judge the answer (no guard)."""
        data = req.to_bytes() if body is None else body
        log_mark = self.server_log.mark() if self.server_log is not None else 0
        before = usage_of(self.monitor.pids)
        mark = self.monitor.mark()
        reply = self.upstream.post_json(req.path, data)
        growth = self.monitor.growth_since(mark)
        usage = extract_usage(reply) if reply.status is not None and reply.status < 300 else None
        cost = Cost(
            time_s=reply.latency_s,
            peak_mem_bytes=growth,
            steps=(usage or {}).get("prompt_tokens", 0),
            output_tokens=(usage or {}).get("completion_tokens", 0),
        )
        outcome = judge(reply, cost, self.budgets, self.alive)
        extra: dict[str, Any] = {"usage": usage}
        if outcome.verdict in _EVIDENCED:
            extra["evidence"] = self._evidence(outcome, log_mark, before)
        return Measured(outcome, reply, sent_body=data, extra=extra)

    def _evidence(
        self, outcome: Outcome, log_mark: int, before: dict[str, float] | None
    ) -> dict[str, Any]:
        """The server's own account of a finding (see :class:`LiveOracle`)."""
        pids = list(self.monitor.pids)
        out: dict[str, Any] = {"server_before": before, "server_after": usage_of(pids)}
        if self.server_log is not None:
            if outcome.verdict == "crash":
                # A dying process's last writes (faulthandler's stack) land as it exits.
                time.sleep(_LOG_SETTLE_S)
            ev = parse_log(self.server_log.since(log_mark))
            if ev.signature is None and outcome.verdict in ("crash", "server_error"):
                # A server may log the traceback after it answered (vLLM's API server does):
                # read once more before calling the cause unknown.
                time.sleep(_LOG_SETTLE_S)
                ev = parse_log(self.server_log.since(log_mark))
            out.update(ev.to_dict())
            out["log"] = str(self.server_log.path)
        if outcome.verdict == "crash":
            out["kernel"] = kernel_lines(pids)
        return out

    # ------------------------------------------------------------------------ differential

    def _differential(self, req: LiveRequest) -> Measured:
        assert self.guard is not None
        body = req.to_bytes()
        if isinstance(req.body, dict) and req.body.get("stream") is True:
            # The usage of a stream comes in its last event only when asked for.
            opts = req.body.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage") is True):
                doc = json.loads(body)
                doc["stream_options"] = {
                    **(opts if isinstance(opts, dict) else {}),
                    "include_usage": True,
                }
                req = req.with_body(doc)
                body = req.to_bytes()
        query = urllib.parse.urlencode({"path": req.path})
        g = self.guard.post_json(f"{CHECK_PATH}?{query}", body)
        verdict = g.json() if g.status == 200 else None
        if not isinstance(verdict, dict) or "allowed" not in verdict:
            return Measured(self._guard_failure(g), None, None)
        costs = verdict.get("costs") if isinstance(verdict.get("costs"), dict) else {}
        assert isinstance(costs, dict)
        if not verdict.get("allowed"):
            code = str(verdict.get("code") or f"http_{verdict.get('status')}")
            if not req.benign:
                cost = Cost(time_s=g.latency_s)
                return Measured(Outcome("rejected", cost, error_code=code), None, verdict)
            served = self.send(req)
            out = served.outcome
            reply = served.reply
            if out.verdict == "ok" and reply is not None and _within_limit(verdict, served):
                msg = f"the guard refuses it ({code}); the upstream served it ({reply.status})"
                where = f"{code}:{req.seed_id}"
                fp = Outcome("false_positive", out.cost, code, msg, where, code)
                return Measured(fp, reply, verdict, sent_body=served.sent_body)
            rejected = Outcome("rejected", out.cost, error_code=code)
            return Measured(rejected, reply, verdict, sent_body=served.sent_body)
        forward = body
        mutations = verdict.get("mutations")
        if isinstance(mutations, list) and mutations and isinstance(req.body, dict):
            doc = apply_mutations(json.loads(body), mutations)
            forward = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode(
                "utf-8", "surrogatepass"
            )
        served = self.send(req, forward)
        served.guard = verdict
        if served.outcome.verdict != "ok":
            return served
        usage = served.extra.get("usage") or {}
        bound = _int(costs.get("prompt_tokens"))
        prompt = _int(usage.get("prompt_tokens"))
        reserved = _int(costs.get("output_tokens_reserved"))
        completion = _int(usage.get("completion_tokens"))
        extra = {
            "guard_prompt_tokens": str(bound),
            "upstream_prompt_tokens": str(prompt),
            "guard_output_tokens_reserved": str(reserved),
            "upstream_completion_tokens": str(completion),
        }
        served.extra.update(extra)
        cost = served.outcome.cost
        if bound is not None and prompt is not None:
            served.excess = prompt - bound
            if prompt > bound:
                msg = f"usage.prompt_tokens {prompt} > the guard's bound {bound}"
                served.outcome = Outcome(
                    "undercount", cost, "PromptTokens", msg, "prompt_tokens", None, extra
                )
                return served
        if reserved is not None and completion is not None and completion > reserved:
            msg = f"usage.completion_tokens {completion} > the guard's reservation {reserved}"
            served.outcome = Outcome(
                "undercount", cost, "CompletionTokens", msg, "completion_tokens", None, extra
            )
        return served

    def _guard_failure(self, g: Reply) -> Outcome:
        """The dry run did not give a verdict: the guard is down, hangs or fails."""
        cost = Cost(time_s=g.latency_s)
        if g.status is None:
            if g.error == "timeout":
                return Outcome("timeout", cost, "Timeout", f"guard: {g.detail}", "timeout")
            up = self.guard_health is not None and self.guard_health.ok()
            kind = "ConnectionDropped" if up else "GuardDied"
            return Outcome("crash", cost, kind, f"guard: {g.error_message()}", f"guard:{kind}")
        if g.status >= 500:
            sig = f"guard:{g.status}:{g.error_code() or error_signature(g.error_message())}"
            return Outcome("server_error", cost, f"HTTP{g.status}", g.error_message(), sig)
        return Outcome("rejected", cost, f"HTTP{g.status}", g.error_message(), None, g.error_code())


# The guard's message names the limit a token refusal applies ("... than the limit of 2048").
_LIMIT = re.compile(r"limit (?:of |is )?(\d+)")
_TOKEN_CODES = frozenset({"prompt_tokens_exceeded", "context_length_exceeded"})


def _within_limit(verdict: dict[str, Any], served: Measured) -> bool:
    """Whether the upstream's own count is within the limit a token refusal names: a request
    the upstream counts over the guard's cap is refused rightly, however cheaply served. (The
    dry run gives no costs with a refusal; the limit is read from its message.)"""
    if verdict.get("code") not in _TOKEN_CODES:
        return True
    m = _LIMIT.search(str(verdict.get("message") or ""))
    usage = served.extra.get("usage") or {}
    prompt = _int(usage.get("prompt_tokens"))
    if m is None or prompt is None:
        return True
    return prompt <= int(m.group(1))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge(reply: Reply, cost: Cost, budgets: LiveBudgets, alive: Callable[[], bool]) -> Outcome:
    """The black-box verdict of one exchange (see the module docstring)."""
    if reply.status is None:
        if reply.error == "timeout":
            msg = f"no answer within {budgets.timeout_s:g} s"
            return Outcome("timeout", cost, "Timeout", msg, "timeout")
        if not alive():
            return Outcome("crash", cost, "ServerDied", reply.error_message(), "server:died")
        msg = f"the connection ended without an answer ({reply.error_message()})"
        return Outcome("crash", cost, "ConnectionDropped", msg, "connection:dropped")
    status = reply.status
    if status in (502, 503) and not alive():
        # A gateway (the guard) answering for a server behind it that died on this request.
        msg = f"{status} from the gateway and the server behind it is gone: {reply.error_message()}"
        return Outcome("crash", cost, "ServerDied", msg[:2000], "server:died")
    if status == 504:
        msg = f"504 from the gateway: the server behind it did not answer ({reply.error_message()})"
        return Outcome("timeout", cost, "Timeout", msg[:2000], "timeout")
    if status >= 500:
        message = reply.error_message()
        if any(p.search(message) for p in budgets.ignore_5xx):
            return Outcome("rejected", cost, f"HTTP{status}", message[:500], None, "ignored_5xx")
        sig = reply.error_code() if status in (502, 503, 504) else None
        where = f"{status}:{sig or error_signature(message)}"
        return Outcome("server_error", cost, f"HTTP{status}", message[:2000], where)
    budget, how = budgets.latency_budget(reply)
    if cost.time_s > budget:
        msg = f"answered in {cost.time_s:.2f} s; the budget is {how}"
        return Outcome("budget", cost, None, msg, "budget:wall_s")
    if cost.peak_mem_bytes > budgets.rss_bytes:
        mib = cost.peak_mem_bytes / (1 << 20)
        msg = f"resident memory grew {mib:.0f} MiB; the budget is {budgets.rss_bytes >> 20} MiB"
        return Outcome("budget", cost, None, msg, "budget:mem_bytes")
    if status >= 400:
        message = reply.error_message()
        return Outcome("rejected", cost, f"HTTP{status}", message[:500], None, reply.error_code())
    return Outcome("ok", cost)

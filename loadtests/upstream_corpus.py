"""The whole ``payloads/`` corpus against a real upstream (vLLM, llama-cpp-python), sent straight
to it or through the guard, one payload at a time, with what each did to the upstream.

Used by ``tests/e2e/test_corpus_e2e.py`` (through the guard: no 5xx, the upstream alive, its
RSS bounded, benign payloads served) and ``bench/corpus_upstreams.py`` (the table of harmed /
contained per attack class, unguarded and guarded).

Each payload is sent as its file frames it (:func:`loadtests.httpclient.send_raw`: headers,
chunking, declared lengths, slow pieces), its ``model`` rewritten to the served model's name.
Around it the upstream's process tree is measured from ``/proc``: its peak RSS is the sum of
``VmHWM`` over the tree (reset before each payload through ``clear_refs``, so it is the peak
during that payload; an upper bound of the tree's peak, since each process peaks on its own),
and after it the upstream must answer ``GET /v1/models`` and its process must live.

A payload *harms* the upstream when (any of): the answer is a 5xx that is not the server's own
way of refusing input (llama-cpp-python answers pydantic validation errors with 500); a
process of the upstream's tree died (``crash``: vLLM's engine core and worker count, its API
server outlives them); it stopped answering (``hang``: no answer in the timeout, or no health
within ``recover_s`` after: vLLM's ``/health``, else ``/v1/models``); its peak RSS during the
payload went over ``rss_budget_mb`` above its RSS before it, or this payload took it past
``rss_budget_mb`` above its RSS after start (growth that stays is counted once, on the payload
that crossed); or the answer took over ``latency_budget_s`` (not for payloads whose own
transport is slow: the slow-loris and stalled bodies). A dead or hung upstream is restarted
(by the caller's :class:`UpstreamHandle`) before the next payload.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loadtests.httpclient import send_raw
from loadtests.replay import with_model
from payloads.loader import CLASSES, Payload

__all__ = [
    "LLAMACPP_REFUSAL",
    "ClassSummary",
    "CorpusBudgets",
    "PayloadOutcome",
    "ScriptUpstream",
    "UpstreamHandle",
    "corpus_routes",
    "guard_policy",
    "healthy",
    "prepare",
    "run_corpus",
    "run_payload",
    "summarize",
    "tree_memory",
]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "upstreams" / "upstreams.py"
# llama-cpp-python 0.3.36 answers a body its pydantic models refuse with 500 "N validation
# error(s): ...", and embeddings from a model not loaded for them with a 500 that says so: its
# refusals of input it does not take, not faults (fuzz.live's campaigns agree).
LLAMACPP_REFUSAL = re.compile(rb"\d+ validation errors?\b|must be created with embedding=True")
_MB = 1 << 20


@dataclass(frozen=True)
class CorpusBudgets:
    """What the upstream may spend on one payload before it counts as harmed."""

    latency_budget_s: float = 10.0
    timeout_s: float = 60.0
    rss_budget_mb: float = 512.0
    recover_s: float = 30.0
    stalled_timeout_s: float = 20.0


def corpus_routes(payloads: Iterable[Payload]) -> tuple[str, ...]:
    """The upstream routes the payloads need proxied (vLLM's pooling and scoring routes)."""
    return tuple(sorted({route for p in payloads for route in p.routes}))


def guard_policy(tmp: Path, tokenizer: Path, routes: Sequence[str] = ()) -> Path:
    """The default policy with the model's tokenizer named (exact counts), the token caps set
    for this server (prompts up to its 4096-token context less the output cap; outputs clamped
    to 512 tokens, which the CPU servers generate within the latency budget) and no rate limits:
    the corpus is sent one payload after another by one client, and what is measured is what
    each payload does to the upstream, not the rate limiter; ``routes`` proxied besides the
    defaults (:func:`corpus_routes`). bench/corpus_upstreams.py and
    tests/e2e/test_corpus_e2e.py both use it."""
    policy = tmp / "policy.yaml"
    policy.write_text(
        f"routes: [{', '.join(routes)}]\n"
        f"limits:\n  tokens:\n    tokenizer: {tokenizer}\n"
        "    max_prompt_tokens: 3584\n    max_output_tokens: 512\n    over_max_output: clamp\n"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
    )
    return policy


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (through ``/proc/PID/task/TID/children``)."""
    seen: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return seen


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid``'s process tree, summed, in bytes."""
    pids = process_tree(pid)
    rss = sum(_status_kb(p, "VmRSS") for p in pids)
    hwm = sum(_status_kb(p, "VmHWM") for p in pids)
    return rss * 1024, hwm * 1024


def reset_peaks(pid: int) -> None:
    """Reset ``VmHWM`` to the current RSS in the whole tree (``echo 5 > clear_refs``)."""
    for p in process_tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/clear_refs", "w") as f:
            f.write("5")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _get_status(base_url: str, path: str, timeout_s: float) -> int:
    host, _, port = base_url.removeprefix("http://").rstrip("/").partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def healthy(base_url: str, timeout_s: float = 5.0) -> bool:
    """The server can serve: ``GET /health`` is 200 where it exists (vLLM's says whether its
    engine is alive; its API server keeps answering ``/v1/models`` for a while after the
    engine died), else ``GET /v1/models`` is 200 (llama-cpp-python has no ``/health``)."""
    status = _get_status(base_url, "/health", timeout_s)
    if status == 404:
        status = _get_status(base_url, "/v1/models", timeout_s)
    return status == 200


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class UpstreamHandle(Protocol):
    """The upstream being measured: its base URL and pid (they may change on a restart)."""

    name: str
    base_url: str

    @property
    def pid(self) -> int: ...

    def restart(self) -> None: ...


class ScriptUpstream:
    """An upstream started (and restarted) by ``scripts/upstreams/upstreams.py`` on a fixed
    port under its memory cap (``--mem-limit-mb``; the script's default when None), with the
    server's own arguments ``extra`` (``--chat-template FILE``, say)."""

    def __init__(
        self,
        name: str,
        port: int,
        *,
        mem_limit_mb: int | None = None,
        ready_timeout_s: float = 360.0,
        python: str = sys.executable,
        extra: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.extra = tuple(extra)  # the server's own arguments (after `--`)
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.mem_limit_mb = mem_limit_mb
        self.ready_timeout_s = ready_timeout_s
        self.python = python
        self.record: dict[str, Any] = {}
        self.restarts = 0

    @property
    def pid(self) -> int:
        return int(self.record.get("pid", 0))

    @property
    def model(self) -> str:
        return str(self.record.get("model", "tiny-llama"))

    @property
    def tokenizer_json(self) -> Path:
        """The model's ``tokenizer.json`` (next to the HF model, or to the GGUF file)."""
        done = self._script("path", self.name, "--model", timeout=60)
        model = Path(done.stdout.strip())
        return (model if model.is_dir() else model.parent) / "tokenizer.json"

    def _script(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        args = ["start", self.name, "--port", str(self.port), "--host", "127.0.0.1",
                "--background", "--json", "--ready-timeout", str(int(self.ready_timeout_s))]  # fmt: skip
        if self.mem_limit_mb is not None:
            args += ["--mem-limit-mb", str(self.mem_limit_mb)]
        if self.extra:
            args += ["--", *self.extra]
        done = self._script(*args, timeout=self.ready_timeout_s + 60)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} did not start: {done.stderr[-4000:]}")
        self.record = json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop it (SIGTERM, SIGKILL after ``grace_s``) and wait until its tree is gone and
        its port can be listened on again."""
        pids = process_tree(self.pid) if self.pid else []
        self._script("stop", self.name, "--port", str(self.port), "--timeout", str(grace_s),
                     timeout=grace_s + 120)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            any(pid_alive(p) for p in pids) or not _port_free(self.port)
        ):
            time.sleep(0.2)  # waiting for the killed server to release its port

    def restart(self) -> None:
        """A dead or hung server: killed after 5 s of SIGTERM (a hung one never ends its
        request), then started again on the same port."""
        self.stop(grace_s=5.0)
        self.restarts += 1
        self.start()

    def __enter__(self) -> ScriptUpstream:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class PayloadOutcome:
    """One payload sent once. ``status`` 0: no answer (``error`` says why). ``harm``: why it
    counts as harming the upstream (empty when contained); ``peak_rss_mb``: the upstream tree's
    peak during the payload."""

    id: str
    class_: str
    kind: str
    endpoint: str
    expect_status: int
    expect_code: str | None
    status: int
    code: str | None
    error: str | None
    elapsed_s: float
    peak_rss_mb: float
    rss_after_mb: float
    alive_after: bool
    harm: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def harmed(self) -> bool:
        return bool(self.harm)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slow_transport(payload: Payload) -> bool:
    t = payload.transport
    return t is not None and (bool(t.chunk_delay_s) or isinstance(t.content_length, int))


def prepare(payload: Payload, model: str) -> tuple[list[tuple[str, str]], bytes]:
    """The payload's headers and body with the corpus's model name replaced by ``model``
    (bytes for bytes, so malformed and deep bodies stay exactly as they are otherwise)."""
    body = with_model(payload.body_bytes(), model)
    return payload.header_items(), body


def _code(body: bytes) -> tuple[str | None, str]:
    try:
        data = json.loads(body)
    except ValueError:
        return None, body[:300].decode("utf-8", "replace")
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), str) else err.get("type")
        return (str(code) if code is not None else None), str(err.get("message", ""))[:300]
    if isinstance(data, dict) and "detail" in data:
        return None, str(data["detail"])[:300]
    return None, ""


def _tree_alive(tree: Sequence[int]) -> bool:
    return all(pid_alive(p) for p in tree)


def _recovered(upstream: UpstreamHandle, tree: Sequence[int], recover_s: float) -> bool:
    """Every process of the tree alive and the upstream healthy within ``recover_s``."""
    if not _tree_alive(tree):
        return False
    deadline = time.monotonic() + recover_s
    while not (ok := healthy(upstream.base_url)) and time.monotonic() < deadline:
        if not _tree_alive(tree):
            return False
        time.sleep(0.5)  # waiting for a busy upstream to answer its health check again
    return ok and _tree_alive(tree)


def run_payload(
    payload: Payload,
    target_url: str,
    upstream: UpstreamHandle,
    *,
    model: str,
    budgets: CorpusBudgets,
    baseline_rss_mb: float,
    refusal_5xx: re.Pattern[bytes] | None = None,
    tree: Sequence[int] = (),
) -> PayloadOutcome:
    """Send ``payload`` once to ``target_url`` (the upstream itself or a guard in front of it)
    and judge what it did to ``upstream``; restarts ``upstream`` when it died or hung.

    ``tree``: the upstream's processes when it was started (vLLM: API server, engine core,
    worker); any of them gone is a crash. RSS: ``rss`` when the payload's own peak is over
    ``rss_budget_mb`` above the tree's RSS before it, or when it is the payload that took the
    tree past ``baseline_rss_mb`` + ``rss_budget_mb`` (growth that stays, counted once)."""
    headers, body = prepare(payload, model)
    slow = _slow_transport(payload)
    timeout = budgets.stalled_timeout_s if slow else budgets.timeout_s
    pid = upstream.pid
    tree = tuple(tree) or tuple(process_tree(pid))
    reset_peaks(pid)
    before_mb = tree_memory(pid)[0] / _MB
    resp = send_raw(
        target_url,
        payload.method,
        payload.endpoint,
        headers,
        body,
        payload.transport,
        timeout_s=timeout,
        hold_s=timeout,
    )
    _, hwm = tree_memory(pid)
    code, message = _code(resp.body) if resp.status >= 400 else (None, "")
    harm: list[str] = []
    if resp.status >= 500 and not (refusal_5xx is not None and refusal_5xx.search(resp.body)):
        harm.append(f"{resp.status}")
    if resp.status == 0 and resp.error == "timeout" and not slow:
        harm.append("hang")
    if not slow and resp.elapsed_s > budgets.latency_budget_s:
        harm.append("latency")

    alive = _recovered(upstream, tree, budgets.recover_s)
    if not _tree_alive(tree):
        harm.append("crash")
    elif not alive and "hang" not in harm:
        harm.append("hang")
    peak_mb = hwm / _MB
    bound = baseline_rss_mb + budgets.rss_budget_mb
    if peak_mb - before_mb > budgets.rss_budget_mb or (before_mb <= bound < peak_mb):
        harm.append("rss")
    rss_after, _ = tree_memory(pid) if alive else (0, 0)
    outcome = PayloadOutcome(
        id=payload.id,
        class_=payload.class_,
        kind=payload.kind,
        endpoint=payload.endpoint,
        expect_status=payload.expect.status,
        expect_code=payload.expect.code,
        status=resp.status,
        code=code,
        error=resp.error,
        elapsed_s=round(resp.elapsed_s, 3),
        peak_rss_mb=round(peak_mb, 1),
        rss_after_mb=round(rss_after / _MB, 1),
        alive_after=alive,
        harm=harm,
        message=message or (resp.error or ""),
    )
    if not alive:
        upstream.restart()
    return outcome


def run_corpus(
    payloads: Iterable[Payload],
    target_url: str,
    upstream: UpstreamHandle,
    *,
    model: str,
    budgets: CorpusBudgets = CorpusBudgets(),
    refusal_5xx: re.Pattern[bytes] | None = None,
    on_outcome: Callable[[PayloadOutcome], None] | None = None,
) -> list[PayloadOutcome]:
    """:func:`run_payload` for each payload in turn; the RSS budget is over the upstream's RSS
    before the first payload, and its process tree is the one it had then (both taken again
    after each restart)."""
    out: list[PayloadOutcome] = []
    baseline = tree_memory(upstream.pid)[0] / _MB
    tree = process_tree(upstream.pid)
    for payload in payloads:
        pid = upstream.pid
        o = run_payload(
            payload,
            target_url,
            upstream,
            model=model,
            budgets=budgets,
            baseline_rss_mb=baseline,
            refusal_5xx=refusal_5xx,
            tree=tree,
        )
        if upstream.pid != pid:
            baseline = tree_memory(upstream.pid)[0] / _MB
            tree = process_tree(upstream.pid)
        out.append(o)
        if on_outcome is not None:
            on_outcome(o)
    return out


@dataclass
class ClassSummary:
    """One class's payloads against one configuration."""

    class_: str
    payloads: int = 0
    harmed: int = 0
    harms: Counter[str] = field(default_factory=Counter)
    harmed_ids: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    peak_rss_mb: float = 0.0
    worst_latency_s: float = 0.0

    @property
    def verdict(self) -> str:
        return "harmed" if self.harmed else "contained"

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.class_,
            "payloads": self.payloads,
            "harmed": self.harmed,
            "verdict": self.verdict,
            "harms": dict(self.harms),
            "harmed_ids": self.harmed_ids,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "peak_rss_mb": self.peak_rss_mb,
            "worst_latency_s": self.worst_latency_s,
        }


def summarize(outcomes: Sequence[PayloadOutcome]) -> list[ClassSummary]:
    """Per class (THREATS.md order, then benign): payloads, harmed, peak RSS, worst latency."""
    by: dict[str, ClassSummary] = {c: ClassSummary(c) for c in (*CLASSES, "benign")}
    for o in outcomes:
        s = by.setdefault(o.class_, ClassSummary(o.class_))
        s.payloads += 1
        s.statuses[o.status] += 1
        s.peak_rss_mb = max(s.peak_rss_mb, o.peak_rss_mb)
        s.worst_latency_s = max(s.worst_latency_s, o.elapsed_s)
        if o.harmed:
            s.harmed += 1
            s.harms.update(o.harm)
            s.harmed_ids.append(o.id)
    return [s for s in by.values() if s.payloads]

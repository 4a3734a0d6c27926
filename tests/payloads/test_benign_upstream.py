"""Ordinary traffic, judged by the real decision path (issue 19, item 4).

The guard with its default policy (``default_policy()``, nothing set) is served by uvicorn in
front of a fake vLLM whose ``/v1/models`` reports ``max_model_len: 32768`` and ``owned_by: vllm``,
so the guard's window is the upstream's and its kind is ``vllm``, as in a real deployment. Every
benign payload (the curated look-alikes in payloads/benign/ and the requests copied from public
sources in payloads/public/) and every request of the Berkeley Function Calling Leaderboard
(:mod:`tests.payloads._bfcl`) is sent as its file frames it, and must be:

- admitted (2xx), and
- unchanged: the upstream receives exactly the bytes the client sent (no injected ``max_tokens``,
  no rewritten field).

A conversation whose prompt and output fit the window by a margin of 1% is admitted; one a token
over it is refused with ``context_length_exceeded``.

Every refusal and alteration is also written to ``out/benign-upstream-32k.json`` (id, source,
status, code, param, message, changed fields), the list to work from.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import httpx
import pytest

from guard.app import create_app
from guard.policy import Policy, default_policy
from guard.tokens import get_counter
from payloads import Payload, load_corpus
from tests._guard_harness import fake_upstream, serve
from tests._support import REPO_ROOT
from tests.payloads import _bfcl

WINDOW = 32_768
# What a vLLM 0.32 server says of itself on GET /v1/models (besides the id).
UPSTREAM_MODEL = {"owned_by": "vllm", "max_model_len": WINDOW}
BENIGN = [p for p in load_corpus(kind="benign", include_public=True) if p.method == "POST"]
REPORT = REPO_ROOT / "out" / "benign-upstream-32k.json"


@dataclass(frozen=True)
class Sent:
    id: str
    source: str
    endpoint: str
    body: bytes
    headers: list[tuple[str, str]]


@dataclass(frozen=True)
class Judged:
    id: str
    source: str
    status: int
    code: str | None
    param: str | None
    message: str | None
    forwarded: int  # requests the upstream received for it
    changed: tuple[str, ...]  # top-level fields that differ in what the upstream received

    @property
    def admitted_unchanged(self) -> bool:
        return 200 <= self.status < 300 and self.forwarded == 1 and not self.changed

    def describe(self) -> str:
        if not 200 <= self.status < 300:
            return (
                f"{self.id}: refused {self.status} {self.code} (param {self.param}): {self.message}"
            )
        return f"{self.id}: admitted but forwarded {self.forwarded}x, changed {list(self.changed)}"


def _changed(sent: bytes, received: bytes) -> tuple[str, ...]:
    if sent == received:
        return ()
    try:
        a, b = json.loads(sent), json.loads(received)
    except ValueError:
        return ("<body>",)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return ("<body>",)
    keys = sorted(set(a) | set(b))
    diff = [k if k in a else f"+{k}={json.dumps(b[k])[:40]}" for k in keys if a.get(k) != b.get(k)]
    return tuple(diff) or ("<serialisation>",)


async def _judge_all(items: Iterable[Sent]) -> list[Judged]:
    out: list[Judged] = []
    async with fake_upstream() as fake:
        fake.models.update(UPSTREAM_MODEL)
        app = create_app(POLICY, upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
            ready = (await client.get("/readyz")).json()
            assert (ready["context_length"], ready["context_length_source"]) == (WINDOW, "upstream")
            for item in items:
                before = len(fake.received)
                resp = await client.post(item.endpoint, content=item.body, headers=item.headers)
                error = resp.json().get("error", {}) if resp.status_code >= 400 else {}
                received = fake.received[before:]
                changed = _changed(item.body, received[0].body) if received else ()
                out.append(
                    Judged(
                        item.id,
                        item.source,
                        resp.status_code,
                        error.get("code"),
                        error.get("param"),
                        error.get("message"),
                        len(received),
                        changed,
                    )
                )
    return out


# The default policy, proxying besides the OpenAI routes those the payloads name (vLLM's
# pooling and scoring routes: a deployment that serves them lists them in `routes`).
POLICY = Policy(routes=tuple(sorted({r for p in BENIGN for r in p.routes})))
assert POLICY.model_dump(exclude={"routes"}) == default_policy().model_dump(exclude={"routes"})


def _judge(items: Iterable[Sent]) -> list[Judged]:
    return asyncio.run(_judge_all(items))


def _payload_source(p: Payload) -> str:
    return p.references[0] if p.references else str(p.path.relative_to(REPO_ROOT))


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Judged]:
    """Every benign payload and BFCL request, judged once; the failures written to REPORT."""
    sent = [
        Sent(p.id, _payload_source(p), p.endpoint, p.body_bytes(), p.header_items()) for p in BENIGN
    ]
    for r in _bfcl.requests(_bfcl.wheel()):
        body = json.dumps(r.body, ensure_ascii=False).encode()
        source = f"pypi:bfcl-eval=={_bfcl.VERSION} BFCL_v4_{r.category}.json"
        sent.append(Sent(f"bfcl:{r.id}", source, "/v1/chat/completions", body, []))
    judged = {j.id: j for j in _judge(sent)}
    failures = [asdict(j) for j in judged.values() if not j.admitted_unchanged]
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(failures, indent=1, ensure_ascii=False))
    return judged


@pytest.mark.parametrize("payload", BENIGN, ids=[p.id for p in BENIGN])
def test_benign_payload_admitted_unchanged(payload: Payload, verdicts: dict[str, Judged]) -> None:
    judged = verdicts[payload.id]
    assert judged.admitted_unchanged, judged.describe()


@pytest.mark.parametrize("category", _bfcl.CATEGORIES)
def test_bfcl_requests_admitted_unchanged(category: str, verdicts: dict[str, Judged]) -> None:
    judged = [j for j in verdicts.values() if j.source.endswith(f"BFCL_v4_{category}.json")]
    assert judged, f"no BFCL request in {category}"
    bad = [j for j in judged if not j.admitted_unchanged]
    codes = Counter(j.code or "altered" for j in bad)
    examples = "\n".join(j.describe() for j in bad[:5])
    assert not bad, f"{len(bad)} of {len(judged)} not admitted unchanged {dict(codes)}:\n{examples}"


# -- the window's edge ---------------------------------------------------------------------------


def _conversation(output_tokens_over_window: int) -> tuple[bytes, int]:
    """The long RAG conversation (six GPL-2 copies, ~23k tokens) with ``max_tokens`` set so that
    its messages' text tokens plus ``max_tokens`` sit ``output_tokens_over_window`` from the
    window (negative: below it)."""
    (payload,) = [p for p in BENIGN if p.id == "rag-gpl-2-near-window"]
    body = payload.body_json()
    counter = get_counter()
    text_tokens = sum(counter.count(m["content"]) for m in body["messages"])
    body["max_tokens"] = WINDOW - text_tokens + output_tokens_over_window
    return json.dumps(body).encode(), text_tokens


def test_a_conversation_near_the_window_is_admitted() -> None:
    # 1% of the window left for the template's markup (roles, headers, BOS, generation prompt).
    raw, text_tokens = _conversation(-WINDOW // 100)
    assert text_tokens > WINDOW * 2 // 3
    (judged,) = _judge([Sent("near-window", "test", "/v1/chat/completions", raw, [])])
    assert judged.admitted_unchanged, judged.describe()


def test_a_conversation_just_over_the_window_is_refused() -> None:
    # Its text alone plus max_tokens is one token over: whatever the template adds, it does not fit.
    raw, _ = _conversation(1)
    (judged,) = _judge([Sent("over-window", "test", "/v1/chat/completions", raw, [])])
    assert (judged.status, judged.code) == (400, "context_length_exceeded"), judged.describe()
    assert judged.forwarded == 0

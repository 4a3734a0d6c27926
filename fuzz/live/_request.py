"""One request of a live campaign, and the seeds it starts from (the payload corpus).

A :class:`LiveRequest` is an endpoint and a JSON body (or raw bytes, for bodies that are not
JSON on purpose). As a fuzz input, and in a saved finding, it is the body preceded by a request
line when the endpoint is not the chat one (``POST /v1/completions`` and a blank line), the
format the in-process guard targets use (:func:`fuzz.targets.gateway.join_request`).

Seeds come from ``payloads/``: every attack and benign payload for the chat and completions
endpoints judged on its body (``layer: pipeline``) and small enough, plus a few built-in ones so
that a campaign can start without the corpus. Benign seeds are marked: sent unchanged, they are
the false-positive probes of a differential campaign.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fuzz.live._shapes import CHAT, COMPLETIONS

__all__ = ["BUILTIN_SEEDS", "LiveRequest", "collect_texts", "load_seeds"]

_HEAD = b"POST "


def _dump(body: Any) -> bytes:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class LiveRequest:
    """``body`` is the parsed JSON (None for a raw body); ``lineage`` the operators that made it
    from ``seed_id``; ``benign``: an unchanged benign payload."""

    path: str
    body: Any
    raw: bytes | None = None
    seed_id: str = ""
    lineage: tuple[str, ...] = ()
    benign: bool = False
    _bytes: list[bytes] = field(default_factory=list, repr=False, compare=False)

    def to_bytes(self) -> bytes:
        """The body as sent (compact JSON, or the raw bytes)."""
        if self.raw is not None:
            return self.raw
        if not self._bytes:
            self._bytes.append(_dump(self.body))
        return self._bytes[0]

    def to_input(self) -> bytes:
        """The fuzz input: the body, after a request line unless the endpoint is the chat one."""
        body = self.to_bytes()
        if self.path == CHAT:
            return body
        return f"POST {self.path}\n\n".encode() + body

    def with_body(self, body: Any) -> LiveRequest:
        return replace(self, body=body, raw=None, _bytes=[])

    @classmethod
    def from_input(cls, data: bytes) -> LiveRequest:
        path = CHAT
        if data.startswith(_HEAD):
            line, _, rest = data.partition(b"\n")
            path = line[len(_HEAD) :].decode("latin-1").strip() or CHAT
            data = rest[1:] if rest.startswith(b"\n") else rest.partition(b"\n\n")[2] or rest
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            return cls(path, None, raw=data)
        return cls(path, body)

    @property
    def size(self) -> int:
        return len(self.to_bytes())


BUILTIN_SEEDS: tuple[LiveRequest, ...] = (
    LiveRequest(
        CHAT,
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
        seed_id="builtin-chat",
    ),
    LiveRequest(
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "What is the capital?"}]},
            ],
            "max_tokens": 4,
        },
        seed_id="builtin-chat-parts",
    ),
    LiveRequest(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                        },
                    },
                }
            ],
            "max_tokens": 4,
        },
        seed_id="builtin-chat-tools",
    ),
    LiveRequest(
        CHAT,
        {
            "messages": [{"role": "user", "content": "yes or no?"}],
            "grammar": 'root ::= "yes" | "no"',
            "max_tokens": 4,
        },
        seed_id="builtin-chat-grammar",
    ),
    LiveRequest(COMPLETIONS, {"prompt": "Hello", "max_tokens": 4}, seed_id="builtin-completion"),
)


def load_seeds(
    root: Path | None = None,
    *,
    paths: Sequence[str] = (CHAT, COMPLETIONS),
    max_bytes: int = 1 << 20,
) -> list[LiveRequest]:
    """The corpus's payloads for ``paths`` (benign ones first), then :data:`BUILTIN_SEEDS`.
    Payloads judged by the HTTP layer (``layer: http``) and bodies over ``max_bytes`` are left
    out; fuzz findings (``found/``) too."""
    from payloads import load_corpus

    out: list[LiveRequest] = []
    payloads = load_corpus(root, include_found=False)
    payloads.sort(key=lambda p: (p.kind != "benign", str(p.path)))
    for p in payloads:
        if p.layer != "pipeline" or p.method != "POST" or p.endpoint not in paths:
            continue
        if p.size_bound > max_bytes:
            continue
        data = p.body_bytes()
        req = LiveRequest.from_input(data)
        out.append(replace(req, path=p.endpoint, seed_id=p.id, benign=p.kind == "benign"))
    out.extend(s for s in BUILTIN_SEEDS if s.path in paths)
    return out


def collect_texts(seeds: Iterable[LiveRequest], limit: int = 200) -> list[str]:
    """Short strings from the benign seeds' messages and prompts (the operators' donor text)."""
    texts: list[str] = []
    for s in seeds:
        if not s.benign or not isinstance(s.body, dict):
            continue
        for m in s.body.get("messages") or []:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                texts.append(m["content"][:200])
        if isinstance(s.body.get("prompt"), str):
            texts.append(s.body["prompt"][:200])
        if len(texts) >= limit:
            break
    return [t for t in texts if t]

"""Relay of an OpenAI server-sent event stream that counts output tokens and enforces a cap.

:class:`SseRelay` is pure (no I/O): the proxy feeds it the upstream's chunks as they arrive and
sends on whatever it returns at once, so nothing is buffered beyond one incomplete event. Each
complete ``data:`` event is parsed (events are small) to count, per choice, its non-empty deltas
(``text``, ``delta.content``, ``delta.reasoning_content``, tool-call arguments) and their tokens
with the caller's counter, and to pick up a final ``usage`` chunk.

The cap is enforced on the number of deltas, not on the guard's token count: every upstream
(vLLM, SGLang, llama.cpp, TGI, the reference) sends at least one token per delta, so more deltas
than ``max_tokens`` proves the upstream overran the cap, whereas re-tokenizing deltas with a
tokenizer other than the upstream's can count more tokens than were generated and would cut
legitimate streams. An upstream that batches k tokens per delta is cut at most k times late.
The token count is what the rate limiter is reconciled with when the upstream sends no usage.

When a choice crosses ``max_tokens``, the delta that crosses it is dropped and the choice is
finished with ``finish_reason: "length"``; once every choice is finished (or the total cap,
``max_tokens * n``, is crossed) the relay ends the stream itself: finish chunks, a usage chunk if
the client asked for one, ``data: [DONE]``; the caller then aborts the upstream request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["DONE", "SseRelay", "error_event"]

DONE = b"data: [DONE]\n\n"
# A choice index above this is not a choice of this request; it is counted in the total only.
_MAX_INDEX = 1 << 16


def error_event(body: dict[str, Any]) -> bytes:
    """An error after the response started: an error event then ``[DONE]`` (the OpenAI SDK raises
    it as an APIError)."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n" + DONE


def _choice_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    pieces: list[str] = []
    for key in ("content", "reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str):
            pieces.append(value)
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                pieces.append(args)
    return "".join(pieces)


class SseRelay:
    """Splits the stream into events, counts tokens per choice, cuts at the cap.

    ``count_tokens(text)`` counts the tokens of one delta (at least 1 is charged per non-empty
    delta). ``max_tokens`` is the per-choice cap on deltas (``None``: count only). ``prompt_tokens`` is reported in the usage chunk the relay writes itself when it
    cuts a stream whose client asked for ``include_usage``.
    """

    def __init__(
        self,
        count_tokens: Callable[[str], int],
        *,
        max_tokens: int | None,
        n: int = 1,
        include_usage: bool = False,
        prompt_tokens: int = 0,
        max_event_bytes: int = 1 << 20,
    ) -> None:
        self._count = count_tokens
        self._cap = max_tokens
        self._n = max(1, n)
        self._total_cap = None if max_tokens is None else max_tokens * self._n
        self._include_usage = include_usage
        self._prompt_tokens = prompt_tokens
        self._max_event = max_event_bytes
        self._buf = b""
        self._per_choice: dict[int, int] = {}  # deltas per choice index
        self._deltas = 0
        self._finished: set[int] = set()
        self._seen: set[int] = set()  # choice indexes the stream has named
        self._cut: set[int] = set()  # choices the relay ended
        self._template: dict[str, Any] | None = None  # id/object/created/model of the stream
        self.tokens_out = 0  # counted in every event, the dropped ones too (the upstream made them)
        self.tokens_sent = 0  # in the events the client received
        self.events = 0
        self.usage: dict[str, Any] | None = None
        self.done = False  # [DONE] seen or written: nothing more goes to the client
        self.upstream_done = False  # the upstream's own [DONE] was seen (and relayed)
        self.cut = False  # the relay ended the stream at the cap
        self.oversized = False  # an event exceeded max_event_bytes

    @property
    def completion_tokens(self) -> int:
        """The upstream's own count when it sent one, else ours."""
        if self.usage is not None:
            reported = self.usage.get("completion_tokens")
            if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
                return reported
        return self.tokens_out

    @property
    def unfinished(self) -> bool:
        """Whether a choice the stream named (a role, a delta) never got a ``finish_reason`` nor
        was ended by the relay: the upstream stopped generating it part way."""
        return not self._seen <= self._finished

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send to the client now; check :attr:`done` afterwards."""
        if self.done:
            return b""
        # The held part has been searched already (but for its last byte): a long event arriving
        # in small chunks costs linear time, not quadratic.
        scanned = max(0, len(self._buf) - 1)
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = self._normalise(buf)
            scanned = 0
        out: list[bytes] = []
        start = 0
        while not self.done:
            end = buf.find(b"\n\n", max(start, scanned))
            if end < 0:
                break
            event = buf[start : end + 2]
            start = end + 2
            out.append(self._event(event))
        self._buf = buf[start:] if not self.done else b""
        if len(self._buf) > self._max_event:
            self._buf = b""
            self.oversized = True
            self.done = True
            out.append(
                error_event(
                    {
                        "error": {
                            "message": "the upstream sent an oversized event",
                            "type": "server_error",
                            "param": None,
                            "code": "upstream_error",
                        }
                    }
                )
            )
        return b"".join(out)

    def _normalise(self, buf: bytes) -> bytes:
        # SSE allows CRLF and CR line ends; relaying them as LF is equivalent. A CR at the end
        # may be half of a CRLF split across chunks: it waits for the next chunk.
        held = buf.endswith(b"\r")
        if held:
            buf = buf[:-1]
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return buf + b"\r" if held else buf

    def finish(self) -> bytes:
        """The upstream ended: flush what is left (an unterminated last event passes as is)."""
        rest, self._buf = self._buf, b""
        if self.done or not rest:
            return b""
        return rest

    # ------------------------------------------------------------------------------ events

    def _event(self, event: bytes) -> bytes:
        data = _data_of(event)
        if data is None:
            return event  # comments, keep-alives, other fields
        if data == b"[DONE]":
            self.done = True
            self.upstream_done = True
            return event
        self.events += 1
        try:
            payload = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return event
        if not isinstance(payload, dict):
            return event
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices:
            return event
        if self._template is None:
            self._template = {
                k: payload[k] for k in ("id", "object", "created", "model") if k in payload
            }
        crossed: list[int] = []
        drop = False
        event_tokens = 0
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < _MAX_INDEX:
                index = -1
            else:
                self._seen.add(index)
            text = _choice_text(choice)
            tokens = max(1, self._count(text)) if text else 0
            event_tokens += tokens
            self.tokens_out += tokens
            if not text:
                if index >= 0 and choice.get("finish_reason") is not None:
                    self._finished.add(index)
                continue
            if index in self._cut:
                drop = True  # a choice already ended at the cap: its later deltas are dropped
                continue
            if index >= 0:
                used = self._per_choice.get(index, 0) + 1
                self._per_choice[index] = used
                if self._cap is not None and used > self._cap and index not in self._finished:
                    crossed.append(index)
                    continue
                if choice.get("finish_reason") is not None:
                    self._finished.add(index)
            self._deltas += 1  # forwarded deltas, for the total cap
        over_total = self._total_cap is not None and self._deltas > self._total_cap
        if not crossed and not over_total:
            if drop:
                return b""
            self.tokens_sent += event_tokens
            return event
        # Drop the crossing event; finish the choices that crossed (all of them if the total did).
        out: list[bytes] = []
        ending = set(crossed)
        if over_total:
            ending |= set(range(self._n)) | set(self._per_choice)
        for index in sorted(ending - self._finished):
            out.append(self._finish_chunk(index))
            self._finished.add(index)
            self._cut.add(index)
        if over_total or all(i in self._finished for i in range(self._n)):
            out.append(self._end())
        return b"".join(out)

    def _finish_chunk(self, index: int) -> bytes:
        template = self._template or {}
        if template.get("object") == "text_completion":
            choice: dict[str, Any] = {
                "index": index,
                "text": "",
                "logprobs": None,
                "finish_reason": "length",
            }
        else:
            choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": "length"}
        return _sse({**template, "choices": [choice]})

    def _end(self) -> bytes:
        self.done = True
        self.cut = True
        out = b""
        if self._include_usage and self.usage is None:
            completion = self.tokens_sent
            usage = {
                "prompt_tokens": self._prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": self._prompt_tokens + completion,
            }
            self.usage = usage
            out = _sse({**(self._template or {}), "choices": [], "usage": usage})
        return out + DONE


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _data_of(event: bytes) -> bytes | None:
    """The event's data (``data:`` lines joined by newlines), or None if it has none."""
    if event.startswith(b"data:") and event.count(b"\n") == 2:
        # The common case: one data line.
        line = event[5:].rstrip(b"\n")
        return line[1:] if line.startswith(b" ") else line
    lines = event.split(b"\n")
    data = [
        (line[6:] if line.startswith(b"data: ") else line[5:])
        for line in lines
        if line.startswith(b"data:")
    ]
    return b"\n".join(data) if data else None

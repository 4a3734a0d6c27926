"""Running one API request's choices on the engine and shaping their outputs for OpenAI clients.

A request with ``n`` choices over ``p`` prompts becomes ``n * p`` engine requests (choice
``i * n + j`` is prompt ``i``, sample ``j``, OpenAI's order). All are admitted before anything is
sent, so admission errors (``queue_full``, ``tenant_tokens_exhausted``, ...) get their own HTTP
status; if one is refused, those already admitted are aborted. Whatever way a request ends --
finished, failed, client gone, task cancelled -- the server then calls :meth:`Generation.abort`,
which aborts every engine request still in flight, freeing its KV blocks and queue entry. A
choice that reaches one of its stop strings is aborted at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from guard.errors import GuardError
from scheduler_ref import api_models as api
from scheduler_ref._prompts import Prompt
from scheduler_ref._sse import DONE, sse_event
from scheduler_ref._stop import StopMatcher
from scheduler_ref._tool_calls import ArgumentsStream, ForcedCall
from scheduler_ref.engine import Engine, RequestStream
from scheduler_ref.errors import ServerError
from scheduler_ref.output import RequestOutput
from scheduler_ref.request import SamplingParams

log = logging.getLogger("scheduler_ref.server")


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    stop: StopMatcher | None = None
    # A forced tool call: ``text`` is its arguments, the engine's tokens stand for theirs.
    call: ArgumentsStream | None = None
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Delta:
    index: int
    text: str
    finish_reason: str | None


@dataclass
class Generation:
    """The engine requests of one API request (one per choice) and the choices' state."""

    engine: Engine
    rid: str
    streams: list[RequestStream] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)
    prompt_tokens: int = 0

    @classmethod
    async def start(
        cls,
        engine: Engine,
        rid: str,
        prompts: Sequence[Prompt],
        n: int,
        sampling: SamplingParams,
        tenant: str,
        stop: Sequence[str] = (),
        call: ForcedCall | None = None,
    ) -> Generation:
        gen = cls(engine, rid, prompt_tokens=sum(len(p.token_ids) for p in prompts))
        try:
            for i, prompt in enumerate(prompts):
                for j in range(n):
                    stream = await engine.add_request(
                        f"{rid}-{i * n + j}", prompt.token_ids, sampling, tenant=tenant
                    )
                    gen.streams.append(stream)
                    gen.choices.append(
                        Choice(
                            stop=StopMatcher(stop) if stop else None,
                            call=call.stream() if call is not None else None,
                            call_id=api.new_tool_call_id() if call is not None else "",
                        )
                    )
        except BaseException:
            gen.abort()
            raise
        return gen

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def abort(self) -> int:
        """Abort every engine request still in flight; how many were."""
        return sum(self.engine.abort(s.request_id) for s in self.streams)

    async def _outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(choice index, engine delta)`` as they come; raises a stream's error."""
        if len(self.streams) == 1:
            async for out in self.streams[0]:
                yield 0, out
            return
        pending: dict[asyncio.Future[RequestOutput], int] = {
            asyncio.ensure_future(anext(s)): i for i, s in enumerate(self.streams)
        }
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in sorted(done, key=pending.__getitem__):
                    index = pending.pop(fut)
                    try:
                        out = fut.result()
                    except StopAsyncIteration:
                        continue
                    yield index, out
                    if not out.finished:
                        pending[asyncio.ensure_future(anext(self.streams[index]))] = index
        finally:
            for fut in pending:
                fut.cancel()

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text deltas per choice, stop strings applied; the last one of a choice has a reason.

        A choice that reaches a stop string finishes with ``"stop"`` (the stop string is not
        part of the text) and its engine request is aborted, freeing its blocks at once.
        """
        async for index, out in self._outputs():
            choice = self.choices[index]
            if choice.finish_reason is not None:
                continue  # stopped by a stop string; this is the engine's abort confirmation
            choice.completion_tokens = out.num_output_tokens
            text, reason = out.text, out.finish_reason if out.finished else None
            if choice.call is not None:
                text = choice.call.advance(out.num_output_tokens)
                if out.finished and choice.call.complete:
                    reason = choice.call.call.finish_reason
            if choice.stop is not None:
                text, stopped = choice.stop.feed(text)
                if stopped:
                    reason = "stop"
                    self.engine.abort(self.streams[index].request_id)
                elif out.finished:
                    text += choice.stop.flush()
            choice.text += text
            choice.finish_reason = reason
            if text or reason is not None:
                yield Delta(index, text, reason)

    async def collect(self) -> list[Choice]:
        async for _ in self.deltas():
            pass
        return self.choices


def completion_response(
    gen: Generation, choices: list[Choice], model: str, created: int, echo: list[str] | None
) -> dict[str, Any]:
    body = [
        api.completion_choice(i, (echo[i] if echo else "") + c.text, c.finish_reason)
        for i, c in enumerate(choices)
    ]
    return api.response_body("text_completion", gen.rid, created, model, body, _usage(gen))


def chat_response(
    gen: Generation, choices: list[Choice], model: str, created: int
) -> dict[str, Any]:
    body = [
        api.chat_choice(i, c.text, c.finish_reason)
        if c.call is None
        else api.chat_tool_call_choice(
            i, api.tool_call(c.call_id, c.call.call.name, c.text), c.finish_reason
        )
        for i, c in enumerate(choices)
    ]
    return api.response_body("chat.completion", gen.rid, created, model, body, _usage(gen))


def _usage(gen: Generation) -> dict[str, int]:
    return api.usage(gen.prompt_tokens, gen.completion_tokens)


async def stream_events(
    gen: Generation,
    *,
    chat: bool,
    model: str,
    created: int,
    include_usage: bool,
    echo: list[str] | None,
    on_error: Callable[[str], None],
) -> AsyncIterator[bytes]:
    """OpenAI's SSE chunks for ``gen``, ending in ``[DONE]``.

    ``on_error(code)`` is called when an error is reported in the stream. The caller aborts what
    is left when the response ends (see :class:`~scheduler_ref._sse.EventStreamResponse`).
    """
    chunk = api.chat_chunk if chat else api.completion_chunk
    if chat:
        # OpenAI opens every chat choice with the assistant role.
        yield sse_event(
            chunk(
                gen.rid,
                created,
                model,
                [
                    api.chat_delta_choice(i, {"role": "assistant", "content": ""}, None)
                    for i in range(len(gen.streams))
                ],
                include_usage,
            )
        )
    elif echo:
        yield sse_event(
            chunk(
                gen.rid,
                created,
                model,
                [api.completion_choice(i, echo[i], None) for i in range(len(gen.streams))],
                include_usage,
            )
        )
    headed: set[int] = set()  # choices whose tool call has been opened (id, type, name)
    try:
        async for d in gen.deltas():
            if chat:
                delta = _chat_delta(gen.choices[d.index], d, opened=d.index in headed)
                if gen.choices[d.index].call is not None:
                    headed.add(d.index)
                choice = api.chat_delta_choice(d.index, delta, d.finish_reason)
            else:
                choice = api.completion_choice(d.index, d.text, d.finish_reason)
            yield sse_event(chunk(gen.rid, created, model, [choice], include_usage))
    except Exception as exc:
        # The response has started: report the error in-band, as OpenAI does.
        if not isinstance(exc, GuardError):
            log.exception("stream failed")
            exc = ServerError("internal_error", "the server hit an internal error")
        on_error(exc.code)
        yield sse_event(exc.to_body())
        yield DONE
        return
    if include_usage:
        final = chunk(gen.rid, created, model, [], False)
        final["usage"] = api.usage(gen.prompt_tokens, gen.completion_tokens)
        yield sse_event(final)
    yield DONE


def _chat_delta(choice: Choice, d: Delta, *, opened: bool) -> dict[str, Any]:
    if choice.call is None:
        return {"content": d.text} if d.text else {}
    if not opened:
        return api.tool_call_delta(d.text, call_id=choice.call_id, name=choice.call.call.name)
    # The last delta of a call may carry only the finish reason.
    return api.tool_call_delta(d.text) if d.text else {}

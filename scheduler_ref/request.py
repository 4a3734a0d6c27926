"""A request inside the scheduler: its sampling parameters, progress and explicit status."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class RequestStatus(enum.IntEnum):
    """Where a request is. Every status from FINISHED_STOPPED on is final."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # back in the waiting queue; its KV is recomputed when resumed
    FINISHED_STOPPED = enum.auto()  # EOS or a stop token
    FINISHED_LENGTH = enum.auto()  # max_tokens (or the output cap) or max_model_len reached
    FINISHED_ABORTED = enum.auto()  # cancelled: client disconnect or engine stop
    FINISHED_EXPIRED = enum.auto()  # its instruction outlived its SLA in the inbox

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI finish reason of a final status ("stop", "length", "abort")."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_EXPIRED: "abort",
}


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asks for. ``priority``: lower is more urgent (vLLM's convention).

    ``max_tokens=None`` means "as many as the output cap and the context length allow".
    """

    max_tokens: int | None = 16
    priority: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


class Request:
    """Mutable scheduler state of one request. Owned by the scheduler; read-only elsewhere."""

    __slots__ = (
        "arrival_step",
        "blocked_steps",
        "max_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "output_token_ids",
        "prompt_token_ids",
        "request_id",
        "sampling",
        "sort_key",
        "status",
        "tenant",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int,
        tenant: str | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self.request_id = request_id
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.sampling = sampling
        # The effective output limit, after the output cap and the context length.
        self.max_tokens = max_tokens
        self.tenant = tenant
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        # Set by the scheduler when the request enters it.
        self.arrival_step = 0
        self.sort_key: tuple[float, int] = (float(sampling.priority), 0)
        # Steps in which this request could have run by preempting others but waited (the
        # grace of the preemption bound K); reset when it is admitted.
        self.blocked_steps = 0
        self.num_preemptions = 0

    @property
    def priority(self) -> int:
        return self.sampling.priority

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequence so far (prompt + output); the KV the model must hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_seq_len(self) -> int:
        """The longest this sequence can get; fixes its KV block size."""
        return len(self.prompt_token_ids) + self.max_tokens

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"prio={self.priority}, computed={self.num_computed_tokens}/{self.num_tokens})"
        )

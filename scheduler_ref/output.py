"""Plain data crossing the scheduler's boundaries.

- :class:`SchedulerOutput`: scheduler -> executor, one per step (which requests, how many
  tokens each, who was preempted), as vLLM v1's ``SchedulerOutput``.
- :class:`ModelRunnerOutput`: executor -> scheduler, the token sampled for each request whose
  sequence was fully computed in the step.
- :class:`RequestOutput`: engine -> API handler, one token delta of one request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from guard.errors import GuardError


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int
    # Progress before this step.
    num_computed_tokens: int
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step completes the sequence, so the model samples a token."""
        return (
            self.num_computed_tokens + self.num_new_tokens
            == self.num_prompt_tokens + self.num_output_tokens
        )

    @property
    def is_decode(self) -> bool:
        """Only generated tokens remain to compute (prompt and recomputed output are prefill)."""
        return self.num_computed_tokens >= self.num_prompt_tokens + max(
            0, self.num_output_tokens - 1
        )


@dataclass(frozen=True)
class SchedulerOutput:
    step: int
    scheduled: tuple[ScheduledRequest, ...]
    preempted_request_ids: tuple[str, ...] = ()
    # Requests that finished or were aborted since the previous step: the executor may drop
    # any state it keeps for them.
    finished_request_ids: tuple[str, ...] = ()

    @property
    def num_scheduled_tokens(self) -> Mapping[str, int]:
        return {s.request_id: s.num_new_tokens for s in self.scheduled}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class ModelRunnerOutput:
    sampled_token_ids: Mapping[str, int]
    # Simulated wall time of the step (the engine sleeps it; tests ignore it).
    step_time_s: float = 0.0


@dataclass
class RequestOutput:
    """A delta of one request: new tokens (and their text), and whether it is finished.

    ``error`` is set when the request failed before producing anything (e.g. its instruction
    expired in the inbox); streams raise it.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: GuardError | None = None

    def merge(self, later: RequestOutput) -> None:
        """Fold a later delta into this one (a slow consumer gets one combined delta)."""
        self.new_token_ids.extend(later.new_token_ids)
        self.text += later.text
        self.finished = later.finished
        self.finish_reason = later.finish_reason
        self.num_output_tokens = later.num_output_tokens
        self.error = later.error or self.error

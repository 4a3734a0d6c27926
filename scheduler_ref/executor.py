"""A simulated model: deterministic tokens, step time from a cost model.

Token ``position`` of request ``request_id`` is a hash of both (and a seed), so a request's
output is the same however it is batched, chunked or preempted and recomputed: tests can check
that recompute neither duplicates nor skips a token. Ids index a small fixed vocabulary of
words, so responses read like (nonsense) text. Id 0 is EOS; it ends a request at a
deterministic point (``eos_after`` tokens, or per token with probability ``eos_probability``
drawn from the same hash) or never (the defaults).

The executor itself never sleeps: ``execute`` reports the simulated step time and the engine
awaits it, so unit tests drive steps directly with a zero cost model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from scheduler_ref.config import CostModel
from scheduler_ref.output import ModelRunnerOutput, SchedulerOutput

EOS_TOKEN_ID = 0

_WORDS = (
    "the a of and to in is it that for on with as was at by this be from or an are "
    "which not but all were when we there can been has more if will one would so what "
    "about up out them some could into only other then time these two may first any "
    "new like our over such after most also made many before must through back years "
    "where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come "
    "since against go came right used take three scheduler token block queue request "
    "batch model cache prompt budget guard step"
)
VOCAB: tuple[str, ...] = ("<eos>", *_WORDS.split())


class Executor(Protocol):
    """What the engine needs from a model runner."""

    @property
    def eos_token_id(self) -> int | None: ...

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...


class SimulatedExecutor:
    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        eos_after: int | None = None,
        eos_probability: float = 0.0,
        seed: int = 0,
    ) -> None:
        if eos_after is not None and eos_after < 1:
            raise ValueError("eos_after must be >= 1 (or None for never)")
        if not 0.0 <= eos_probability <= 1.0:
            raise ValueError("eos_probability is a probability")
        self.cost = cost or CostModel()
        self.eos_after = eos_after
        self.eos_probability = eos_probability
        self.seed = seed
        self.steps = 0

    @property
    def eos_token_id(self) -> int:
        return EOS_TOKEN_ID

    def token_at(self, request_id: str, position: int) -> int:
        """The token this model emits at output ``position`` of ``request_id``."""
        if self.eos_after is not None and position + 1 >= self.eos_after:
            return EOS_TOKEN_ID
        digest = hashlib.blake2b(
            f"{self.seed}:{request_id}:{position}".encode(), digest_size=8
        ).digest()
        h = int.from_bytes(digest, "little")
        if self.eos_probability and (h >> 32) / 2**32 < self.eos_probability:
            return EOS_TOKEN_ID
        return 1 + (h & 0xFFFFFFFF) % (len(VOCAB) - 1)

    def step_time(self, scheduler_output: SchedulerOutput) -> float:
        prefill = decode = 0
        for s in scheduler_output.scheduled:
            if s.is_decode:
                decode += 1
            else:
                prefill += s.num_new_tokens
        return self.cost.step_time(prefill, decode)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.steps += 1
        sampled = {
            s.request_id: self.token_at(s.request_id, s.num_output_tokens)
            for s in scheduler_output.scheduled
            if s.samples
        }
        return ModelRunnerOutput(sampled, self.step_time(scheduler_output))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return detokenize(token_ids)


def detokenize(token_ids: Sequence[int]) -> str:
    """Text of output tokens: each word with a leading space; EOS and unknown ids are empty."""
    n = len(VOCAB)
    return "".join(" " + VOCAB[t] for t in token_ids if 0 < t < n)

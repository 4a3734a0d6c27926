"""The context window in force: the policy's, or the one the upstream reports (issue 14 item 7).

``limits.tokens.context_length`` set in the policy is the one in force. Left out (or ``auto``),
the upstream's own wins when it reports one: vLLM's ``GET /v1/models`` has ``max_model_len``
for each base model (LoRA adapters' cards have none), llama-cpp-python has nothing, and the
policy's default (4096) stays. :class:`ContextWindow` reads it at start-up, again whenever the
upstream answers a readiness check (vLLM restarted with another ``--max-model-len`` is
noticed), and, while the upstream has not answered yet, every few seconds in the background;
each time it swaps the gateway's policy for one with that window in force
(:meth:`~guard.policy.Policy.with_upstream_context`), so every check, the dry run included,
uses it. :meth:`ContextWindow.describe` says which one is in force and where it came from:
``policy``, ``upstream`` or ``default`` (the upstream reported none, or has not answered yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

from guard.http import Upstream, max_model_len_of, upstream_kind_of
from guard.policy import Policy

__all__ = ["ContextWindow", "WindowSource", "in_force", "policy_summary"]

_log = logging.getLogger("schedguard.guard")

WindowSource = Literal["policy", "upstream", "default"]
# While the upstream has not answered, the model list is asked for this often.
RETRY_S = 5.0


def in_force(base: Policy, models: Any) -> tuple[Policy, WindowSource]:
    """``base`` with what ``models`` (the upstream's ``/v1/models`` document; None when it did
    not answer) puts in force, and where the context window comes from: the upstream's
    ``max_model_len`` (unless the policy sets one) and, for ``upstream.kind: auto``, its kind
    (``other`` until it answers; ``limits.guided.llama_cpp_schemas: auto`` follows it)."""
    policy = base.with_upstream_kind("other" if models is None else upstream_kind_of(models))
    if base.limits.tokens.context_length_from == "policy":
        return policy, "policy"
    reported = None if models is None else max_model_len_of(models)
    if reported is None:
        return policy, "default"
    return policy.with_upstream_context(reported), "upstream"


_SAID = {
    "policy": "the policy's limits.tokens.context_length",
    "upstream": "the upstream's /v1/models max_model_len",
    "default": "the default: the upstream reports none",
}


def policy_summary(policy: Policy, source: WindowSource) -> str:
    """One line saying what the policy in force decides for ordinary traffic: the preset, the
    context window and where it came from, the prompt and output caps, the upstream's kind,
    whether API keys are required, where rate limits are kept."""
    tokens = policy.limits.tokens
    window = tokens.context_length
    said = "none" if window is None else f"{window} tokens ({_SAID[source]})"
    prompt = "the window" if tokens.max_prompt_tokens is None else str(tokens.max_prompt_tokens)
    output = "the window" if tokens.max_output_tokens is None else str(tokens.max_output_tokens)
    injected = (
        "nothing injected"
        if tokens.default_max_tokens is None
        else f"{tokens.default_max_tokens} injected when a request sets none"
    )
    keys = (
        f"{len(policy.keys)} API key(s) required"
        if policy.keys
        else "no API keys (every caller is the anonymous tenant)"
    )
    rate = "rate limits in Redis" if policy.rate.redis_url else "rate limits in memory"
    return (
        f"policy in force: preset {policy.preset}; context window {said}; prompt cap {prompt}; "
        f"output cap {output}, {injected}; upstream kind {policy.upstream_kind}; {keys}; {rate}"
    )


class ContextWindow:
    """Keeps ``holder.policy`` (a gateway) in step with the upstream's context window."""

    def __init__(self, holder: Any, upstream: Upstream) -> None:
        self._holder = holder
        self._base: Policy = holder.policy
        # An upstream.kind the policy names is in force before the upstream answers.
        holder.policy = self._base.with_upstream_kind("other")
        self._upstream = upstream
        self.source: WindowSource = self._initial_source()
        self.answered = False  # the upstream has answered GET /v1/models at least once
        # What the upstream last reported (its window, its kind): readiness probes ask every few
        # seconds, and the policy is rebuilt (and logged) only when that changes.
        self._reported: tuple[int | None, str] | None = None
        self._task: asyncio.Task[None] | None = None

    def _initial_source(self) -> WindowSource:
        return "policy" if self._base.limits.tokens.context_length_from == "policy" else "default"

    @property
    def value(self) -> int | None:
        policy: Policy = self._holder.policy
        return policy.limits.tokens.context_length

    def describe(self) -> dict[str, Any]:
        """``{"context_length": N or None, "context_length_source": "policy" | "upstream" |
        "default", "upstream_kind": "vllm" | "llama_cpp" | "other" (the kind in force),
        "llama_cpp_schemas": whether schemas are checked as llama-cpp-python converts them}``."""
        policy: Policy = self._holder.policy
        return {
            "context_length": self.value,
            "context_length_source": self.source,
            "upstream_kind": policy.upstream_kind,
            "llama_cpp_schemas": policy.limits.guided.llama_cpp_schemas is not False,
        }

    async def refresh(self) -> bool:
        """Ask the upstream once; True when it answered (with a window or without one)."""
        base = self._base.limits
        if (
            base.tokens.context_length_from == "policy"
            and base.guided.llama_cpp_schemas != "auto"
            and self._base.upstream.kind != "auto"
        ):
            return True  # nothing the upstream says would change the policy
        models = await self._upstream.models()
        if models is None:
            return False
        self.answered = True
        reported = max_model_len_of(models)
        facts = (reported, upstream_kind_of(models))
        if facts == self._reported:
            return True
        self._reported = facts
        previous = self.value
        previous_kind = self._holder.policy.upstream_kind
        self._holder.policy, self.source = in_force(self._base, models)
        if self._holder.policy.upstream_kind != previous_kind:
            _log.info("upstream kind in force: %s", self._holder.policy.upstream_kind)
        if self.value != previous:
            _log.info(
                "context window in force: %s tokens (%s)", self.value, self._described_source()
            )
        tokens = self._base.limits.tokens
        default = tokens.default_max_tokens
        if reported is not None and default is not None and reported <= default:
            _log.warning(
                "the upstream's max_model_len (%d) is not above limits.tokens.default_max_tokens "
                "(%d): requests without max_tokens will not fit",
                reported,
                default,
            )
        return True

    def _described_source(self) -> str:
        return _SAID[self.source]

    async def start(self) -> None:
        """At start-up: ask once; if the upstream does not answer yet, keep asking in the
        background until it does (stopped by :meth:`stop`)."""
        if await self.refresh():
            return
        self._task = asyncio.create_task(self._until_answered())

    async def _until_answered(self) -> None:
        while not await self.refresh():
            await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

"""The two profiles of the reference scheduler.

``vulnerable`` is what a plausible engine without limits does; ``hardened`` applies the seed's
patch (template depth <= 8, at most 2048 tokens per request, counted incrementally) and the
other limits. Both run the same code: the profile only sets limits and parsing choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProfileName = Literal["vulnerable", "hardened"]


@dataclass(frozen=True)
class Profile:
    name: ProfileName
    # Prompt templates ({{name}} placeholders).
    max_template_depth: int | None
    reject_unbalanced_delimiters: bool
    max_template_bytes: int | None
    # Tokens: per request prompt cap (counted incrementally while expanding) and output cap.
    max_prompt_tokens: int | None
    max_output_tokens: int | None
    # Time allowed for rendering one request's template(s).
    render_deadline_s: float | None
    # Jinja chat templates.
    allow_request_chat_template: bool
    hardened_chat_template: bool
    # Per-tenant token bucket (prompt + reserved output); None disables it.
    tenant_tokens_per_s: float | None
    tenant_burst_tokens: int | None

    @property
    def hardened(self) -> bool:
        return self.name == "hardened"


VULNERABLE = Profile(
    name="vulnerable",
    max_template_depth=None,
    reject_unbalanced_delimiters=False,
    max_template_bytes=None,
    max_prompt_tokens=None,
    max_output_tokens=None,
    render_deadline_s=None,
    allow_request_chat_template=True,
    hardened_chat_template=False,
    tenant_tokens_per_s=None,
    tenant_burst_tokens=None,
)

HARDENED = Profile(
    name="hardened",
    max_template_depth=8,
    reject_unbalanced_delimiters=True,
    max_template_bytes=256 * 1024,
    max_prompt_tokens=2048,
    max_output_tokens=2048,
    render_deadline_s=0.25,
    allow_request_chat_template=False,
    hardened_chat_template=True,
    # Generous enough for load tests from one anonymous tenant; a flood still hits it.
    tenant_tokens_per_s=100_000.0,
    tenant_burst_tokens=400_000,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (VULNERABLE, HARDENED)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None

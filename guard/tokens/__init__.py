"""Token counting behind sound bounds: UTF-8 bytes above, per-byte / run / class-change bounds
below, exact counting in chunks cut at proven piece boundaries, with an early stop.
"""

from __future__ import annotations

from guard.tokens._counter import (
    BPETokenCounter,
    DecidedBy,
    IncrementalTokenCount,
    TokenCounter,
    TokenStats,
    check_prompt_tokens,
    get_counter,
)

__all__ = [
    "BPETokenCounter",
    "DecidedBy",
    "IncrementalTokenCount",
    "TokenCounter",
    "TokenStats",
    "check_prompt_tokens",
    "get_counter",
]

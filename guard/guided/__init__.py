"""Guided-decoding checks: regexes (RE2 under a memory cap, ambiguous nested repetition), JSON
schemas and grammars, each bounded before an upstream compiles them.
"""

from __future__ import annotations

from guard.guided._check import check_guided_decoding
from guard.guided._limits import GuidedLimits
from guard.guided._structured import check_structured_outputs

__all__ = [
    "GuidedLimits",
    "check_guided_decoding",
    "check_structured_outputs",
]

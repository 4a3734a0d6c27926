"""What a request asks the upstream to compile: each constraint's cache key and estimated cold
cost, for the compile budget (:mod:`guard.admission._compile`) to charge.

vLLM 0.32 keys xgrammar's compiled-grammar cache by the constraint's kind and text (a schema
given as an object is serialised with ``json.dumps``), so an exact repeat costs nothing and
anything else, even a reordered schema, is compiled again. :func:`compile_key` keys the same
way (a 16-byte BLAKE2b digest, so what is remembered has a fixed size whatever the constraint's).

The compiled grammar's size is a coarse model: xgrammar 0.2.8's compiled grammars
(``memory_size_bytes``) measured 0.04-0.6 MB for plain schemas and regexes and 4-14 MB for those
with bounded strings at cl100k_base (bench/README.md, issue 23), the larger ones those whose
compile was slower (their token-mask cache takes both the time and the memory).
:func:`grammar_mb` takes 0.5 MB per 100k tokens plus 2 MB per estimated CPU second, above most
of the measured sizes, so the guard forgets a grammar no later than the upstream would and
charges again rather than admitting a compile as free.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Compile", "compile_key", "grammar_mb"]

_BASE_MB_PER_100K = 0.5
_MB_PER_CPU_S = 2.0


@dataclass(frozen=True, slots=True)
class Compile:
    """One constraint the upstream compiles: its cache key, the estimated cold compile (CPU
    seconds at the model's vocabulary, the largest over the backends that may compile it) and
    the estimated size of the compiled grammar (MB)."""

    key: bytes
    compile_s: float
    grammar_mb: float


def compile_key(kind: str, spec: Any) -> bytes:
    """The digest of (kind, text) a constraint is cached under upstream."""
    if isinstance(spec, str):
        text = spec
    else:
        try:
            text = json.dumps(spec, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = repr(spec)
    h = hashlib.blake2b(kind.encode(), digest_size=16)
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()


def grammar_mb(compile_s: float, vocab: int) -> float:
    """The estimated size of a compiled grammar (see the module docstring)."""
    return _BASE_MB_PER_100K * vocab / 100_000 + _MB_PER_CPU_S * compile_s

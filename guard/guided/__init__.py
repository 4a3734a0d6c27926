"""Guided-decoding checks: the regexes, JSON schemas, grammars and choice lists of a request,
each bounded before an upstream compiles them.

The face is :func:`check_structured_outputs` (everything, :mod:`._structured`), the constraints'
own size and shape alone (:func:`check_guided_decoding`, :mod:`._check`: where constraints sit
in a request, against one budget per request, :mod:`._budget`) and the policy section
(:class:`GuidedLimits`, :mod:`._limits`); what passes is returned as the constraints the
upstream compiles (:class:`Compile`, :mod:`._compiles`: cache key and estimated cold cost), which
the gateway charges to the tenant's compile budget. By concern, each subpackage with its own face:

- :mod:`.regex`: the structural scan, RE2, the regex AST the cost models price, the syntax the
  backends refuse;
- :mod:`.schema`: the schema walk, the facts the backend checks read, nested bounds, ``$ref``;
- :mod:`.grammar`: grammar scans, llama.cpp's GBNF parser mirrored, the grammars
  llama-cpp-python makes of schemas;
- :mod:`.backends`: which structured-output backend a request reaches on vLLM, and what
  compiling it costs there;
- :mod:`._vendor`: third-party code kept byte for byte (llama-cpp-python's schema converter).
"""

from __future__ import annotations

from guard.guided._check import check_guided_decoding
from guard.guided._compiles import Compile, compile_key, grammar_mb
from guard.guided._limits import CALIBRATION_VOCAB, GuidedLimits
from guard.guided._structured import check_structured_outputs

__all__ = [
    "CALIBRATION_VOCAB",
    "Compile",
    "GuidedLimits",
    "check_guided_decoding",
    "check_structured_outputs",
    "compile_key",
    "grammar_mb",
]

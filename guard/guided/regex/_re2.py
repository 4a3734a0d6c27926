"""Compile a pattern with RE2 (linear-time matching, bounded memory) to decide that it is valid.

The ``re2`` module's own ``compile`` keeps the last 128 patterns in an LRU cache; a gateway must
not keep attacker patterns and their programs alive, so the extension type is used directly.
RE2's error text quotes the pattern, so only its leading category ("missing )", "bad repetition
operator") is ever passed on.
"""

from __future__ import annotations

import re

import re2

from guard.errors import RegexRejected
from guard.guided.regex._scan import INVALID, UNSAFE

_RE2 = re2._re2.RE2
# RE2 errors read "<category>: <pattern fragment>"; keep the category only.
_CATEGORY = re.compile(r"[a-zA-Z ()\-\\]{1,60}")
# JSON Schema patterns are ECMA-262: \uXXXX is common there and unknown to RE2.
_ECMA_U = re.compile(r"\\(\\|u([0-9a-fA-F]{4}))")


def _ecma_to_re2(pattern: str) -> str:
    if "\\u" not in pattern:
        return pattern

    def repl(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) is None else "\\x{" + m.group(2) + "}"

    return _ECMA_U.sub(repl, pattern)


def _category(error: str) -> str:
    head = error.split(":", 1)[0].strip()
    m = _CATEGORY.fullmatch(head)
    return m.group() if m else "syntax error"


def re2_program_size(pattern: str, *, max_mem: int, max_program_size: int) -> int:
    """Compile ``pattern``; return its program size or raise :class:`RegexRejected`."""
    try:
        data = _ecma_to_re2(pattern).encode("utf-8")
    except UnicodeEncodeError:
        raise RegexRejected(INVALID, "the pattern is not valid Unicode text") from None
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # RE2 would log the (attacker-sized) pattern to stderr
    compiled = _RE2(data, options)
    if not compiled.ok():
        error = compiled.error()
        text = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
        raise RegexRejected(INVALID, f"the pattern does not compile in RE2 ({_category(text)})")
    size = int(compiled.ProgramSize())
    if size > max_program_size:
        raise RegexRejected(
            UNSAFE, f"the compiled pattern has more than {max_program_size} instructions"
        )
    return size

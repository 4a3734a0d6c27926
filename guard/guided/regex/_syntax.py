"""Regex syntax that xgrammar's and llguidance's converters reject (vLLM's ``auto`` routing).

Probed on xgrammar 0.2.8 and llguidance 1.7.6 (see :mod:`guard.guided.backends._routing`). Both
answers are cached by pattern (tools repeat the same patterns), and the scan outside character
classes jumps between the few characters that matter with one C-level search.
"""

from __future__ import annotations

import functools
import re

__all__ = ["guidance_rejects_regex", "xgrammar_rejects_regex"]

# Regex syntax xgrammar 0.2.8's converter rejects (probed): look-around, atomic groups,
# (?P<, comments, inline flags, back-references, octal, \b \B \p \P, possessive, {,n}.
_XGR_REGEX_REJECT = re.compile(
    r"\(\?[=!]|\(\?<[=!]|\(\?>|\(\?P|\(\?#|\(\?[a-zA-Z-]+[:)]"
    r"|\\[1-9]|\\0[0-7]|\\[bBpP]|[*+?}]\+|\{,"
)
# ... and what llguidance's (Rust regex-syntax) rejects; then vLLM answers 400.
_LLG_REGEX_REJECT = re.compile(
    r"\(\?[=!]|\(\?<[=!]|\(\?>|\(\?#|\\[1-9]|\\0[0-7]|\\[bB]|\\Z|\\Q|\{,"
)
_BRACE_OK = re.compile(r"\{\d+(,\d*)?\}")
_SPECIAL = re.compile(r"[\\\[\]{^]")


def _outside(rx: str, caret: bool) -> bool:
    """A ``{`` outside classes and escapes that is not a count, or (``caret``) a ``^`` there
    after anything but ``(``, ``|`` or ``:`` (a mid-pattern ``^``, read as a look-around).

    Classes nest (``[`` inside one opens another), ``[]`` does not close, ``\\p{..}`` outside
    classes is one escape. Only the characters that matter are visited."""
    n = len(rx)
    depth = 0
    last_end = -1  # where the last escape or class close ended ...
    last_tok = ""  # ... and what the scan remembers of it ("\\" or "]")
    search = _SPECIAL.search
    m = search(rx, 0)
    while m is not None:
        i = m.start()
        c = rx[i]
        if c == "\\":
            if depth == 0 and rx.startswith("{", i + 2) and i + 1 < n and rx[i + 1] in "pP":
                j = rx.find("}", i)
                i = j + 1 if j > 0 else n
            else:
                i += 2
            last_tok, last_end = "\\", i
        elif c == "[":
            depth += 1
            i += 2 if i + 1 < n and rx[i + 1] == "]" else 1
        elif c == "]" and depth:
            depth -= 1
            i += 1
            last_tok, last_end = "]", i
        else:
            if depth == 0:
                if c == "{":
                    if not _BRACE_OK.match(rx, i):
                        return True
                elif c == "^" and caret and i > 0:
                    # what came just before: an escape or a class close, or a plain character
                    prev = last_tok if last_end == i else rx[i - 1]
                    if prev not in "(|:":
                        return True
            i += 1
        if i >= n:
            break
        m = search(rx, i)
    return False


@functools.lru_cache(maxsize=512)
def xgrammar_rejects_regex(rx: str) -> bool:
    r = rx.replace("\\\\", "")
    return bool(_XGR_REGEX_REJECT.search(r)) or _outside(r, caret=False)


@functools.lru_cache(maxsize=512)
def guidance_rejects_regex(rx: str) -> bool:
    r = rx.replace("\\\\", "")
    return bool(_LLG_REGEX_REJECT.search(r)) or _outside(r, caret=True)

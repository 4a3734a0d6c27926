"""``logit_bias`` that makes llama-cpp-python generate past ``max_tokens``.

llama-cpp-python 0.3.36 (``Llama._create_completion``) skips its ``max_tokens`` test while the
text it generated ends inside a UTF-8 character (its ``multibyte_fix``: a lead byte still waiting
for continuation bytes). A positive bias on a token whose bytes end that way (a lone lead byte,
say) makes every step end inside a character again, so the test is never reached: measured on
the e2e model, ``max_tokens: 8`` with ``logit_bias: {"<id of byte 0xF0>": 5}`` generated until
the 4096-token context was full (16-26 s), then answered 500 ``llama_decode returned 1``; a 500
settles nothing, so the work was free. vLLM stops at the cap whatever the bias.

In front of any upstream but vLLM (``upstream.kind``: llama-cpp-python, or one not known), a
positive bias on such a token is refused (``output_cap_bypass``), the token ids read in the
policy's tokenizer (the model's vocabulary); with a tokenizer whose bytes are not known by id,
any positive bias is. Nobody raises a lone lead byte on purpose.
"""

from __future__ import annotations

from typing import Any

from guard.errors import LimitExceeded
from guard.request import lax_int
from guard.tokens import TokenCounter

__all__ = ["check_llama_cpp_logit_bias"]


def _positive(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value > 0
    if isinstance(value, str):
        try:
            return float(value) > 0
        except ValueError:
            return False
    return False


def check_llama_cpp_logit_bias(body: dict[str, Any], counter: TokenCounter) -> None:
    bias = body.get("logit_bias")
    if not isinstance(bias, dict) or not bias:
        return
    partial = counter.partial_char_ids
    for key, value in bias.items():
        if not _positive(value):
            continue
        token = lax_int(key)
        if partial is not None and (token is None or token not in partial):
            continue
        what = (
            "a token that ends inside a UTF-8 character"
            if partial is not None
            else "a token (the tokenizer cannot tell which ones end inside a UTF-8 character)"
        )
        raise LimitExceeded(
            "output_cap_bypass",
            f"logit_bias raises {what}: llama-cpp-python then generates past max_tokens",
            param=f"logit_bias.{str(key)[:20]}",
        )

"""Sampling settings that make llama-cpp-python generate past ``max_tokens``.

llama-cpp-python 0.3.36 (``Llama._create_completion``) skips its ``max_tokens`` test while the
text it generated ends inside a UTF-8 character (its ``multibyte_fix``: a lead byte still waiting
for continuation bytes). Whatever steers the model into repeating a token whose bytes end that
way (a lone lead byte, say) makes every step end inside a character again, so the test is never
reached and it generates until the context is full, then answers 500 ``llama_decode returned
1``; a 500 settles nothing, so the work was free. Measured on the e2e model:

- a positive ``logit_bias`` on such a token: ``max_tokens: 8`` ran to the 4096-token context
  (16-26 s);
- a penalty that rewards repetition: ``frequency_penalty`` or ``presence_penalty`` below 0
  (-0.5 was enough: found by the black-box campaign through the guard, ``max_tokens: 2``, a
  repetitive 336-token prompt, 14 s to the context), or llama-cpp-python's ``repeat_penalty``
  below 1 (0.5: 318 tokens for ``max_tokens: 2``). The same prompt with a penalty of 0 or above
  stops at the cap.

vLLM stops at the cap whatever the settings. In front of any other upstream (``upstream.kind``:
llama-cpp-python, or one not known) these are refused (``output_cap_bypass``) when the model's
vocabulary has such tokens (read in the policy's tokenizer; a tokenizer whose bytes are not
known by id is taken to have them): nobody raises a lone lead byte on purpose, and a penalty
that rewards repeating oneself is not what an ordinary request asks for.
"""

from __future__ import annotations

from typing import Any

from guard.errors import LimitExceeded
from guard.request import lax_float, lax_int
from guard.tokens import TokenCounter

__all__ = ["check_llama_cpp_cap_bypass"]

_CODE = "output_cap_bypass"
# Penalties below these reward repeating a token (OpenAI's two subtract from its logit;
# llama-cpp-python's repeat_penalty divides a positive logit by it).
_REWARDING_BELOW = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0}


def check_llama_cpp_cap_bypass(body: dict[str, Any], counter: TokenCounter) -> None:
    partial = counter.partial_char_ids
    if partial is not None and not partial:
        return  # no token ends inside a character: nothing can keep the text open
    for name, floor in _REWARDING_BELOW.items():
        value = lax_float(body.get(name))
        if value is not None and value < floor:
            raise LimitExceeded(
                _CODE,
                f"{name} {value:g} rewards repeating a token, and repeating one that ends inside "
                "a UTF-8 character makes llama-cpp-python generate past max_tokens "
                f"(at least {floor:g} here)",
                param=name,
            )
    _check_logit_bias(body.get("logit_bias"), partial)


def _check_logit_bias(bias: Any, partial: frozenset[int] | None) -> None:
    if not isinstance(bias, dict) or not bias:
        return
    for key, value in bias.items():
        number = lax_float(value)
        if number is None or number <= 0:
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
            _CODE,
            f"logit_bias raises {what}: llama-cpp-python then generates past max_tokens",
            param=f"logit_bias.{str(key)[:20]}",
        )

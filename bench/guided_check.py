"""How long the guided-decoding check takes, and that it stays linear, for bodies up to 16 KB.

    python bench/guided_check.py [--repeat 200] [--against REV [--rounds 3]]

For each shape (a schema with many properties, a long enum, many tool schemas with patterns,
a long regex, a choice list, a Lark grammar), bodies of ~1, 2, 4, 8 and 16 KB go through
:func:`guard.guided.check_structured_outputs` under the default policy, and again with the
backend cost check off (``backends: []``) to show what it adds. Prints the median microseconds
per body, and microseconds per KB (flat when linear). Issue 16's target: under 1 ms at 16 KB.

``--against REV`` times the same bodies with the ``guard`` package of git revision REV beside
this tree's, side by side in one run: each round runs both in child processes one after the
other (alternating which goes first), and the table gives the median over rounds of each and
their ratio.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The tree whose ``guard`` package is timed: this one, or another revision's (--against).
sys.path.insert(
    0, os.environ.get("SCHEDGUARD_BENCH_TREE") or str(Path(__file__).resolve().parents[1])
)

from guard.errors import GuardError
from guard.guided import GuidedLimits, check_structured_outputs

ROOT = Path(__file__).resolve().parent.parent


def clear_caches() -> None:
    """Forget the check's per-pattern caches (every measurement is cold: an attacker's patterns
    are new every time): each ``functools`` cache of the loaded ``guard.guided`` modules, so
    that a revision timed with ``--against`` is cleared the same way, whatever its layout."""
    for name, module in list(sys.modules.items()):
        if name == "guard.guided" or name.startswith("guard.guided."):
            for value in vars(module).values():
                clear = getattr(value, "cache_clear", None)
                if callable(clear):
                    clear()


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


def measure(shapes: list[str], sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """One row per shape and size: the check's median microseconds, with and without the
    backend cost estimates, and the verdict."""
    full, off = GuidedLimits(), GuidedLimits(backends=())
    rows: list[dict[str, Any]] = []
    for name in shapes:
        for kb in sizes:
            body = sized(SHAPES[name], kb * 1024)
            size = len(json.dumps(body)) / 1024
            us, verdict = median_us(body, full, repeat)
            us_off, _ = median_us(body, off, repeat)
            row = {"shape": name, "kb": round(size, 2), "us": round(us)}
            rows.append({**row, "us_without_backends": round(us_off), "verdict": verdict})
    return rows


def _child_rows(tree: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """This script's rows for the ``guard`` package of ``tree``, measured in a child process."""
    cmd = [sys.executable, __file__, "--json", "--repeat", str(args.repeat)]
    cmd += ["--sizes", args.sizes, "--shapes", args.shapes]
    env = {**os.environ, "SCHEDGUARD_BENCH_TREE": str(tree)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])["rows"]
    return rows


def against(args: argparse.Namespace) -> int:
    """This tree beside revision ``args.against``, round after round (see the docstring)."""
    rounds: dict[str, list[list[dict[str, Any]]]] = {"this": [], "against": []}
    with tempfile.TemporaryDirectory(prefix="guided-check-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.against, "guard"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"this": ROOT, "against": Path(tmp)}
        for r in range(args.rounds):
            order = ("against", "this") if r % 2 == 0 else ("this", "against")
            for name in order:
                print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr)
                rounds[name].append(_child_rows(trees[name], args))
    rows = []
    for i, first in enumerate(rounds["this"][0]):
        this = statistics.median(run[i]["us"] for run in rounds["this"])
        then = statistics.median(run[i]["us"] for run in rounds["against"])
        rows.append(
            {
                "shape": first["shape"],
                "kb": first["kb"],
                "us": round(this),
                "us_against": round(then),
                "ratio": round(this / then, 3) if then else None,
                "verdict": first["verdict"],
                "verdict_against": rounds["against"][0][i]["verdict"],
            }
        )
    if args.json:
        print(json.dumps({"against": args.against, "rounds": args.rounds, "rows": rows}))
        return 0
    print(f"| shape | KB | {args.against} (µs) | this tree (µs) | ratio | verdict |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        same = row["verdict"] == row["verdict_against"]
        verdict = row["verdict"] if same else f"{row['verdict_against']} -> {row['verdict']}"
        print(
            f"| {row['shape']} | {row['kb']:.1f} | {row['us_against']} | {row['us']} | "
            f"{row['ratio']} | {verdict} |"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200, help="runs per body (the median is kept)")
    ap.add_argument("--sizes", default="1,2,4,8,16", help="body sizes in KB")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which shapes, comma-separated")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument(
        "--against", metavar="REV", help="time git revision REV's guard package beside this tree's"
    )
    ap.add_argument("--rounds", type=int, default=3, help="with --against: rounds of both")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        ap.error(f"unknown shapes {unknown}; choose from {sorted(SHAPES)}")
    if args.against:
        return against(args)
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = measure(shapes, sizes, args.repeat)

    def out(text: str) -> None:
        if not args.json:
            print(text)

    out("| shape | KB | check (µs) | µs/KB | without backend costs (µs) | verdict |")
    out("|---|---|---|---|---|---|")
    worst16 = 0.0
    for row, kb in zip(rows, itertools.cycle(sizes), strict=False):
        us, size = row["us"], row["kb"]
        if kb == 16:
            worst16 = max(worst16, us)
        out(
            f"| {row['shape']} | {size:.1f} | {us:.0f} | {us / size:.0f} | "
            f"{row['us_without_backends']:.0f} | {row['verdict']} |"
        )
    out(f"\nworst at 16 KB: {worst16 / 1000:.2f} ms (target < 1 ms)")
    if args.json:
        print(json.dumps({"rows": rows, "worst_16kb_ms": round(worst16 / 1000, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The whole payloads/ corpus against real upstreams, unguarded and behind the guard (issue 13).

For each upstream (vLLM, llama-cpp-python; set up by scripts/upstreams/upstreams.py) and each
mode (``unguarded``: straight to the upstream; ``guarded``: through ``schedguard serve`` in front
of it), every payload of the corpus is sent once, in turn, as its file frames it
(``loadtests.upstream_corpus``): the upstream runs under a memory cap (RLIMIT_AS, the script's
``--mem-limit-mb``) on 127.0.0.1, its process tree's peak RSS is read from /proc around each
payload, and an upstream that died or hung is restarted before the next one. Prints the table of
harmed / contained per attack class, the upstream's peak RSS and the worst latency per class
and configuration; ``--json`` prints everything (each payload's outcome) instead.

    .venv/bin/python bench/corpus_upstreams.py                      # both upstreams, both modes
    .venv/bin/python bench/corpus_upstreams.py --upstreams llamacpp --modes unguarded --json
    .venv/bin/python bench/corpus_upstreams.py --classes guided_decoding,volume --ids 'gd-grammar'

Harmed (per payload, bench/README.md "the corpus against real upstreams"): a 5xx that is not the
server's refusal of invalid input, the upstream dead after it, no answer within --timeout-s or
no health within 30 s after, peak RSS over --rss-budget-mb above its RSS after start, or an
answer slower than --latency-budget-s (payloads whose own transport is slow excepted).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtests.upstream_corpus import (  # noqa: E402
    LLAMACPP_REFUSAL,
    CorpusBudgets,
    PayloadOutcome,
    ScriptUpstream,
    corpus_routes,
    guard_policy,
    run_corpus,
    summarize,
)
from payloads.loader import CLASSES, Payload, load_corpus  # noqa: E402
from schedguard.servers import RunningServer, ServerSpec, free_port, schedguard_argv  # noqa: E402

UPSTREAMS = ("vllm", "llamacpp")
MODES = ("unguarded", "guarded")
GUARD_MEM_LIMIT = 1 << 30


def start_guard(upstream_url: str, policy: Path) -> RunningServer:
    def argv(ports: Mapping[str, int], host: str) -> list[str]:
        return schedguard_argv("serve", "--upstream", upstream_url, "--policy", str(policy),
                               "--host", host, "--port", str(ports["guard"]),
                               "--log-level", "warning")  # fmt: skip

    spec = ServerSpec("guard", argv, health_path="/readyz")
    server = RunningServer(spec, {"guard": free_port("127.0.0.1")}, "127.0.0.1",
                           mem_limit_bytes=GUARD_MEM_LIMIT)  # fmt: skip
    server.wait_ready(120)
    return server


def select(classes: list[str] | None, ids: str | None) -> list[Payload]:
    out = []
    for p in load_corpus(kind="all", include_found=False):
        if classes and p.class_ not in classes:
            continue
        if ids and not re.search(ids, p.id):
            continue
        out.append(p)
    return out


def run_config(
    name: str,
    mode: str,
    payloads: list[Payload],
    budgets: CorpusBudgets,
    mem_limit_mb: int | None,
    tmp: Path,
) -> dict[str, Any]:
    up = ScriptUpstream(name, free_port("127.0.0.1"), mem_limit_mb=mem_limit_mb)
    started = time.monotonic()
    up.start()
    guard: RunningServer | None = None
    try:
        start_rss = float(up.record.get("rss_mb", 0))
        target = up.base_url
        if mode == "guarded":
            guard = start_guard(
                up.base_url,
                guard_policy(tmp / f"{name}-{mode}", up.tokenizer_json, corpus_routes(payloads)),
            )
            target = guard.url

        def progress(o: PayloadOutcome) -> None:
            mark = ",".join(o.harm) if o.harm else "ok"
            print(f"  {name}/{mode} {o.id}: {o.status} {o.code or ''} {o.elapsed_s:.2f}s "
                  f"{o.peak_rss_mb:.0f}MB {mark}", file=sys.stderr, flush=True)  # fmt: skip

        outcomes = run_corpus(
            payloads,
            target,
            up,
            model=up.model,
            budgets=budgets,
            refusal_5xx=LLAMACPP_REFUSAL if name == "llamacpp" else None,
            on_outcome=progress,
        )
        guard_alive = guard.alive() if guard is not None else None
    finally:
        if guard is not None:
            guard.stop()
        up.stop()
    return {
        "upstream": name,
        "mode": mode,
        "mem_limit_mb": up.record.get("mem_limit_mb"),
        "start_rss_mb": start_rss,
        "restarts": up.restarts,
        "guard_alive_after": guard_alive,
        "seconds": round(time.monotonic() - started, 1),
        "classes": [s.to_dict() for s in summarize(outcomes)],
        "outcomes": [o.to_dict() for o in outcomes],
    }


def table(runs: list[dict[str, Any]]) -> str:
    """Rows: classes; columns: one per configuration, 'harmed k/n' or 'contained', RSS, latency."""
    heads = [f"{r['upstream']} {r['mode']}" for r in runs]
    lines = [
        "| class | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(heads),
    ]
    order = [*CLASSES, "benign"]
    for cls in order:
        cells = []
        for r in runs:
            s = next((c for c in r["classes"] if c["class"] == cls), None)
            if s is None:
                cells.append("-")
                continue
            harms = ", ".join(f"{k} {v}" for k, v in sorted(s["harms"].items()))
            verdict = (
                f"**harmed {s['harmed']}/{s['payloads']}** ({harms})"
                if s["harmed"]
                else (f"contained {s['payloads']}")
            )
            cells.append(f"{verdict}; {s['peak_rss_mb']:.0f} MB; {s['worst_latency_s']:.1f} s")
        if any(c != "-" for c in cells):
            lines.append(f"| {cls} | " + " | ".join(cells) + " |")
    lines.append("| restarts | " + " | ".join(str(r["restarts"]) for r in runs) + " |")
    lines.append(
        "| start RSS, run time | "
        + " | ".join(f"{r['start_rss_mb']:.0f} MB, {r['seconds']:.0f} s" for r in runs)
        + " |"
    )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="The whole payloads/ corpus against real vLLM and llama-cpp-python, "
        "unguarded and behind the guard: harmed / contained per attack class, the upstream's "
        "peak RSS, the worst latency (needs scripts/upstreams/upstreams.py setup all).",
    )
    ap.add_argument(
        "--upstreams", default=",".join(UPSTREAMS), help="comma-separated (default: %(default)s)"
    )
    ap.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated (default: %(default)s)"
    )
    ap.add_argument(
        "--classes", default=None, help="only these classes (comma-separated; 'benign' too)"
    )
    ap.add_argument("--ids", default=None, help="only payloads whose id matches this regex")
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="no answer within this is a hang (default: %(default)s)",
    )
    ap.add_argument(
        "--latency-budget-s",
        type=float,
        default=10.0,
        help="an answer slower than this harmed (default: %(default)s)",
    )
    ap.add_argument(
        "--rss-budget-mb",
        type=float,
        default=512.0,
        help="peak RSS above start RSS that harms (default: %(default)s)",
    )
    ap.add_argument(
        "--vllm-mem-limit-mb",
        type=int,
        default=None,
        help="RLIMIT_AS of vLLM (default: the script's, 6144)",
    )
    ap.add_argument(
        "--llamacpp-mem-limit-mb",
        type=int,
        default=None,
        help="RLIMIT_AS of llama-cpp-python (default: the script's, 4096)",
    )
    ap.add_argument(
        "--json", action="store_true", help="print JSON (every outcome) instead of the table"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return ap.parse_args()


def print_report(report: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """The table, then the payloads that harmed each server."""
    print(f"# {report['date']}: {report['command']}; budgets {report['budgets']}")
    print(table(runs))
    for r in runs:
        for c in r["classes"]:
            if c["harmed_ids"]:
                print(f"{r['upstream']} {r['mode']} {c['class']}: {', '.join(c['harmed_ids'])}")


def main() -> int:
    args = parse_args()
    budgets = CorpusBudgets(
        latency_budget_s=args.latency_budget_s,
        timeout_s=args.timeout_s,
        rss_budget_mb=args.rss_budget_mb,
    )
    classes = args.classes.split(",") if args.classes else None
    payloads = select(classes, args.ids)
    limits = {"vllm": args.vllm_mem_limit_mb, "llamacpp": args.llamacpp_mem_limit_mb}
    runs = []
    with tempfile.TemporaryDirectory(prefix="corpus-upstreams-") as tmp:
        for name in args.upstreams.split(","):
            for mode in args.modes.split(","):
                print(f"{name} {mode}: {len(payloads)} payloads", file=sys.stderr, flush=True)
                (Path(tmp) / f"{name}-{mode}").mkdir()
                runs.append(run_config(name, mode, payloads, budgets, limits[name], Path(tmp)))
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/corpus_upstreams.py", *sys.argv[1:]]),
        "budgets": budgets.__dict__,
        "payloads": len(payloads),
        "runs": runs,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

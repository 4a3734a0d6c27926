"""``schedguard fuzz``: list the targets, run a campaign, replay payload files.

- ``fuzz list [--json]``: each target with what it exercises, its kind and its budgets;
- ``fuzz run --target NAME [--engine atheris|hypothesis|search|all] [--duration S] [--jobs N]
  [--out DIR] [--seed N]``: a campaign with a live progress line; reports in ``--out``; exit 1
  when a hardened or guard target has a finding;
- ``fuzz replay PATH... [--target NAME] [--json]``: re-run saved payload files; exit 1 when one
  is a finding on a hardened or guard target, 2 when a file cannot be replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

ENGINE_CHOICES = ("search", "atheris", "hypothesis", "all")


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fuzz = sub.add_parser(
        "fuzz",
        help="fuzz the scheduler and the guard for resource-exhaustion inputs",
        description=(
            "Cost-guided and coverage-guided fuzzing of schedguard's targets under budgets (wall "
            "time, memory, output tokens, steps), in a worker process under RLIMIT_AS."
        ),
    )
    fsub = fuzz.add_subparsers(dest="fuzz_command", metavar="ACTION", required=True)
    ls = fsub.add_parser("list", help="the fuzz targets, their kind and budgets")
    ls.add_argument("--json", action="store_true", help="machine-readable output")

    run = fsub.add_parser(
        "run",
        help="run a fuzzing campaign on one target",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run.add_argument("--target", required=True, help="target name (see `schedguard fuzz list`)")
    run.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="search",
        help="engine; 'all' splits the duration between the engines available here",
    )
    run.add_argument("--duration", type=_positive_float, default=60.0, help="seconds, in total")
    run.add_argument("--jobs", type=_positive_int, default=1, help="parallel workers")
    run.add_argument("--out", type=Path, default=None, help="directory for the reports")
    run.add_argument("--seed", type=int, default=None, help="random seed (reproducible search)")
    run.add_argument(
        "--found-root",
        type=Path,
        default=None,
        help="corpus root findings are saved under (ROOT/found/TARGET/; default: payloads/)",
    )
    run.add_argument("--no-save", action="store_true", help="do not save payload files")
    run.add_argument(
        "--minimise-s",
        type=_positive_float,
        default=None,
        help="minimisation time per finding (default: duration/3, between 5 and 20 s)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress line")

    rp = fsub.add_parser("replay", help="re-run saved payload files against a target")
    rp.add_argument("paths", nargs="+", type=Path, help="payload files or directories")
    rp.add_argument("--target", default=None, help="default: the target recorded in each file")
    rp.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    if args.fuzz_command == "list":
        return _list(args.json)
    if args.fuzz_command == "run":
        return _run(args)
    return _replay(args)


def _list(as_json: bool) -> int:
    from fuzz.targets import FAILS_CI, REGISTRY

    rows: list[dict[str, Any]] = []
    for name, t in REGISTRY.items():
        rows.append(
            {
                "name": name,
                "kind": t.kind,
                "fails_ci": t.kind in FAILS_CI,
                "description": t.description,
                "exercises": str(getattr(t, "exercises", "")),
                "isolated_by_default": t.isolate_by_default,
                "max_size": int(getattr(t, "max_size", 0)),
                "budgets": t.budgets.to_dict(),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        b = r["budgets"]
        budgets = [f"wall {b['wall_s']} s", f"mem {b['mem_bytes'] >> 20} MiB"]
        if b["output_tokens"] is not None:
            budgets.append(f"tokens {b['output_tokens']}")
        if b["steps"] is not None:
            budgets.append(f"steps {b['steps']:,}")
        if b["cost_per_byte"] is not None:
            budgets.append(f"cost/byte {b['cost_per_byte']}")
        ci = ", findings fail CI" if r["fails_ci"] else ""
        print(f"{r['name']}  [{r['kind']}{ci}]")
        print(f"    {r['description']}")
        print(f"    exercises: {r['exercises']}")
        print(f"    budgets:   {', '.join(budgets)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from fuzz.campaign import CampaignOptions, run_campaign
    from fuzz.targets import get_target

    try:
        get_target(args.target)
    except KeyError as exc:
        print(f"fuzz run: {exc.args[0]}", file=sys.stderr)
        return 2
    try:
        report = run_campaign(
            CampaignOptions(
                target=args.target,
                engine=args.engine,
                duration_s=args.duration,
                jobs=args.jobs,
                out_dir=args.out,
                seed=args.seed,
                save_root=args.found_root,
                save=not args.no_save,
                minimise_s=args.minimise_s,
                progress=None if args.quiet else sys.stderr,
            )
        )
    except (KeyError, RuntimeError) as exc:
        print(f"fuzz run: {exc}", file=sys.stderr)
        return 2
    ttff = report.time_to_first_finding_s
    print(
        f"{report.target} ({report.kind}) engine={report.engine}: {report.execs:,} execs in "
        f"{report.duration_s:.1f} s, {len(report.findings)} finding(s)"
        + ("" if ttff is None else f", first after {ttff:.2f} s")
    )
    for f in report.findings:
        c = f.cost_after
        print(
            f"  {f.cause}: {len(f.original)} -> {f.size_bytes} bytes, {c.busy_s:.3f} s, "
            f"{c.peak_mem_bytes / (1 << 20):.1f} MiB, {c.steps} steps -> {f.path or '(not saved)'}"
        )
    if args.out is not None:
        print(f"reports in {args.out}/ (report.json, junit.xml, report.sarif, summary.md)")
    if report.exit_status:
        print(f"FAIL: {report.target} is a {report.kind} target and has findings", file=sys.stderr)
    return report.exit_status


def _replay(args: argparse.Namespace) -> int:
    from fuzz.campaign import replay_paths
    from fuzz.targets import FAILS_CI, get_target
    from payloads import PayloadError

    try:
        results = replay_paths(args.paths, args.target)
    except (PayloadError, ValueError, KeyError, OSError) as exc:
        print(f"fuzz replay: {exc}", file=sys.stderr)
        return 2
    status = 0
    for r in results:
        if r.is_finding and get_target(r.target).kind in FAILS_CI:
            status = 1
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
        return status
    for r in results:
        d = r.to_dict()
        if r.outcome is None:
            print(f"{r.path}: {r.target}: {r.note}")
            continue
        cost = r.outcome.cost
        rep = (
            ""
            if r.reproduced is None
            else (" (reproduced)" if r.reproduced else " (NOT reproduced)")
        )
        what = d["cause"] or d["verdict"] + (f" {d['error_code']}" if d["error_code"] else "")
        print(
            f"{r.path}: {r.target}: {what}{rep}  "
            f"[{cost.busy_s:.3f} s, {cost.peak_mem_bytes / (1 << 20):.1f} MiB, {cost.steps} steps]"
        )
    return status

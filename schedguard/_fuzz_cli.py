"""``schedguard fuzz``: list the targets, run a campaign, replay payload files.

- ``fuzz list [--json]``: each target with what it exercises, its kind and its budgets;
- ``fuzz run --target NAME [--engine atheris|hypothesis|search|all] [--duration S] [--jobs N]
  [--out DIR] [--seed N]``: a campaign with a live progress line; reports, the engines'
  working files and the findings' payload files in ``--out`` (``out/fuzz/TARGET`` by default,
  under the current directory; ``--found-root`` puts the findings into a corpus instead); exit
  1 when a hardened or guard target has a finding;
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
# Where `fuzz run` writes when --out is not given: a directory under the current one (out/ is
# where `schedguard load` writes too), never the installed package.
DEFAULT_OUT = Path("out") / "fuzz"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


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
    ls = fsub.add_parser(
        "list",
        help="the fuzz targets, their kind and budgets",
        description="List the fuzz targets: what each exercises, its kind and its budgets.",
    )
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    _add_run(fsub)
    rp = fsub.add_parser(
        "replay",
        help="re-run saved payload files against a target",
        description=(
            "Re-run saved payload files and say what each does now. Exit 1 when one is a "
            "finding on a hardened or guard target, 2 when a file cannot be replayed."
        ),
    )
    rp.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="payload files or directories of them"
    )
    rp.add_argument(
        "--target",
        metavar="NAME",
        default=None,
        help="replay against this target (default: the target recorded in each file; curated "
        "payloads record none)",
    )
    rp.add_argument("--json", action="store_true", help="machine-readable output")


def _add_run(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = fsub.add_parser(
        "run",
        help="run a fuzzing campaign on one target",
        description=(
            "Fuzz one target for a while. Reports (report.json, junit.xml, report.sarif, "
            "summary.md), the engines' working files and the findings' payload files go to "
            "--out. Exit 1 when a hardened or guard target has a finding."
        ),
    )
    run.add_argument(
        "--target",
        required=True,
        metavar="NAME",
        help="a target from `schedguard fuzz list` (or package.module:Class)",
    )
    run.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="search",
        help="the engine (default: search); 'all' splits the duration between the engines "
        "available here",
    )
    run.add_argument(
        "--duration",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="how long the campaign runs, in total (default: 60)",
    )
    run.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        metavar="N",
        help="parallel workers: search threads, libFuzzer fork-mode jobs (hypothesis runs "
        "one) (default: 1)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where the reports, the engines' working files and the findings go (default: "
        f"{DEFAULT_OUT}/TARGET under the current directory)",
    )
    run.add_argument(
        "--seed",
        type=_int,
        default=None,
        metavar="N",
        help="seed of the engines' random choices, recorded with each finding (default: "
        "none: search draws one, atheris and hypothesis use 0)",
    )
    run.add_argument(
        "--found-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="the corpus root findings are saved under, as DIR/found/TARGET/ID.yaml (default: "
        "the --out directory; `--found-root payloads` adds them to the repository's corpus)",
    )
    run.add_argument("--no-save", action="store_true", help="do not save findings as payload files")
    run.add_argument(
        "--minimise-s",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="minimisation time per finding (default: a third of --duration, between 5 and 20)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress line")


def run(args: argparse.Namespace) -> int:
    if args.fuzz_command == "list":
        return _list(args.json)
    if args.fuzz_command == "run":
        return _run(args)
    return _replay(args)


def _list(as_json: bool) -> int:
    from fuzz import FAILS_CI, REGISTRY

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
    from fuzz import CampaignOptions, get_target, run_campaign
    from fuzz.findings import safe_target_name

    try:
        get_target(args.target)
    except KeyError as exc:
        print(f"fuzz run: {exc.args[0]}", file=sys.stderr)
        return 2
    out: Path = args.out if args.out is not None else DEFAULT_OUT / safe_target_name(args.target)
    try:
        report = run_campaign(
            CampaignOptions(
                target=args.target,
                engine=args.engine,
                duration_s=args.duration,
                jobs=args.jobs,
                out_dir=out,
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
    print(f"reports in {out}/ (report.json, junit.xml, report.sarif, summary.md)")
    if report.exit_status:
        print(f"FAIL: {report.target} is a {report.kind} target and has findings", file=sys.stderr)
    return report.exit_status


def _replay(args: argparse.Namespace) -> int:
    from fuzz import FAILS_CI, get_target, replay_paths
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

"""``schedguard fuzz``: list the targets, run a campaign, replay payload files.

- ``fuzz list [--json]``: each target with what it exercises, its kind and its budgets, the
  structured-output backend targets included (one whose backend is not installed names the
  extra that installs it);
- ``fuzz run --target NAME [--engine atheris|hypothesis|search|all] [--duration S] [--jobs N]
  [--out DIR] [--seed N]``: a campaign with a live progress line; reports, the engines'
  working files and the findings' payload files in ``--out`` (``out/fuzz/TARGET`` by default,
  under the current directory; ``--found-root`` puts the findings into a corpus instead); exit
  1 when a hardened or guard target has a finding;
- ``fuzz run --target http://HOST:PORT [--guard http://GUARD] [--pid PID]... [--metrics URL]
  ...``: the same against a live OpenAI-compatible server (:mod:`fuzz.live`): black-box, or
  differential against a guard's dry run; exit 1 on a finding unless ``--expect-findings``,
  2 when the server is not reachable or not on loopback (without ``--allow-remote``);
- ``fuzz replay PATH... [--target NAME] [--json]``: re-run saved payload files; exit 1 when one
  is a finding on a hardened or guard target, 2 when a file cannot be replayed;
- ``fuzz report DIR --format issue [--out DIR] [--policy FILE]``: from a campaign's
  ``DIR/report.json``, one upstream bug report per triage group (:mod:`fuzz.issue`);
- ``fuzz findings-doc [--records DIR] [--out FILE] [--check]``: docs/FINDINGS.md, the upstream
  bugs the project's campaigns found, from the records kept in the repository
  (:mod:`fuzz.findings_doc`); ``--check``: exit 1 when the file is not what the records make.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedguard._argtypes import non_negative_float, positive_float, positive_int, whole

__all__ = ["add_parser", "run"]

ENGINE_CHOICES = ("search", "atheris", "hypothesis", "all")
# Where `fuzz run` writes when --out is not given: a directory under the current one (out/ is
# where `schedguard load` writes too), never the installed package.
DEFAULT_OUT = Path("out") / "fuzz"


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
        help="replay against this target, or a live server's URL (then see --guard) (default: "
        "the target recorded in each file; curated payloads record none)",
    )
    rp.add_argument("--json", action="store_true", help="machine-readable output")
    rp.add_argument(
        "--guard",
        metavar="URL",
        default=None,
        help="with --target URL: replay through this guard's dry run, as a differential "
        "campaign judges (an under-count replays as ok once the guard counts it)",
    )
    rp.add_argument(
        "--allow-remote",
        action="store_true",
        help="with --target URL: allow a host that is not loopback",
    )
    rp.add_argument(
        "--ignore-5xx",
        action="append",
        default=None,
        metavar="REGEX",
        help="with --target URL: 5xx messages that are the server's refusals (repeatable)",
    )
    _add_report(fsub)


def _add_report(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rep = fsub.add_parser(
        "report",
        help="upstream bug reports from a campaign's record",
        description=(
            "Render a campaign's DIR/report.json for the upstream: --format issue writes one "
            "markdown file per triage group (title, versions, a curl reproduction with the "
            "minimised body, observed, expected, impact, what the guard does about it)."
        ),
    )
    rep.add_argument("dir", type=Path, metavar="DIR", help="the campaign's --out directory")
    rep.add_argument("--format", choices=("issue",), default="issue", help="(default: issue)")
    rep.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="where (default: DIR/issues)"
    )
    rep.add_argument(
        "--policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="the guard policy whose verdict the reports state (default: the built-in one)",
    )
    doc = fsub.add_parser(
        "findings-doc",
        help="docs/FINDINGS.md from the upstream findings' records",
        description=(
            "Write the project's list of the upstream bugs its campaigns found (status, date "
            "verified, upstream version checked) from the records under --records."
        ),
    )
    doc.add_argument(
        "--records",
        type=Path,
        default=None,
        metavar="DIR",
        help="the records (default: docs/findings in the source tree)",
    )
    doc.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="(default: docs/FINDINGS.md)"
    )
    doc.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when FILE is out of date"
    )


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
        help="a target from `schedguard fuzz list` (or package.module:Class), or the base URL "
        "of a live OpenAI-compatible server (http://127.0.0.1:8000): see the live options",
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
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="how long the campaign runs, in total (default: 60)",
    )
    run.add_argument(
        "--runs",
        type=positive_int,
        default=None,
        metavar="N",
        help="in-process targets: each engine also stops after about N executions, a count "
        "that means the same on any machine (--duration stays the outer bound; like "
        "libFuzzer's -runs)",
    )
    run.add_argument(
        "--jobs",
        type=positive_int,
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
        type=whole,
        default=None,
        metavar="N",
        help="seed of the engines' (or the live mutator's) random choices; the report and each "
        "finding record it, and the same seed makes the same choices again (default: drawn "
        "at random, and recorded)",
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
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="minimisation time per finding (default: a third of --duration, between 5 and 20)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress line")
    _add_live(run)


def _add_live(run: argparse.ArgumentParser) -> None:
    live = run.add_argument_group(
        "live servers (--target http://HOST:PORT)",
        "Fuzz a running server from outside: structure-aware OpenAI requests seeded from the "
        "payload corpus; a crash, a hang, a 5xx, or latency or memory growth over the budget "
        "is a finding. With --guard, every request is first judged by the guard's dry run "
        "(POST /guard/v1/check), what it admits is sent to --target directly, and a cost above "
        "the guard's accounting (usage.prompt_tokens over its prompt bound) is a finding, as is "
        "a benign payload it refuses that the upstream serves cheaply. --engine does not apply.",
    )
    _add_live_server(live)
    _add_live_monitoring(live)
    _add_live_budgets(live)
    _add_live_restarts(live)
    _add_live_verdicts(live)
    _add_live_output(live)


def _add_live_server(live: argparse._ArgumentGroup) -> None:
    """How the campaign reaches the server and what it sends it."""
    live.add_argument(
        "--guard",
        metavar="URL",
        default=None,
        help="a differential campaign: the guard in front of --target, asked for its verdict "
        "on each request before the request goes to --target directly",
    )
    live.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a host that is not loopback (the campaign sends thousands of hostile "
        "requests: only against servers you own)",
    )
    live.add_argument(
        "--model",
        metavar="NAME",
        default=None,
        help="the model name to put in requests (default: the first of the server's /v1/models)",
    )
    live.add_argument(
        "--header",
        action="append",
        type=_header,
        default=None,
        metavar="'NAME: VALUE'",
        help="a header to send with every request (repeatable), e.g. 'Authorization: Bearer KEY'",
    )
    live.add_argument(
        "--health",
        metavar="PATH",
        default=None,
        help="the server's health path (default: the first of /health, /healthz, /v1/models "
        "that answers 200)",
    )


def _add_live_monitoring(live: argparse._ArgumentGroup) -> None:
    """Where the server's resident memory is read."""
    live.add_argument(
        "--pid",
        action="append",
        type=_pid,
        default=None,
        metavar="PID",
        help="a process whose resident memory, children included, is the server's (repeatable:"
        " the upstream and the guard in front of it); 'auto': the one listening on --target's "
        "port, 'port:N': the one listening on port N (both found again after a restart)",
    )
    live.add_argument(
        "--metrics",
        metavar="URL",
        default=None,
        help="a Prometheus endpoint whose process_resident_memory_bytes is the server's memory",
    )


def _add_live_budgets(live: argparse._ArgumentGroup) -> None:
    """The request rate, the time and memory limits, the sizes."""
    live.add_argument(
        "--max-rps",
        type=positive_float,
        default=50.0,
        metavar="R",
        help="the campaign's own request rate, at most (every request it sends)",
    )
    live.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="no answer within this long is a hang",
    )
    live.add_argument(
        "--max-latency",
        type=positive_float,
        default=20.0,
        metavar="SECONDS",
        help="an answer slower than this is a finding (confirmed by sending it again alone)",
    )
    live.add_argument(
        "--max-latency-per-token",
        type=non_negative_float,
        default=0.02,
        metavar="SECONDS",
        help="added to --max-latency for each output token the answer's usage reports: a long "
        "answer that was asked for is work, not an amplification (default 0.02: 50 tokens/s, "
        "slower than any server's decoding of one request; 0: --max-latency alone)",
    )
    live.add_argument(
        "--max-rss-growth-mb",
        type=positive_float,
        default=512.0,
        metavar="MB",
        help="resident memory growth during one request above this is a finding (with --pid or "
        "--metrics)",
    )
    live.add_argument(
        "--max-body-kb",
        type=positive_int,
        default=1024,
        metavar="KB",
        help="the largest request body sent (larger seeds and children are left out)",
    )
    live.add_argument(
        "--max-minimise-tests",
        type=positive_int,
        default=200,
        metavar="N",
        help="requests the minimiser may send per finding",
    )


def _add_live_restarts(live: argparse._ArgumentGroup) -> None:
    """What happens when the server dies."""
    live.add_argument(
        "--restart-cmd",
        metavar="CMD",
        default=None,
        help="a shell command that brings up a fresh server, whether or not one runs (stop, "
        "then start), so that crashes are minimised and the campaign goes on; a command that "
        "fails stops the campaign with its output (default: for a server the project's "
        "upstream scripts started, their stop and start commands; otherwise none: the campaign "
        "waits --dead-wait, then stops)",
    )
    live.add_argument(
        "--max-restarts",
        type=positive_int,
        default=100,
        metavar="N",
        help="with --restart-cmd: restart the server at most this many times, then stop (a "
        "crash is minimised restarting after every test that kills it)",
    )
    live.add_argument(
        "--server-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="the server's log: each finding then carries what the server wrote meanwhile "
        "(exception, signal and stack name its cause); default: the log of the project's "
        "upstream scripts' server on --target's port",
    )
    live.add_argument(
        "--dead-wait",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a server that went down to answer its health check again",
    )


def _add_live_verdicts(live: argparse._ArgumentGroup) -> None:
    """What counts as a finding and what a finding does to the run."""
    live.add_argument(
        "--ignore-5xx",
        action="append",
        default=None,
        metavar="REGEX",
        help="a 5xx whose error message matches REGEX is this server's way of refusing invalid "
        "input, not a finding (repeatable; llama-cpp-python answers validation errors with "
        "500: 'validation error')",
    )
    live.add_argument(
        "--expect-findings",
        action="store_true",
        help="the server is known to be vulnerable (unguarded): findings do not fail the run",
    )
    live.add_argument(
        "--stop-on-first",
        action="store_true",
        help="end at the first finding (what the time to first finding measures)",
    )


def _add_live_output(live: argparse._ArgumentGroup) -> None:
    """The seeds' corpus and the target's name in reports."""
    live.add_argument(
        "--corpus",
        type=Path,
        default=None,
        metavar="DIR",
        help="the payload corpus the seeds come from (default: the package's payloads/)",
    )
    live.add_argument(
        "--name",
        metavar="NAME",
        default=None,
        help="the target's name in reports and payload files (default: from the URL)",
    )
    live.add_argument(
        "--guard-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="the guard policy whose hash the campaign record names (default: the built-in one)",
    )
    live.add_argument(
        "--no-env",
        action="store_true",
        help="do not record the upstream's versions, model and flags (/version, /v1/models, "
        "the --pid process's command line and Python packages)",
    )


def _pid(text: str) -> int | str:
    if text == "auto":
        return text
    if text.startswith("port:"):
        port = text[5:]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id or 'auto': {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"not 'Name: value': {text!r}")
    return name.strip(), value.strip()


def run(args: argparse.Namespace) -> int:
    if args.fuzz_command == "list":
        return _list(args.json)
    if args.fuzz_command == "run":
        return _run(args)
    if args.fuzz_command == "report":
        return _report(args)
    if args.fuzz_command == "findings-doc":
        return _findings_doc(args)
    return _replay(args)


def _report(args: argparse.Namespace) -> int:
    from fuzz.issue import write_issues

    if not (args.dir / "report.json").is_file():
        print(f"fuzz report: no report.json in {args.dir}", file=sys.stderr)
        return 2
    paths = write_issues(args.dir, args.out, policy_path=args.policy)
    for p in paths:
        print(p)
    if not paths:
        print(f"fuzz report: {args.dir}/report.json has no findings", file=sys.stderr)
    return 0


def _findings_doc(args: argparse.Namespace) -> int:
    from fuzz.findings_doc import DEFAULT_DOC, DEFAULT_RECORDS, render_findings_doc

    records = args.records or DEFAULT_RECORDS
    out = args.out or DEFAULT_DOC
    text = render_findings_doc(records)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else ""
        if current != text:
            print(f"{out} is out of date: run `schedguard fuzz findings-doc`", file=sys.stderr)
            return 1
        print(f"{out} is up to date with {records}")
        return 0
    out.write_text(text, encoding="utf-8")
    print(out)
    return 0


def _list(as_json: bool) -> int:
    """The built-in targets, then the structured-output backend targets (their native backends
    come from an extra: one that is not installed here says which)."""
    from fuzz.targets import BACKEND_TARGETS, FAILS_CI, REGISTRY, get_target

    targets = [*REGISTRY.values(), *(get_target(name) for name in BACKEND_TARGETS)]
    rows: list[dict[str, Any]] = []
    for t in targets:
        available = getattr(t, "available", None)
        installed = available is None or bool(available())
        rows.append(
            {
                "name": t.name,
                "kind": t.kind,
                "fails_ci": t.kind in FAILS_CI,
                "description": t.description,
                "exercises": str(getattr(t, "exercises", "")),
                "isolated_by_default": t.isolate_by_default,
                "max_size": int(getattr(t, "max_size", 0)),
                "budgets": t.budgets.to_dict(),
                "installed": installed,
                "missing": None if installed else getattr(t, "missing_message", str)(),
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
        if r["missing"]:
            print(f"    not runnable here: {r['missing']}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from fuzz import CampaignOptions, get_target, run_campaign
    from fuzz.findings import safe_target_name
    from fuzz.live import is_url

    if is_url(args.target):
        return _run_live(args)

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
                max_execs=args.runs,
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
    return _print_findings(
        report,
        out,
        lambda c: f"{c.busy_s:.3f} s, {c.peak_mem_bytes / (1 << 20):.1f} MiB, {c.steps} steps",
        f"{report.target} is a {report.kind} target and has findings",
    )


def _run_live(args: argparse.Namespace) -> int:
    import re

    from fuzz import CampaignReport
    from fuzz.live import (
        LiveOptions,
        RemoteTargetRefused,
        TargetUnreachable,
        live_target_name,
        run_live_campaign,
    )

    if args.runs is not None:
        print(
            "fuzz run: --runs applies to in-process targets, not to a live server", file=sys.stderr
        )
        return 2
    for pattern in args.ignore_5xx or ():
        try:
            re.compile(pattern)
        except re.error as exc:
            print(f"fuzz run: --ignore-5xx {pattern!r}: {exc}", file=sys.stderr)
            return 2
    name = args.name or live_target_name(args.target)
    out: Path = args.out if args.out is not None else DEFAULT_OUT / name
    try:
        report: CampaignReport = run_live_campaign(
            LiveOptions(
                target=args.target,
                guard=args.guard,
                duration_s=args.duration,
                jobs=args.jobs,
                seed=args.seed,
                out_dir=out,
                save_root=args.found_root,
                save=not args.no_save,
                minimise_s=args.minimise_s,
                max_minimise_tests=args.max_minimise_tests,
                max_rps=args.max_rps,
                timeout_s=args.timeout,
                latency_budget_s=args.max_latency,
                latency_per_token_s=args.max_latency_per_token,
                rss_budget_bytes=int(args.max_rss_growth_mb * (1 << 20)),
                pids=tuple(args.pid or ()),
                metrics_url=args.metrics,
                health_path=args.health,
                allow_remote=args.allow_remote,
                model=args.model,
                headers=tuple(args.header or ()),
                restart_cmd=args.restart_cmd,
                max_restarts=args.max_restarts,
                ignore_5xx=tuple(args.ignore_5xx or ()),
                expect_findings=args.expect_findings,
                name=name,
                corpus=args.corpus,
                max_body_bytes=args.max_body_kb * 1024,
                stop_on_first=args.stop_on_first,
                dead_wait_s=args.dead_wait,
                server_log=args.server_log,
                guard_policy=args.guard_policy,
                capture_env=not args.no_env,
                progress=None if args.quiet else sys.stderr,
            )
        )
    except (RemoteTargetRefused, TargetUnreachable, ValueError) as exc:
        print(f"fuzz run: {exc}", file=sys.stderr)
        return 2
    stats = report.results[0].extra.get("stats", {}) if report.results else {}
    ttff = report.time_to_first_finding_s
    print(
        f"{report.target} ({report.kind}) {report.engine}: {report.execs:,} requests in "
        f"{report.duration_s:.1f} s ({stats.get('requests_per_s', 0):.1f}/s), "
        f"{len(report.findings)} finding(s)"
        + ("" if ttff is None else f", first after {ttff:.2f} s")
        + (f"; stopped: {stats['stopped']}" if stats.get("stopped") else "")
    )
    return _print_findings(
        report, out, lambda c: f"{c.time_s:.3f} s", f"{report.target} has findings"
    )


def _print_findings(report: Any, out: Path, cost: Callable[[Any], str], failure: str) -> int:
    """Each finding in one line (``cost`` says what its cost after minimisation was), where the
    reports are, and the campaign's exit status (``failure`` said when it is not 0)."""
    for f in report.findings:
        print(
            f"  {f.cause}: {len(f.original)} -> {f.size_bytes} bytes, {cost(f.cost_after)}"
            f" -> {f.path or '(not saved)'}"
        )
        if f.replay_command:
            print(f"    replay: {f.replay_command}")
    print(f"seed {report.seed} (--seed {report.seed} repeats the run's choices)")
    print(f"reports in {out}/ (report.json, junit.xml, report.sarif, summary.md)")
    if report.exit_status:
        print(f"FAIL: {failure}", file=sys.stderr)
    exit_status: int = report.exit_status
    return exit_status


def _replay(args: argparse.Namespace) -> int:
    from fuzz import FAILS_CI, get_target, replay_paths
    from fuzz.live import is_url
    from payloads import PayloadError

    if args.target is not None and is_url(args.target):
        return _replay_live(args)

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


def _replay_live(args: argparse.Namespace) -> int:
    from fuzz.live import RemoteTargetRefused, replay_live
    from payloads import PayloadError

    try:
        results = replay_live(
            args.paths,
            args.target,
            guard=args.guard,
            allow_remote=args.allow_remote,
            ignore_5xx=tuple(args.ignore_5xx or ()),
        )
    except (PayloadError, RemoteTargetRefused, ValueError, OSError) as exc:
        print(f"fuzz replay: {exc}", file=sys.stderr)
        return 2
    status = 1 if any(r.is_finding for r in results) else 0
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
        return status
    for r in results:
        d = r.to_dict()
        if r.measured is None:
            print(f"{r.path}: {r.note}")
            continue
        what = d["cause"] or d["verdict"] + (f" {d['error_code']}" if d["error_code"] else "")
        tokens = ""
        if d["upstream_prompt_tokens"] is not None:
            tokens = f"  [upstream {d['upstream_prompt_tokens']} prompt tokens, guard bound "
            tokens += f"{d['guard_prompt_tokens']}]"
        print(f"{r.path}: {what}{tokens}")
    return status

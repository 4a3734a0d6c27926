"""Issue 24: a black-box campaign against stock vLLM, triaged (30 minutes by default).

Starts vLLM 0.32 through ``scripts/upstreams/upstreams.py`` (unguarded, stock ``auto``
structured-output backend, the script's memory cap), runs ``schedguard fuzz run --target URL``
against it for ``--duration`` with a ``--restart-cmd`` (stop, then start on the same port) so a
crash is minimised and the campaign goes on, then ``schedguard fuzz report --format issue``, and
prints: requests, time to first finding, findings per hour, the triage groups (count,
representative size, the guard's verdict on the representative) and which of them match a
record in ``docs/findings/`` (by the triage signature; else by the culprit file). Progress goes
to stderr, the report to stdout (``--json``: JSON instead of the table).

    .venv/bin/python bench/vllm_campaign.py                      # 30 minutes, seed 1
    .venv/bin/python bench/vllm_campaign.py --quick --json       # ~25 s of fuzzing
    .venv/bin/python bench/vllm_campaign.py --target http://127.0.0.1:8000 --quick  # any server

Needs ``scripts/upstreams/upstreams.py setup vllm`` unless ``--target`` names a running server
(which is then neither started, stopped nor restarted unless ``--restart-cmd`` says how).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzz.findings_doc import DEFAULT_RECORDS, load_records  # noqa: E402
from fuzz.issue import guard_verdict  # noqa: E402
from fuzz.live import LiveRequest, shape_signature  # noqa: E402
from loadtests.upstream_corpus import SCRIPT, ScriptUpstream  # noqa: E402
from schedguard.servers import free_port  # noqa: E402

# vLLM takes 40-90 s to start here (more with the other core busy): the restart command and the
# campaign's wait for a dead server must outlast that, or one crash ends the campaign.
DEAD_WAIT_S = 600.0
QUICK_S = 25.0
# Beyond --duration: minimising the last finding, restarts, the report (the fuzz CLI's own
# clock bounds the campaign; this only keeps a wedged child from hanging the bench).
SLACK_S = 1200.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def vllm_set_up(python: str = sys.executable) -> bool:
    """Whether ``upstreams.py setup vllm`` has been run (its status says "set up")."""
    done = subprocess.run(
        [python, str(SCRIPT), "status", "vllm", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return False
    entry = (doc.get("upstreams") or {}).get("vllm") or {}
    return bool(entry.get("set_up"))


def restart_command(port: int, mem_limit_mb: int | None, ready_timeout_s: float) -> str:
    """Stop whatever serves ``port`` (a no-op when nothing does), then start vLLM there again,
    waiting up to ``ready_timeout_s`` for it (the script's own 300 s is too short for vLLM on
    this machine under load: a start took over 4 minutes beside a llama.cpp build)."""
    py, script = shlex.quote(sys.executable), shlex.quote(str(SCRIPT))
    cap = f" --mem-limit-mb {mem_limit_mb}" if mem_limit_mb is not None else ""
    return (
        f"{py} {script} stop vllm --port {port} --timeout 10; "
        f"{py} {script} start vllm --port {port} --host 127.0.0.1 --background "
        f"--ready-timeout {int(ready_timeout_s)}{cap}"
    )


def fuzz_argv(args: argparse.Namespace, url: str, out: Path, restart: str | None) -> list[str]:
    """The ``schedguard fuzz run`` command line of the campaign."""
    argv = [sys.executable, "-m", "schedguard", "fuzz", "run", "--target", url,
            "--duration", f"{args.duration:g}", "--seed", str(args.seed),
            "--jobs", str(args.jobs), "--out", str(out), "--pid", "auto",
            "--expect-findings", "--dead-wait", f"{args.dead_wait:g}",
            "--timeout", f"{args.timeout:g}", "--max-restarts", str(args.max_restarts),
            "--name", args.name]  # fmt: skip
    if restart:
        argv += ["--restart-cmd", restart]
    if args.server_log:
        argv += ["--server-log", str(args.server_log)]
    if args.corpus:
        argv += ["--corpus", str(args.corpus)]
    if args.minimise_s is not None:
        argv += ["--minimise-s", f"{args.minimise_s:g}"]
    if args.max_minimise_tests is not None:
        argv += ["--max-minimise-tests", str(args.max_minimise_tests)]
    return argv


def _culprit_file(signature: str) -> str | None:
    """``vllm/x.py`` of ``KeyError@vllm/x.py:fn`` (or of ``500@vllm/x.py``)."""
    if "@" not in signature:
        return None
    where = signature.split("@", 1)[1]
    return where.split(":", 1)[0] or None


def match_records(
    signature: str, body: Any, records: list[dict[str, Any]]
) -> tuple[str, list[str]]:
    """How a group relates to the records: ``known`` (a record names the same triage
    signature), ``same-shape`` (a record's body has the same fields beyond a plain chat as the
    group's representative: the same request class, whatever the server logged),
    ``same-file`` (a record's signature names the same culprit file: maybe the same bug, to be
    checked by hand) or ``new``; and the ids."""
    same = [str(r["id"]) for r in records if r.get("signature") == signature]
    if same:
        return "known", same
    if isinstance(body, dict):
        shape = shape_signature(body)
        alike = [
            str(r["id"])
            for r in records
            if isinstance(r.get("body"), dict) and shape_signature(r["body"]) == shape
        ]
        if alike:
            return "same-shape", alike
    culprit = _culprit_file(signature)
    near = [
        str(r["id"])
        for r in records
        if culprit and r.get("signature") and _culprit_file(str(r["signature"])) == culprit
    ]
    return ("same-file", near) if near else ("new", [])


def _body(rep: dict[str, Any]) -> Any:
    text = rep.get("input")
    return None if text is None else LiveRequest.from_input(text.encode("utf-8")).body


def _guard(rep: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """The guard's verdict (default policy, in front of this upstream) on the representative."""
    text = rep.get("input")
    if text is None:
        return None
    req = LiveRequest.from_input(text.encode("utf-8"))
    g = guard_verdict(req.to_bytes(), req.path, kind=kind)
    return {"allowed": g["allowed"], "code": g["code"]}


def summarise(
    record: dict[str, Any], records: list[dict[str, Any]], wall_s: float | None
) -> dict[str, Any]:
    """The bench's figures from the campaign's ``report.json``."""
    stats = (record.get("engines") or [{}])[0].get("stats") or {}
    duration = float(record.get("duration_s") or 0.0)
    hours = duration / 3600 if duration > 0 else None
    findings = record.get("findings") or []
    env = record.get("environment") or {}
    kind = env.get("kind") if isinstance(env.get("kind"), str) else None
    groups = []
    for g in record.get("groups") or []:
        rep = g["representative"]
        relation, ids = match_records(g["signature"], _body(rep), records)
        members = [f for f in findings if f.get("cause") in set(g.get("causes") or [])]
        first = min((float(f.get("found_after_s") or 0.0) for f in members), default=None)
        groups.append({
            "signature": g["signature"],
            "count": g["count"],
            "findings": g["findings"],
            "component": g.get("component"),
            "verdict": rep.get("verdict"),
            "first_found_s": first,
            "representative_bytes": rep.get("size_bytes"),
            "original_bytes": rep.get("original_size_bytes"),
            "minimised": rep.get("minimised"),
            "fresh_only": rep.get("fresh_only"),
            "representative": rep.get("input"),
            "guard": _guard(rep, kind),
            "records": relation,
            "record_ids": ids,
        })  # fmt: skip
    return {
        "target_url": record.get("target_url"),
        "seed": record.get("seed"),
        "jobs": record.get("jobs"),
        "duration_s": duration,
        "wall_s": None if wall_s is None else round(wall_s, 1),
        "execs": record.get("execs"),
        "execs_per_s": record.get("execs_per_s"),
        "fuzzing_requests_per_s": stats.get("fuzzing_requests_per_s"),
        "time_to_first_finding_s": record.get("time_to_first_finding_s"),
        "findings": len(findings),
        "findings_per_hour": round(len(findings) / hours, 1) if hours else None,
        "groups_per_hour": round(len(groups) / hours, 1) if hours else None,
        "restarts": stats.get("restarts"),
        "stopped": stats.get("stopped"),
        "statuses": stats.get("statuses"),
        "worst_latency_s": stats.get("worst_latency_s"),
        "rss_start_mb": _mb(stats.get("rss_start_bytes")),
        "rss_peak_mb": _mb(stats.get("rss_peak_bytes")),
        "server_version": env.get("server_version"),
        "groups": groups,
    }


def _mb(value: Any) -> float | None:
    return round(value / (1 << 20), 1) if isinstance(value, int | float) else None


def table(s: dict[str, Any]) -> str:
    ttff = s["time_to_first_finding_s"]
    lines = [
        f"target {s['target_url']} ({s['server_version']}), seed {s['seed']}, jobs {s['jobs']}",
        f"{s['execs']} requests in {s['duration_s']:.0f} s ({s['execs_per_s']}/s; "
        f"{s['fuzzing_requests_per_s']}/s while fuzzing), {s['restarts']} restarts, "
        f"stopped: {s['stopped'] or 'at the end of --duration'}",
        f"first finding after {'-' if ttff is None else f'{ttff:.1f} s'}; "
        f"{s['findings']} findings ({s['findings_per_hour']}/h), {len(s['groups'])} groups "
        f"({s['groups_per_hour']}/h)",
        "",
        "| group (signature) | verdict | met | first at | representative (from) | guard | record |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in s["groups"]:
        guard = g["guard"]
        gtext = (
            "-"
            if guard is None
            else ("admits" if guard["allowed"] else f"refuses `{guard['code']}`")
        )
        rec = g["records"] + (f" ({', '.join(g['record_ids'])})" if g["record_ids"] else "")
        first = "-" if g["first_found_s"] is None else f"{g['first_found_s']:.0f} s"
        lines.append(
            f"| `{g['signature']}` | {g['verdict']} | {g['count']} | {first} "
            f"| {g['representative_bytes']} B ({g['original_bytes']} B) | {gtext} | {rec} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0,
                        help="seconds of fuzzing (default: 1800)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_S:g} s of fuzzing, short minimisation (the smoke test)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="the campaign's seed (default: 1)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="parallel campaign workers (default: 2)")  # fmt: skip
    parser.add_argument("--port", type=int, default=None,
                        help="vLLM's port on 127.0.0.1 (default: a free one)")  # fmt: skip
    parser.add_argument("--mem-limit-mb", type=int, default=None,
                        help="vLLM's RLIMIT_AS per process (default: the upstream script's, 6144)")  # fmt: skip
    parser.add_argument("--target", default=None,
                        help="fuzz this running server instead of starting vLLM (not stopped)")  # fmt: skip
    parser.add_argument("--restart-cmd", default=None,
                        help="the campaign's restart command (default: the upstream script's "
                        "stop and start on the port; none with --target)")  # fmt: skip
    parser.add_argument("--server-log", type=Path, default=None,
                        help="with --target: the server's log (default: the upstream script's)")  # fmt: skip
    parser.add_argument("--corpus", type=Path, default=None,
                        help="the seed corpus (default: the package's payloads/)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="no answer within this long is a hang (default: 60)")  # fmt: skip
    parser.add_argument("--dead-wait", type=float, default=DEAD_WAIT_S,
                        help=f"wait for vLLM to start or restart this long (default: {DEAD_WAIT_S:g}: "
                        "40-90 s on a quiet machine, minutes on a loaded one)")  # fmt: skip
    parser.add_argument("--max-restarts", type=int, default=30,
                        help="restarts of the server at most (default: 30)")  # fmt: skip
    parser.add_argument("--minimise-s", type=float, default=None,
                        help="minimisation time per finding (default: the fuzz CLI's; 5 with "
                        "--quick)")  # fmt: skip
    parser.add_argument("--max-minimise-tests", type=int, default=None,
                        help="requests the minimiser may send per finding (default: the fuzz "
                        "CLI's; 40 with --quick)")  # fmt: skip
    parser.add_argument("--name", default="vllm-stock",
                        help="the target's name in the reports (default: vllm-stock)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="the campaign's directory (default: build/vllm_campaign, or "
                        "build/vllm_campaign-quick)")  # fmt: skip
    parser.add_argument("--records", type=Path, default=DEFAULT_RECORDS,
                        help="the findings records groups are matched with (default: "
                        "docs/findings)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--version", action="version", version="schedguard bench 1")
    parser.add_argument("--summarise", type=Path, default=None, metavar="DIR",
                        help="run nothing: summarise the campaign already in DIR (its "
                        "report.json and issues/), e.g. with records updated since")  # fmt: skip
    args = parser.parse_args(argv)
    records = load_records(args.records)
    if args.summarise is not None:
        out, code, wall, cmd = args.summarise, None, None, None
    else:
        ran = run(args)
        if ran is None:
            return 2
        out, code, wall, cmd = ran
    if not (out / "report.json").is_file():
        log(f"no campaign record in {out} (exit {code})")
        return 1
    record = json.loads((out / "report.json").read_text(encoding="utf-8"))
    summary = summarise(record, records, wall)
    summary["campaign_exit"] = code
    summary["out"] = str(out)
    summary["issues"] = sorted(str(p) for p in (out / "issues").glob("*.md"))
    summary["command"] = cmd
    print(json.dumps(summary, indent=2) if args.json else table(summary))
    return 0 if code in (0, None) else 1


def run(args: argparse.Namespace) -> tuple[Path, int, float, str] | None:
    """Start vLLM (unless --target), run the campaign, write the issue reports, stop vLLM;
    the campaign's directory, exit status, wall time and command (None: vLLM not set up)."""
    if args.quick:
        args.duration = min(args.duration, QUICK_S)
        args.minimise_s = 5.0 if args.minimise_s is None else args.minimise_s
        if args.max_minimise_tests is None:
            args.max_minimise_tests = 40
    out: Path = args.out or ROOT / "build" / (
        "vllm_campaign-quick" if args.quick else "vllm_campaign"
    )
    if out.exists():
        # A campaign's directory holds its own findings only (known causes are read from it).
        shutil.rmtree(out)
    out.mkdir(parents=True)
    upstream: ScriptUpstream | None = None
    if args.target:
        url, restart = args.target.rstrip("/"), args.restart_cmd
    else:
        if not vllm_set_up():
            log(f"vLLM is not set up: run {SCRIPT} setup vllm")
            return None
        port = args.port or free_port("127.0.0.1")
        upstream = ScriptUpstream(
            "vllm", port, mem_limit_mb=args.mem_limit_mb, ready_timeout_s=args.dead_wait
        )
        log(f"starting vLLM on 127.0.0.1:{port} (40-90 s)")
        t0 = time.monotonic()
        upstream.start()
        log(f"vLLM ready after {time.monotonic() - t0:.0f} s, pid {upstream.pid}")
        url = upstream.base_url
        # The campaign runs the restart command for at most --dead-wait seconds.
        restart = args.restart_cmd or restart_command(port, args.mem_limit_mb, args.dead_wait - 30)
    started = time.monotonic()
    cmd = fuzz_argv(args, url, out, restart)
    try:
        log("campaign: " + shlex.join(cmd))
        try:
            # Its own summary goes to stderr with the progress: stdout is this bench's report.
            done = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr,
                                  timeout=args.duration + SLACK_S, check=False)  # fmt: skip
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = -1
        wall = time.monotonic() - started
        if (out / "report.json").is_file():
            report = subprocess.run(
                [sys.executable, "-m", "schedguard", "fuzz", "report", str(out), "--format",
                 "issue"],
                cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if report.returncode != 0:
                log(f"fuzz report failed ({report.returncode}): {report.stderr[-2000:]}")
    finally:
        if upstream is not None:
            log("stopping vLLM")
            upstream.stop()
    return out, code, wall, shlex.join(cmd)


if __name__ == "__main__":
    raise SystemExit(main())

"""Campaign reports: report.json, JUnit XML, SARIF 2.1.0 and summary.md with an SVG plot.

All four are written from one :class:`CampaignReport`. The plot (best cost over time, log
scale) is SVG written by hand: no plotting library in the CI image.
"""

from __future__ import annotations

import hashlib
import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.engines import EngineResult
from fuzz.findings import Finding
from fuzz.judged import judged_against, judged_text
from fuzz.triage import triage
from fuzz.upstream_versions import versions_text

__all__ = [
    "SARIF_SCHEMA",
    "CampaignReport",
    "render_svg",
    "to_json",
    "to_junit",
    "to_sarif",
    "to_summary",
    "write_reports",
]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_NAME = "schedguard-fuzz"
TOOL_URI = "https://github.com/schedguard/schedguard"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CampaignReport:
    """Everything a campaign produced. ``fails_ci``: the target's kind fails CI on findings."""

    target: str
    kind: str
    description: str
    engine: str
    duration_s: float
    budgets: dict[str, Any]
    results: list[EngineResult]
    findings: list[Finding]
    fails_ci: bool
    seed: int | None = None
    jobs: int = 1
    source: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    # A live campaign's: the upstream's versions, model, flags, this tool's version and policy
    # hash (fuzz.live._environment), and the server's URL (the replay commands name it).
    environment: dict[str, Any] = field(default_factory=dict)
    target_url: str | None = None

    @property
    def execs(self) -> int:
        return sum(r.execs for r in self.results)

    @property
    def time_to_first_finding_s(self) -> float | None:
        """Campaign-relative seconds to the first finding (engines run one after another)."""
        offset = 0.0
        for r in self.results:
            if r.time_to_first_finding_s is not None:
                return offset + r.time_to_first_finding_s
            offset += r.duration_s
        return None

    @property
    def exit_status(self) -> int:
        return 1 if self.fails_ci and self.findings else 0

    def best_cost_over_time(self) -> list[tuple[float, float]]:
        """Campaign-relative ``(seconds, best cost so far)`` over all engines."""
        points: list[tuple[float, float]] = []
        offset = 0.0
        best = 0.0
        for r in self.results:
            for t, c in r.best_cost_over_time:
                best = max(best, c)
                points.append((offset + t, best))
            offset += r.duration_s
        return points


# ----------------------------------------------------------------------------------- JSON


def to_json(rep: CampaignReport) -> dict[str, Any]:
    return {
        "target": rep.target,
        "kind": rep.kind,
        "engine": rep.engine,
        "duration_s": round(rep.duration_s, 3),
        "execs": rep.execs,
        "execs_per_s": round(rep.execs / rep.duration_s, 1) if rep.duration_s > 0 else 0.0,
        "time_to_first_finding_s": _round(rep.time_to_first_finding_s),
        "seed": rep.seed,
        "jobs": rep.jobs,
        "budgets": rep.budgets,
        "fails_ci": rep.fails_ci,
        "exit_status": rep.exit_status,
        "engines": [
            {
                "engine": r.engine,
                "duration_s": round(r.duration_s, 3),
                "execs": r.execs,
                "coverage": r.coverage,
                "time_to_first_finding_s": _round(r.time_to_first_finding_s),
                "findings": len(r.findings),
                "best_cost": max((c for _, c in r.best_cost_over_time), default=0.0),
                **({"errors": r.extra["errors"]} if r.extra.get("errors") else {}),
                **({"stats": r.extra["stats"]} if r.extra.get("stats") else {}),
            }
            for r in rep.results
        ],
        "skipped_engines": rep.skipped,
        "target_url": rep.target_url,
        "environment": rep.environment,
        "findings": [_finding_json(rep, f) for f in rep.findings],
        "groups": [
            {**g.to_dict(), "representative": _finding_json(rep, g.representative)}
            for g in triage(rep.findings)
        ],
        "best_cost_over_time": [[round(t, 3), round(c, 4)] for t, c in rep.best_cost_over_time()],
    }


def _finding_json(rep: CampaignReport, f: Finding) -> dict[str, Any]:
    """A finding as the record keeps it, with what it was judged against (the budget and the
    clock that decided it, beside its wall and CPU time)."""
    return {
        **f.to_dict(),
        "wall_s": round(f.cost_after.time_s, 6),
        "cpu_s": _cpu_s(f),
        "judged": judged_against(f.outcome, rep.budgets),
    }


def _cpu_s(f: Finding) -> float | None:
    """The finding's CPU time: the input's own (in-process targets), else the live server's
    processes' CPU during the request (``--pid``), else None (not measured)."""
    if f.cost_after.cpu_s:
        return round(f.cost_after.cpu_s, 6)
    before, after = f.evidence.get("server_before"), f.evidence.get("server_after")
    if isinstance(before, dict) and isinstance(after, dict):
        return round(float(after["cpu_s"]) - float(before["cpu_s"]), 3)
    return None


def _cpu_text(f: Finding) -> str:
    cpu = _cpu_s(f)
    if cpu is None:
        return "-"
    return f"{cpu:.3f}" if f.cost_after.cpu_s else f"{cpu:.3f} (server)"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# ---------------------------------------------------------------------------------- JUnit


def to_junit(rep: CampaignReport) -> str:
    """One testsuite for the campaign: a testcase per engine run and one per finding (a
    failure when the target's kind fails CI; a passing, documented case otherwise)."""
    failures = len(rep.findings) if rep.fails_ci else 0
    cases = len(rep.results) + len(rep.findings)
    suite = ET.Element(
        "testsuite",
        name=f"schedguard-fuzz.{rep.target}",
        tests=str(cases),
        failures=str(failures),
        errors="0",
        skipped=str(len(rep.skipped)),
        time=f"{rep.duration_s:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (("target", rep.target), ("kind", rep.kind), ("engine", rep.engine)):
        ET.SubElement(props, "property", name=k, value=str(v))
    for r in rep.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"fuzz.{rep.target}",
            name=f"campaign[{r.engine}]",
            time=f"{r.duration_s:.3f}",
        )
        out = ET.SubElement(case, "system-out")
        out.text = f"execs={r.execs} coverage={r.coverage} findings={len(r.findings)}"
    for name, why in rep.skipped.items():
        case = ET.SubElement(
            suite, "testcase", classname=f"fuzz.{rep.target}", name=f"campaign[{name}]", time="0"
        )
        ET.SubElement(case, "skipped", message=why)
    for f in rep.findings:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"fuzz.{rep.target}",
            name=f"finding[{f.cause}]",
            time=f"{f.cost_after.time_s:.3f}",
        )
        text = _finding_text(f)
        if rep.fails_ci:
            fail = ET.SubElement(case, "failure", message=text, type=f.outcome.verdict)
            fail.text = json.dumps(f.to_dict(), indent=2)
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"expected on a {rep.kind} target: {text}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode")


def _finding_text(f: Finding) -> str:
    c = f.cost_after
    return (
        f"{f.outcome.verdict} ({f.cause}) with a {f.size_bytes}-byte input: "
        f"{c.busy_s:.3f} s, {c.peak_mem_bytes / (1 << 20):.1f} MiB, {c.steps} steps, "
        f"{c.output_tokens} output tokens; payload {f.path or '(not saved)'}"
    )


# ---------------------------------------------------------------------------------- SARIF

_RULES: dict[str, tuple[str, str]] = {
    "time": ("ResourceExhaustionTime", "An input crosses the wall-time budget or times out."),
    "memory": ("ResourceExhaustionMemory", "An input crosses the memory budget or the cap."),
    "budget:steps": ("ResourceExhaustionSteps", "An input crosses the expansion-step budget."),
    "budget:output_tokens": (
        "ResourceExhaustionTokens",
        "An input makes more output tokens than the budget.",
    ),
    "cost_per_byte": ("SuperLinearCost", "An input's cost per byte is above the threshold."),
    "crash": ("UnexpectedException", "An input raises an exception that is not a rejection."),
    "5xx": ("ServerError", "A live server answers an input with a 5xx."),
    "undercount": (
        "CostUnderCounted",
        "A request the guard admits costs the upstream more than the guard accounted.",
    ),
    "false_positive": (
        "BenignRefused",
        "The guard refuses a benign request that the upstream serves cheaply.",
    ),
}
# Cause families whose causes carry particulars after the first colon (one rule each).
_FAMILIES = ("crash", "5xx", "undercount", "false_positive")


def _rule_id(cause: str) -> str:
    family = cause.split(":", 1)[0]
    return family if family in _FAMILIES else cause


def to_sarif(rep: CampaignReport) -> dict[str, Any]:
    """SARIF 2.1.0: one run, a rule per cause family, a result per finding (``error`` when the
    target fails CI, ``warning`` for an expected finding on a vulnerable target)."""
    rules = [_sarif_rule(rid) for rid in sorted({_rule_id(f.cause) for f in rep.findings})]
    index = {r["id"]: i for i, r in enumerate(rules)}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": TOOL_NAME,
                        "informationUri": TOOL_URI,
                        "semanticVersion": "0.1.0",
                        "rules": rules,
                    }
                },
                "automationDetails": {"id": f"schedguard-fuzz/{rep.target}/{rep.engine}"},
                "originalUriBaseIds": {
                    "UPSTREAM": {
                        "description": {
                            "text": "the upstream server's installed package root "
                            f"({versions_text(rep.environment) or 'versions not captured'})"
                        }
                    }
                },
                "invocations": [
                    {
                        "executionSuccessful": True,
                        "properties": {
                            "execs": rep.execs,
                            "duration_s": round(rep.duration_s, 3),
                            "seed": rep.seed,
                        },
                    }
                ],
                "results": [_sarif_result(rep, f, index) for f in rep.findings],
            }
        ],
    }


def _sarif_rule(rid: str) -> dict[str, Any]:
    name, text = _RULES.get(rid, ("ResourceExhaustion", f"Fuzz finding: {rid}"))
    return {
        "id": f"fuzz/{rid}",
        "name": name,
        "shortDescription": {"text": text},
        "fullDescription": {"text": f"{text} Found by schedguard's fuzzers."},
        "defaultConfiguration": {"level": "error"},
        "helpUri": TOOL_URI,
    }


def _sarif_result(rep: CampaignReport, f: Finding, index: dict[str, int]) -> dict[str, Any]:
    rid = f"fuzz/{_rule_id(f.cause)}"
    result: dict[str, Any] = {
        "ruleId": rid,
        "ruleIndex": index[rid],
        "level": "error" if rep.fails_ci else "warning",
        "message": {"text": f"{rep.target}: {_finding_text(f)}"},
        "locations": [_sarif_location(rep, f)],
        "partialFingerprints": {
            "schedguardCause/v1": hashlib.sha256(f"{rep.target}:{f.cause}".encode()).hexdigest()[
                :32
            ]
        },
        "properties": {
            "target": rep.target,
            "engine": f.engine,
            "cause": f.cause,
            "size_bytes": f.size_bytes,
            "cost": f.cost_after.to_dict(),
            "cost_before_minimisation": f.cost_before.to_dict(),
            "judged": judged_against(f.outcome, rep.budgets),
            "seed": f.seed,
            "replay_command": f.replay_command,
            "occurrences": f.occurrences,
        },
    }
    if f.path:
        result["relatedLocations"] = [
            {
                "id": 1,
                "physicalLocation": {"artifactLocation": {"uri": _relative(f.path)}},
                "message": {"text": "the minimised input, as a payload file"},
            }
        ]
    return result


def _sarif_location(rep: CampaignReport, f: Finding) -> dict[str, Any]:
    """A live server's finding points at the upstream's component (a module of the upstream's
    package, from its stack or the request field: :mod:`fuzz.live._component`), relative to the
    ``UPSTREAM`` base (the upstream's installed package root), with a logical location naming
    the function when the stack gives one; an in-process finding at the crash frame or the
    target's entry point in this project."""
    component = f.evidence.get("component")
    if isinstance(component, str):
        function = f.evidence.get("function")
        name = component if not function else f"{component}:{function}"
        basis = f.evidence.get("basis") or "request field"
        return {
            "physicalLocation": {"artifactLocation": {"uri": component, "uriBaseId": "UPSTREAM"}},
            "logicalLocations": [
                {"fullyQualifiedName": name, "kind": "function" if function else "module"}
            ],
            "message": {"text": f"the upstream's component ({basis})"},
        }
    uri, line = _location(f, rep.source)
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
            "region": {"startLine": line},
        },
        "message": {"text": "where the cost is spent (target entry point or crash frame)"},
    }


def _location(f: Finding, source: str) -> tuple[str, int]:
    where = f.outcome.where or ""
    parts = where.split(":")
    if f.cause.startswith("crash:") and len(parts) >= 3 and parts[1].isdigit():
        path = parts[0]
        if (_PROJECT_ROOT / path).is_file():
            return path, int(parts[1])
    return source or "fuzz/targets/__init__.py", 1


def _relative(path: str) -> str:
    p = Path(path).resolve()
    try:
        return p.relative_to(_PROJECT_ROOT).as_posix()
    except ValueError:
        return p.as_uri()


# ------------------------------------------------------------------------------- summary


def render_svg(points: list[tuple[float, float]], duration_s: float, title: str) -> str:
    """Best cost (log scale) over time as a step line, with axes, ticks and labels."""
    w, h = 640, 320
    left, right, top, bottom = 70, 20, 40, 50
    pw, ph = w - left - right, h - top - bottom
    pts = [(t, c) for t, c in points if c > 0]
    t_max = max([duration_s, *(t for t, _ in pts)]) or 1.0
    c_min = min((c for _, c in pts), default=0.1)
    c_max = max((c for _, c in pts), default=1.0)
    lo = math.floor(math.log10(max(c_min, 1e-3)))
    hi = max(lo + 1, math.ceil(math.log10(max(c_max, 1e-3))))

    def x(t: float) -> float:
        return left + pw * (t / t_max)

    def y(c: float) -> float:
        v = (math.log10(max(c, 10.0**lo)) - lo) / (hi - lo)
        return top + ph * (1 - v)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="13">{_esc(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
    ]
    for e in range(lo, hi + 1):
        yy = y(10.0**e)
        out.append(
            f'<line x1="{left - 4}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">1e{e}</text>')
    for i in range(6):
        t = t_max * i / 5
        xx = x(t)
        out.append(
            f'<line x1="{xx:.1f}" y1="{top + ph}" x2="{xx:.1f}" y2="{top + ph + 4}" '
            'stroke="black"/>'
        )
        out.append(f'<text x="{xx:.1f}" y="{top + ph + 16}" text-anchor="middle">{t:.0f}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">seconds</text>')
    out.append(
        f'<text x="14" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + ph / 2})">best cost (ms-equivalents, log)</text>'
    )
    if pts:
        path = [f"M{x(pts[0][0]):.1f},{y(pts[0][1]):.1f}"]
        prev = pts[0][1]
        for t, c in pts[1:]:
            path.append(f"H{x(t):.1f}")
            if c != prev:
                path.append(f"V{y(c):.1f}")
            prev = c
        path.append(f"H{x(t_max):.1f}")
        out.append(f'<path d="{"".join(path)}" fill="none" stroke="#c0392b" stroke-width="2"/>')
    else:
        out.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle">no data</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_summary(rep: CampaignReport, svg_name: str = "best_cost.svg") -> str:
    ttff = rep.time_to_first_finding_s
    lines = [
        f"# Fuzz campaign: `{rep.target}` ({rep.kind})",
        "",
        f"{rep.description}",
        "",
        "| | |",
        "|---|---|",
        f"| engine | {rep.engine} |",
        f"| duration | {rep.duration_s:.1f} s |",
        f"| executions | {rep.execs:,} ({rep.execs / max(rep.duration_s, 1e-9):,.0f}/s) |",
        f"| time to first finding | {'-' if ttff is None else f'{ttff:.2f} s'} |",
        f"| findings | {len(rep.findings)} |",
        f"| seed | {rep.seed} (`--seed {rep.seed}` repeats the run's choices) |",
        f"| CI | {'FAIL' if rep.exit_status else 'pass'} "
        f"({'findings fail CI' if rep.fails_ci else 'findings are expected'}) |",
        "",
        f"![best cost over time]({svg_name})",
        "",
    ]
    if rep.results:
        lines += [
            "| engine | execs | coverage | findings | first finding (s) |",
            "|---|---|---|---|---|",
        ]
        for r in rep.results:
            tf = "-" if r.time_to_first_finding_s is None else f"{r.time_to_first_finding_s:.2f}"
            lines.append(f"| {r.engine} | {r.execs:,} | {r.coverage} | {len(r.findings)} | {tf} |")
        lines.append("")
    for r in rep.results:
        lines += _stats_lines(r.extra.get("stats"))
    for name, why in rep.skipped.items():
        lines.append(f"- engine `{name}` skipped: {why}")
    if rep.skipped:
        lines.append("")
    if rep.findings:
        lines += [
            "| cause | verdict | bytes (found -> minimised) | wall (s) | CPU (s) | judged against "
            "| peak MiB | steps | payload |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for f in rep.findings:
            c = f.cost_after
            judged = judged_text(judged_against(f.outcome, rep.budgets)).replace("|", "/")
            lines.append(
                f"| `{f.cause}` | {f.outcome.verdict} | {len(f.original)} -> {f.size_bytes} "
                f"| {c.time_s:.3f} | {_cpu_text(f)} | {judged} "
                f"| {c.peak_mem_bytes / (1 << 20):.1f} | {c.steps} "
                f"| `{_relative(f.path) if f.path else '-'}` |"
            )
        lines.append("")
        lines += ["Replay each finding:", ""]
        for f in rep.findings:
            lines.append(f"- `{f.cause}`: `{f.replay_command or '(not saved: no file to replay)'}`")
        lines.append("")
        groups = triage(rep.findings)
        lines += [
            "| group (cause signature) | times met | findings | component |",
            "|---|---|---|---|",
        ]
        for g in groups:
            sig = g.signature.replace("|", "/")
            lines.append(f"| `{sig}` | {g.count} | {len(g.findings)} | {g.component or '-'} |")
        lines.append("")
    lines.append(f"Budgets per input: `{json.dumps(rep.budgets)}`")
    return "\n".join(lines) + "\n"


def _stats_lines(stats: Any) -> list[str]:
    """A live campaign's figures (requests, rate, answers, memory), as a table."""
    if not isinstance(stats, dict) or not stats:
        return []
    lines = ["| live campaign | |", "|---|---|"]
    for key, value in stats.items():
        if value is None or value == {}:
            continue
        if isinstance(value, dict):
            value = ", ".join(
                f"{k}: {v}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            )
        lines.append(f"| {key} | {str(value).replace('|', '/')} |")
    return [*lines, ""]


def write_reports(rep: CampaignReport, out_dir: Path) -> dict[str, Path]:
    """Write report.json, junit.xml, report.sarif, summary.md and best_cost.svg."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "report.json",
        "junit": out_dir / "junit.xml",
        "sarif": out_dir / "report.sarif",
        "summary": out_dir / "summary.md",
        "svg": out_dir / "best_cost.svg",
    }
    paths["json"].write_text(json.dumps(to_json(rep), indent=2) + "\n", encoding="utf-8")
    paths["junit"].write_text(to_junit(rep), encoding="utf-8")
    paths["sarif"].write_text(json.dumps(to_sarif(rep), indent=2) + "\n", encoding="utf-8")
    title = f"{rep.target}: best cost over time ({rep.engine})"
    paths["svg"].write_text(
        render_svg(rep.best_cost_over_time(), rep.duration_s, title), encoding="utf-8"
    )
    paths["summary"].write_text(to_summary(rep, paths["svg"].name), encoding="utf-8")
    return paths

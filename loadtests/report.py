"""The load test's report: one self-contained HTML file (``report.html``) an SRE opens alone.

It shows, from a run's output directory (``slo.json`` or ``report.json``, and
``timeline.json``):

- the verdict of every SLO (threshold, measured, pass/fail/skip);
- the traffic in numbers (requests, latency percentiles, attacks, peak RSS);
- over time: benign latency p50/p99, time to first token and inter-token latency, each with
  the share of requests that attacked behind it; the guard's rejections by code (its
  ``/metrics``) and the attacks' answers as the client saw them; guard and upstream RSS with
  their SLO lines;
- attacks by THREATS class, what got through, benign failures, the servers, links to the
  other files;
- with ``compare`` (e.g. a ``--no-guard`` run's directory): the same side by side, the SLO and
  numbers tables with a column per run and each chart beside its counterpart on the same scales.

Charts are SVG drawn here (:mod:`loadtests.svgchart`); the page has no script and loads
nothing (styles inline), so it opens offline from a file. Plain Python: no locust import.

    python -m loadtests.report OUT_DIR [--compare OTHER_DIR]     # or schedguard load --report-only
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import slo
from loadtests.svgchart import Band, Bars, HLine, Line, Marker, Point, bar_chart, line_chart
from loadtests.timeline import FLOOD_SERVED

__all__ = [
    "CHARTS",
    "Run",
    "RunSeries",
    "build_html",
    "load_run",
    "main",
    "series",
    "write_report",
]

# Chart ids, in page order (a compared run's are these + "-compare").
CHARTS = (
    "benign-latency",
    "ttft",
    "itl",
    "rss",
    "guard-rejections",
    "attack-answers",
)
REPORT_FILE = "report.html"
_CHART_W, _CHART_H = 640, 250
_P50, _P99 = "#5aa9e6", "#0b3d91"
_SHARE = "#f28e2b"
_ERRORS = "#c62828"
_SLO = "#b2182b"
_RSS = {"guard": "#2b6cb0", "upstream": "#dd6b20"}
_CODE_COLORS = (
    "#4c78a8",
    "#54a24b",
    "#b279a2",
    "#72b7b2",
    "#eeca3b",
    "#9d755d",
    "#f58518",
    "#79706e",
    "#2f4b7c",
)
_SERVED = ("#d62728", "#a50f15", "#ef3b2c")
_FLOOD_SERVED = "#f4a3a3"
_NO_ANSWER = ("#222222", "#666666", "#999999")
_OTHER = "#c7c7c7"
_TOP_CODES = 10
_MODE_LABELS = {
    "guard": "with the guard",
    "no-guard": "without the guard (--no-guard)",
    "host": "against --host",
}


# ------------------------------------------------------------------------------ input


@dataclass
class Run:
    """One run's files. ``report`` is ``report.json`` (the SLO report plus the mode, servers
    and files) or ``slo.json``; ``timeline`` is ``timeline.json`` when the run wrote one."""

    directory: Path
    report: dict[str, Any]
    timeline: dict[str, Any] | None
    label: str

    @property
    def numbers(self) -> dict[str, Any]:
        return dict(self.report.get("numbers") or {})

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list(self.report.get("checks") or [])

    @property
    def passed(self) -> bool:
        return all(c.get("status") != "fail" for c in self.checks)

    @property
    def mode(self) -> str:
        return str(self.report.get("mode") or "")


def load_run(path: str | Path, label: str | None = None) -> Run:
    """The run in directory ``path`` (its ``report.json``, else ``slo.json``), or the run whose
    ``report.json`` / ``slo.json`` is ``path``."""
    p = Path(path)
    if p.is_dir():
        directory = p
        candidates = [p / "report.json", p / "slo.json"]
    else:
        directory = p.parent
        candidates = [p]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{path}: no report.json or slo.json (an output dir of a run)")
    report = json.loads(found.read_text())
    if not isinstance(report, dict) or "checks" not in report:
        raise ValueError(f"{found}: not a schedguard load report (no checks)")
    timeline_path = directory / "timeline.json"
    timeline = json.loads(timeline_path.read_text()) if timeline_path.is_file() else None
    mode = str(report.get("mode") or "")
    return Run(directory, report, timeline, label or _MODE_LABELS.get(mode, directory.name))


# ------------------------------------------------------------------------------ series


@dataclass
class RunSeries:
    """A run's charts' data, in seconds since the test started."""

    duration: float
    step: float  # seconds between latency points
    span: float  # their trailing window
    bar_width: float  # seconds per bar of the rate charts
    latency: dict[str, dict[str, list[Point]]] = field(default_factory=dict)
    attack_share: list[Point] = field(default_factory=list)
    benign_error_share: list[Point] = field(default_factory=list)  # BENIGN and LOOKALIKE
    rss: dict[str, list[Point]] = field(default_factory=dict)
    peak_rss: dict[str, float] = field(default_factory=dict)  # the kernel's high-water mark
    died: dict[str, float] = field(default_factory=dict)
    bar_starts: list[float] = field(default_factory=list)
    bar_seconds: list[float] = field(default_factory=list)  # each bar's length within the run
    rejections: dict[str, list[float]] = field(default_factory=dict)  # code -> per second
    answers: dict[str, list[float]] = field(default_factory=dict)  # outcome -> per second
    has_timeline: bool = False


def _quantile(hist: Mapping[int, int], q: float) -> float | None:
    return slo.percentile(hist, q)


def _windows(duration: float) -> tuple[float, float, float]:
    step = float(max(1, math.ceil(duration / 120)))
    span = float(min(30, max(3, math.ceil(duration / 10))))
    bar = next((float(w) for w in (5, 10, 15, 30, 60, 120, 300, 600) if duration / w <= 40), 900.0)
    return step, max(span, step), bar


def series(run: Run) -> RunSeries:
    """The time series the charts draw, from the run's ``timeline.json`` (RSS falls back to
    the SLO report's ``rss_series_mb`` for a run without one)."""
    numbers = run.numbers
    tl = run.timeline or {}
    duration = float(tl.get("duration_s") or numbers.get("duration_s") or 0.0)
    duration = max(duration, 1.0)
    step, span, bar = _windows(duration)
    out = RunSeries(duration, step, span, bar, has_timeline=bool(tl))
    buckets: dict[int, dict[str, dict[str, int]]] = {
        int(k): v for k, v in (tl.get("buckets") or {}).items()
    }
    last = math.ceil(duration)
    points = [step * i for i in range(1, int(last // step) + 1)]
    if not points or points[-1] < duration:
        points.append(float(last))

    def window(t: float) -> range:
        return range(math.floor(t - span), math.ceil(t))

    for kind in ("BENIGN", "TTFT", "ITL"):
        p50: list[Point] = []
        p99: list[Point] = []
        for t in points:
            hist: dict[int, int] = {}
            for s in window(t):
                for ms, n in (buckets.get(s, {}).get(f"lat {kind}") or {}).items():
                    hist[int(ms)] = hist.get(int(ms), 0) + n
            p50.append((t, _quantile(hist, 0.5)))
            p99.append((t, _quantile(hist, 0.99)))
        out.latency[kind] = {"p50": p50, "p99": p99}
    for t in points:
        attack = total = benign = failed = 0
        for s in window(t):
            b = buckets.get(s, {})
            for kind in ("BENIGN", "LOOKALIKE", "ATTACK"):
                counts = b.get(f"req {kind}") or {}
                n = sum(counts.values())
                total += n
                if kind == "ATTACK":
                    attack += n
                else:
                    benign += n
                    failed += counts.get("fail", 0)
        out.attack_share.append((t, attack / total if total else None))
        out.benign_error_share.append((t, failed / benign if benign else None))

    rss_source = tl.get("rss_mb") or numbers.get("rss_series_mb") or {}
    for name, pts in rss_source.items():
        out.rss[name] = [(float(t), float(v)) for t, v in pts if -1.0 <= float(t) <= duration + 5]
    out.died = {k: float(v) for k, v in (tl.get("died_s") or {}).items()}
    for name in ("guard", "upstream"):
        peak = numbers.get(f"{name}_peak_rss_mb")
        if peak is not None:
            out.peak_rss[name] = float(peak)

    # A last piece shorter than a tenth of a bar joins the one before; rates are per second of
    # each bar's own length (the last one may be shorter or longer than the others).
    n_bars = max(1, math.ceil(duration / bar - 0.1))
    out.bar_starts = [i * bar for i in range(n_bars)]
    widths = [bar] * (n_bars - 1) + [max(1.0, duration - (n_bars - 1) * bar)]
    out.bar_seconds = widths
    out.rejections = _rates_from_counters(tl.get("guard_rejections") or [], bar, widths)
    answers: dict[str, list[float]] = {}
    for s, b in buckets.items():
        i = min(max(0, int(s // bar)), n_bars - 1)
        for label, n in (b.get("outcome") or {}).items():
            answers.setdefault(label, [0.0] * n_bars)[i] += n / widths[i]
    out.answers = answers
    return out


def _rates_from_counters(
    samples: Sequence[Sequence[Any]], width: float, seconds: Sequence[float]
) -> dict[str, list[float]]:
    """Per-second rates per bar from cumulative counters sampled at times ``t``: each
    increase goes to the bar of the sample that first showed it (it happened since the sample
    before, at most a scrape interval earlier: never drawn before it happened). Increases seen
    past the last bar go into it; those seen before the run's start are dropped."""
    rates: dict[str, list[float]] = {}
    n_bars = len(seconds)
    for (_, before), (b, after) in itertools.pairwise(samples):
        if float(b) < 0:
            continue
        i = min(int(float(b) // width), n_bars - 1)
        for code, total in after.items():
            delta = float(total) - float(before.get(code, 0.0))
            if delta > 0:
                rates.setdefault(code, [0.0] * n_bars)[i] += delta / seconds[i]
    return rates


# ------------------------------------------------------------------------------ colours


def _code_of(label: str) -> str:
    """The error code in an answer label (``429 rate_limited_tokens`` -> ``rate_limited...``)."""
    head, _, rest = label.partition(" ")
    return rest if head.isdigit() and rest else label


def _colours(runs: Sequence[RunSeries]) -> dict[str, str]:
    """One colour per code across every chart and run: the most frequent codes get the
    palette, served answers reds, missing answers greys, the rest 'other'."""
    totals: dict[str, float] = {}
    for rs in runs:
        for code, row in rs.rejections.items():
            totals[code] = totals.get(code, 0.0) + sum(row)
        for label, row in rs.answers.items():
            totals[_code_of(label)] = totals.get(_code_of(label), 0.0) + sum(row)
    colours: dict[str, str] = {}
    served = iter(_SERVED)
    missing = iter(_NO_ANSWER)
    palette = iter(_CODE_COLORS)
    for code, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])):
        if code == FLOOD_SERVED:
            colours[code] = _FLOOD_SERVED
        elif code[:1] == "2":
            colours[code] = next(served, _SERVED[-1])
        elif code.startswith("no answer"):
            colours[code] = next(missing, _NO_ANSWER[-1])
        elif code[:1] == "5":
            colours[code] = "#8c2d04"
        else:
            colours[code] = next(palette, _OTHER)
    return colours


def _stacks(
    rows: Mapping[str, Sequence[float]], colours: Mapping[str, str], key: Callable[[str], str]
) -> list[tuple[str, str, list[float]]]:
    """The rows as bar stacks, biggest first; codes without a colour of their own merged into
    'other'."""
    named: list[tuple[str, str, list[float]]] = []
    other: list[float] | None = None
    for label, row in sorted(rows.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
        colour = colours.get(key(label), _OTHER)
        if colour == _OTHER:
            other = [a + b for a, b in zip(other, row, strict=True)] if other else list(row)
        else:
            named.append((label, colour, list(row)))
    if other is not None:
        named.append(("other", _OTHER, other))
    return named


# ------------------------------------------------------------------------------ HTML


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;
 background:#f6f7f9}
main{max-width:1360px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.sub{color:#555;margin:0}
.verdict{display:inline-block;padding:2px 12px;border-radius:6px;color:#fff;font-size:18px;
 vertical-align:3px;margin-left:8px}
.verdict.pass{background:#1a7f37}.verdict.fail{background:#c62828}
table{border-collapse:collapse;background:#fff;margin:4px 0 8px;min-width:50%}
th,td{border:1px solid #d8dbe0;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{font-weight:700;text-transform:uppercase;white-space:nowrap}
.status.pass{color:#1a7f37}.status.fail{color:#c62828}.status.skip{color:#888}
tr.fail td{background:#fdecea}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #d8dbe0;border-radius:6px;padding:10px 12px}
figcaption{font-weight:600;margin-bottom:2px}
figcaption .who{font-weight:400;color:#555}
.note{color:#555;font-size:12.5px;margin:0 0 4px;min-height:3.9em}
svg.chart{display:block;width:100%;height:auto}
.legend{list-style:none;padding:0;margin:4px 0 0;font-size:12.5px;display:flex;flex-wrap:wrap;
 gap:2px 14px}
.legend i{display:inline-block;width:14px;height:10px;margin-right:5px;border-radius:2px;
 vertical-align:-1px}
.legend i.dash{height:0;border-top:2px dashed;border-radius:0;vertical-align:3px}
details{margin:6px 0}code{font-size:12.5px}
.cols{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
footer{color:#777;font-size:12px;margin-top:30px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):,.0f} ms"


def _mb(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):,.1f} MB"


def _status(status: str) -> str:
    return f'<span class="status {_e(status)}">{_e(status)}</span>'


def _slo_table(runs: Sequence[Run]) -> str:
    names: list[str] = []
    for run in runs:
        names += [c["name"] for c in run.checks if c["name"] not in names]
    by_run = [{c["name"]: c for c in run.checks} for run in runs]
    head = "<tr><th>SLO</th><th>threshold</th>" + "".join(
        f"<th>measured{_who(run, runs)}</th><th>verdict{_who(run, runs)}</th>" for run in runs
    )
    rows = [head + "</tr>"]
    for name in names:
        first = next(checks[name] for checks in by_run if name in checks)
        own = by_run[0].get(name)
        cls = own["status"] if own else "skip"
        cells = [f"<td>{_e(name)}</td><td>{_e(first['threshold'])}</td>"]
        for checks in by_run:
            c = checks.get(name)
            if c is None:
                cells.append('<td>-</td><td><span class="status skip">-</span></td>')
            else:
                cells.append(f"<td>{_e(c['measured'])}</td><td>{_status(c['status'])}</td>")
        rows.append(f'<tr class="{_e(cls)}" data-slo="{_e(name)}">' + "".join(cells) + "</tr>")
    return '<table class="slo" id="slo-table">' + "".join(rows) + "</table>"


def _who(run: Run, runs: Sequence[Run]) -> str:
    return f"<br><span class='who'>{_e(run.label)}</span>" if len(runs) > 1 else ""


def _numbers_rows(n: Mapping[str, Any]) -> list[tuple[str, str]]:
    slopes = n.get("rss_slope_mb_per_min") or {}
    rows = [
        ("duration", f"{n.get('duration_s', 0)} s"),
        (
            "benign requests",
            f"{n.get('benign_requests', 0)} ({n.get('benign_rps', 0)}/s), "
            f"{n.get('benign_failures', 0)} failed",
        ),
        (
            "benign latency p50 / p95 / p99",
            f"{_ms(n.get('benign_p50_ms'))} / {_ms(n.get('benign_p95_ms'))} / "
            f"{_ms(n.get('benign_p99_ms'))}",
        ),
        (
            "time to first token p50 / p99",
            f"{_ms(n.get('ttft_p50_ms'))} / {_ms(n.get('ttft_p99_ms'))}",
        ),
        (
            "inter-token latency p50 / p99",
            f"{_ms(n.get('itl_p50_ms'))} / {_ms(n.get('itl_p99_ms'))}",
        ),
        (
            "benign look-alikes",
            f"{n.get('lookalike_requests', 0)}, {n.get('lookalike_failures', 0)} failed",
        ),
        (
            "attacks",
            f"{n.get('attack_requests', 0)} sent, {n.get('attack_rejected', 0)} rejected; "
            f"{float(n.get('attack_share_of_requests') or 0):.0%} of requests",
        ),
        ("guard peak RSS", _mb(n.get("guard_peak_rss_mb"))),
        ("upstream peak RSS", _mb(n.get("upstream_peak_rss_mb"))),
        ("upstream at the end", str(n.get("upstream_status") or "-")),
    ]
    for name, slope in sorted(slopes.items()):
        rows.append((f"{name} RSS slope", "n/a" if slope is None else f"{slope:+.2f} MB/min"))
    return rows


def _numbers_table(runs: Sequence[Run]) -> str:
    per_run = [dict(_numbers_rows(run.numbers)) for run in runs]
    labels = [label for label, _ in _numbers_rows(runs[0].numbers)]
    for rows in per_run[1:]:
        labels += [k for k in rows if k not in labels]
    head = "<tr><th></th>" + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>"
    body = "".join(
        f"<tr><th>{_e(label)}</th>"
        + "".join(f"<td>{_e(rows.get(label, '-'))}</td>" for rows in per_run)
        + "</tr>"
        for label in labels
    )
    return f'<table class="numbers" id="numbers-table">{head}{body}</table>'


def _run_line(run: Run) -> str:
    n = run.numbers
    target = n.get("target") or {}
    tl = run.timeline or {}
    parts = [run.label]
    if target.get("upstream_profile") and target.get("upstream_profile") != "any":
        parts.append(f"{target['upstream_profile']} reference scheduler upstream")
    if target.get("shape"):
        parts.append(f"{target['shape']} shape")
    if target.get("users"):
        share = float(target.get("attack_share") or 0.0)
        users = int(target["users"])
        attackers = round(users * share)
        parts.append(f"{users} users ({users - attackers} benign, {attackers} attacking)")
    parts.append(f"{n.get('duration_s', 0)} s of load")
    if tl.get("t0"):
        started = dt.datetime.fromtimestamp(float(tl["t0"]), dt.UTC)
        parts.append(f"started {started:%Y-%m-%d %H:%M:%S} UTC")
    if target.get("host"):
        parts.append(f"target {target['host']}")
    if target.get("upstream_kind") and target.get("upstream_kind") != "reference":
        parts.append(f"{target['upstream_kind']} upstream serving {target.get('model')}")
    memory = target.get("memory_from") or {}
    known = [f"{name} from {where}" for name, where in sorted(memory.items()) if where]
    if known:
        parts.append("memory: " + ", ".join(known))
    return ", ".join(_e(p) for p in parts)


def _legend(items: Sequence[tuple[str, str, bool]]) -> str:
    return (
        '<ul class="legend">'
        + "".join(
            f'<li><i class="dash" style="border-color:{c}"></i>{_e(label)}</li>'
            if dashed
            else f'<li><i style="background:{c}"></i>{_e(label)}</li>'
            for label, c, dashed in items
        )
        + "</ul>"
    )


@dataclass
class _Chart:
    id: str
    title: str
    note: str
    svg: str
    legend: str


def _latency_chart(
    rs: RunSeries,
    kind: str,
    chart_id: str,
    title: str,
    y_max: float,
    x_max: float,
    p99_slo: float | None,
) -> _Chart:
    lat = rs.latency.get(kind, {})
    lines = [
        Line("p50", _P50, lat.get("p50", [])),
        Line("p99", _P99, lat.get("p99", [])),
    ]
    hlines = []
    legend = [("p50", _P50, False), ("p99", _P99, False)]
    if p99_slo is not None:
        hlines.append(HLine(f"p99 SLO {p99_slo:,.0f} ms", _SLO, p99_slo))
        legend.append(("p99 SLO", _SLO, True))
    bands = []
    if any(v is not None for _, v in rs.attack_share):
        bands.append(Band("share of requests attacking", _SHARE, rs.attack_share))
        legend.append(("share of requests attacking (right axis)", _SHARE, False))
    if any(v for _, v in rs.benign_error_share):
        errors = Band("share of benign requests failing", _ERRORS, rs.benign_error_share, 0.35)
        bands.append(errors)
        legend.append(("share of benign requests failing (right axis)", _ERRORS, False))
    markers = [Marker(f"{k} gone", "#c62828", t) for k, t in sorted(rs.died.items())]
    svg = line_chart(
        chart_id,
        title,
        lines=lines,
        x_max=x_max,
        y_unit="ms",
        y_max=y_max,
        bands=bands,
        hlines=hlines,
        markers=markers,
        width=_CHART_W,
        height=_CHART_H,
        empty_text="no data" if rs.has_timeline else "no timeline.json in this run",
    )
    note = (
        f"p50 and p99 of the successful requests over a trailing {rs.span:g} s window, a point "
        f"every {rs.step:g} s; shaded: the share of requests that attacked"
        + (", and of benign requests that failed." if len(bands) > 1 else ".")
    )
    return _Chart(chart_id, title, note, svg, _legend(legend))


def _max_of(points: Sequence[Point]) -> float:
    return max([v for _, v in points if v is not None] or [0.0])


def _charts(
    rs: RunSeries,
    run: Run,
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
    colours: Mapping[str, str],
) -> list[_Chart]:
    th = run.report.get("thresholds") or {}
    return [
        *_latency_charts(rs, th, suffix, scales, x_max),
        _rss_chart(rs, th, suffix, scales, x_max),
        _rejections_chart(rs, run, suffix, scales, x_max, colours),
        _answers_chart(rs, suffix, scales, x_max, colours),
    ]


def _latency_charts(
    rs: RunSeries,
    th: Mapping[str, Any],
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
) -> list[_Chart]:
    """Benign latency (with its p99 SLO when that fits the chart), time to first token, ITL."""
    p99_slo: float | None = None if th.get("p99_ms") is None else float(th["p99_ms"])
    out = []
    benign_top = scales["benign-latency"]
    show_slo = p99_slo is not None and p99_slo <= 1.5 * benign_top
    out.append(
        _latency_chart(
            rs,
            "BENIGN",
            f"benign-latency{suffix}",
            "Benign latency (full response)",
            max(benign_top, p99_slo if p99_slo is not None and show_slo else 0.0) * 1.1,
            x_max,
            p99_slo if show_slo else None,
        )
    )
    if p99_slo is not None and not show_slo:
        out[-1].note += f" The p99 SLO ({p99_slo:,.0f} ms) is above the chart."
    out.append(
        _latency_chart(
            rs,
            "TTFT",
            f"ttft{suffix}",
            "Time to first token (streams)",
            scales["ttft"] * 1.1,
            x_max,
            None,
        )
    )
    out.append(
        _latency_chart(
            rs,
            "ITL",
            f"itl{suffix}",
            "Inter-token latency (mean gap per stream)",
            scales["itl"] * 1.1,
            x_max,
            None,
        )
    )
    return out


def _rss_chart(
    rs: RunSeries,
    th: Mapping[str, Any],
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
) -> _Chart:
    """The guard's and the upstream's RSS, their peaks between samples, their SLOs, deaths."""
    lines, hlines, legend, off_chart = [], [], [], []
    rss_top = scales["rss"]
    for name in ("guard", "upstream"):
        colour = _RSS[name]
        if rs.rss.get(name):
            lines.append(Line(f"{name} RSS", colour, rs.rss[name]))
            legend.append((f"{name} RSS", colour, False))
        peak = rs.peak_rss.get(name)
        if peak is not None and peak > 1.1 * _max_of(rs.rss.get(name, [])):
            # A spike between two samples (a process killed by its memory cap) still shows.
            hlines.append(HLine(f"{name} peak {peak:,.0f} MB", colour, peak, dash="2 3"))
            legend.append((f"{name} peak (high-water mark, between samples)", colour, True))
        limit = th.get(f"max_{name}_rss_mb")
        if limit is None or not rs.rss.get(name):
            continue
        if float(limit) <= 2 * scales["rss"]:  # a line far above the data would flatten it
            hlines.append(HLine(f"{name} SLO {float(limit):,.0f} MB", colour, float(limit)))
            legend.append((f"{name} peak RSS SLO", colour, True))
            rss_top = max(rss_top, float(limit))
        else:
            off_chart.append(f"{name} {float(limit):,.0f} MB")
    markers = [Marker(f"{k} gone", "#c62828", t) for k, t in sorted(rs.died.items())]
    rss_note = "Sampled every second by the load generator (psutil); dashed: peak RSS SLOs."
    if off_chart:
        rss_note += " Above the chart: the SLO of " + ", ".join(off_chart) + "."
    return _Chart(
        f"rss{suffix}",
        "Memory (RSS, process and children)",
        rss_note,
        line_chart(
            f"rss{suffix}",
            "Memory (RSS)",
            lines=lines,
            x_max=x_max,
            y_unit="MB",
            y_max=rss_top * 1.1,
            hlines=hlines,
            markers=markers,
            width=_CHART_W,
            height=_CHART_H,
            empty_text="no RSS: the servers' pids are unknown (--host)",
        ),
        _legend(legend),
    )


def _rejections_chart(
    rs: RunSeries,
    run: Run,
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
    colours: Mapping[str, str],
) -> _Chart:
    """The guard's rejections per second by error code, stacked bars."""
    bars = Bars(rs.bar_starts, rs.bar_width, _stacks(rs.rejections, colours, lambda c: c))
    totals = {code: _count(row, rs.bar_seconds) for code, row in rs.rejections.items()}
    return _Chart(
        f"guard-rejections{suffix}",
        "Guard rejections by code",
        "From the guard's /metrics (schedguard_guard_rejections_total), each counted at "
        f"the scrape that first showed it; per second over {rs.bar_width:g} s bars.",
        bar_chart(
            f"guard-rejections{suffix}",
            "Guard rejections by code",
            bars=bars,
            x_max=x_max,
            y_unit="rejections/s",
            y_max=scales["rejections"] * 1.1,
            width=_CHART_W,
            height=_CHART_H,
            empty_text=(
                "no guard in front: nothing rejects"
                if run.mode == "no-guard"
                else "no rejections scraped"
            ),
        ),
        _legend([(f"{label} ({_total(label, totals)})", c, False) for label, c, _ in bars.stacks]),
    )


def _answers_chart(
    rs: RunSeries,
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
    colours: Mapping[str, str],
) -> _Chart:
    """What the attack requests got back per second by status and error code, stacked bars."""
    answers = Bars(rs.bar_starts, rs.bar_width, _stacks(rs.answers, colours, _code_of))
    totals = {label: _count(row, rs.bar_seconds) for label, row in rs.answers.items()}
    return _Chart(
        f"attack-answers{suffix}",
        "Attack answers as the client saw them",
        "Status and error code of every attack request (each request of a flood burst), "
        f"per second over {rs.bar_width:g} s bars; reds: served, greys: no answer.",
        bar_chart(
            f"attack-answers{suffix}",
            "Attack answers",
            bars=answers,
            x_max=x_max,
            y_unit="answers/s",
            y_max=scales["answers"] * 1.1,
            width=_CHART_W,
            height=_CHART_H,
            empty_text="no attacks" if rs.has_timeline else "no timeline.json in this run",
        ),
        _legend(
            [(f"{label} ({_total(label, totals)})", c, False) for label, c, _ in answers.stacks]
        ),
    )


def _count(rates: Sequence[float], seconds: Sequence[float]) -> float:
    return sum(r * s for r, s in zip(rates, seconds, strict=True))


def _total(label: str, totals: Mapping[str, float]) -> str:
    if label == "other":
        return "rest"
    return f"{totals.get(label, 0.0):,.0f}"


def _scales(all_series: Sequence[RunSeries]) -> dict[str, float]:
    def top(fn: Callable[[RunSeries], float]) -> float:
        return max([fn(rs) for rs in all_series] or [0.0]) or 1.0

    def stacked(rows: Mapping[str, Sequence[float]]) -> float:
        return max((sum(col) for col in zip(*rows.values(), strict=True)), default=0.0)

    return {
        "benign-latency": top(lambda rs: _max_of(rs.latency["BENIGN"]["p99"])),
        "ttft": top(lambda rs: _max_of(rs.latency["TTFT"]["p99"])),
        "itl": top(lambda rs: _max_of(rs.latency["ITL"]["p99"])),
        "rss": top(
            lambda rs: (
                max([_max_of(p) for p in rs.rss.values()] + list(rs.peak_rss.values()))
                if rs.rss
                else 0.0
            )
        ),
        "rejections": top(lambda rs: stacked(rs.rejections)),
        "answers": top(lambda rs: stacked(rs.answers)),
    }


def _figure(chart: _Chart, who: str = "") -> str:
    caption = _e(chart.title) + (f' <span class="who">{_e(who)}</span>' if who else "")
    return (
        f'<figure data-figure="{_e(chart.id)}"><figcaption>{caption}</figcaption>'
        f'<p class="note">{_e(chart.note)}</p>{chart.svg}{chart.legend}</figure>'
    )


def _attack_classes(runs: Sequence[Run]) -> str:
    classes: list[str] = []
    for run in runs:
        classes += [k for k in (run.numbers.get("attacks_by_class") or {}) if k not in classes]
    if not classes:
        return "<p>No attacks were sent.</p>"
    head = "<tr><th>THREATS class</th>" + "".join(
        f"<th>sent{_who(r, runs)}</th><th>rejected{_who(r, runs)}</th>" for r in runs
    )
    rows = [head + "</tr>"]
    for cls in sorted(classes):
        cells = [f"<td>{_e(cls)}</td>"]
        for run in runs:
            v = (run.numbers.get("attacks_by_class") or {}).get(cls)
            if v is None:
                cells.append("<td>-</td><td>-</td>")
                continue
            bad = v["rejected"] < v["sent"]
            mark = ' class="num status fail"' if bad else ' class="num"'
            cells.append(f'<td class="num">{v["sent"]}</td><td{mark}>{v["rejected"]}</td>')
        rows.append('<tr data-class="' + _e(cls) + '">' + "".join(cells) + "</tr>")
    return '<table id="attack-classes">' + "".join(rows) + "</table>"


def _code_totals(runs: Sequence[Run]) -> str:
    codes: list[str] = []
    for run in runs:
        codes += [c for c in (run.numbers.get("guard_rejections_by_code") or {}) if c not in codes]
    if not codes:
        return "<p>No rejections were scraped from a guard.</p>"

    def total(code: str) -> float:
        return max(
            float((r.numbers.get("guard_rejections_by_code") or {}).get(code, 0)) for r in runs
        )

    head = "<tr><th>code</th>" + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>"
    rows = "".join(
        f"<tr><td><code>{_e(code)}</code></td>"
        + "".join(
            f'<td class="num">{float((r.numbers.get("guard_rejections_by_code") or {}).get(code, 0)):g}</td>'
            for r in runs
        )
        + "</tr>"
        for code in sorted(codes, key=lambda c: (-total(c), c))
    )
    return f'<table id="rejection-totals">{head}{rows}</table>'


def _failures(run: Run, who: str) -> str:
    n = run.numbers
    parts = []
    for key, title in (
        ("attacks_not_rejected", "attacks not rejected"),
        ("benign_failure_samples", "benign failures"),
    ):
        items = n.get(key) or []
        if items:
            lis = "".join(f"<li><code>{_e(i)}</code></li>" for i in items)
            parts.append(
                f"<details open><summary>{_e(title)} {who}({len(items)})</summary>"
                f"<ul>{lis}</ul></details>"
            )
    unexpected = (n.get("target") or {}).get("unexpected_codes") or {}
    if unexpected:
        lis = "".join(
            f"<li><code>{_e(k.removeprefix('unexpected '))}</code> x{v}</li>"
            for k, v in sorted(unexpected.items())
        )
        parts.append(
            f"<details><summary>rejected with another status or code than the payload "
            f"expects {who}({len(unexpected)})</summary><ul>{lis}</ul></details>"
        )
    return "".join(parts)


def _servers(runs: Sequence[Run]) -> str:
    rows = []
    for run in runs:
        for name, s in sorted((run.report.get("servers") or {}).items()):
            rows.append(
                f"<tr><td>{_e(run.label)}</td><td>{_e(name)}</td><td>{_e(s.get('url', ''))}</td>"
                f"<td class='num'>{_e(s.get('pid', ''))}</td>"
                f"<td class='num'>{_mb(s.get('peak_rss_mb'))}</td><td>{_e(s.get('exit', ''))}</td>"
                "</tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>Servers</h2><table id='servers'><tr><th>run</th><th>server</th><th>URL</th>"
        "<th>pid</th><th>peak RSS (0.2 s samples)</th><th>at the end</th></tr>"
        + "".join(rows)
        + "</table>"
    )


_FILES = (
    ("locust_report.html", "locust's own report"),
    ("report.json", "everything here as JSON"),
    ("slo.json", "the SLO gate's report"),
    ("timeline.json", "the time series"),
    ("locust_stats.csv", "locust stats"),
    ("locust_stats_history.csv", "locust stats per second"),
    ("locust_failures.csv", "locust failures"),
    ("locust.log", "locust's output"),
    ("guard.log", "guard log"),
    ("upstream.log", "upstream log"),
)


def _files(runs: Sequence[Run], out_dir: Path) -> str:
    items = []
    for run in runs:
        for name, what in _FILES:
            path = run.directory / name
            if path.is_file():
                href = os.path.relpath(path, out_dir)
                items.append(
                    f'<li><a href="{_e(href)}">{_e(href)}</a>: {_e(what)}'
                    + (f" ({_e(run.label)})" if len(runs) > 1 else "")
                    + "</li>"
                )
    return "<h2>Files</h2><ul id='files'>" + "".join(items) + "</ul>" if items else ""


def build_html(run: Run, compare: Run | None = None, *, out_dir: Path | None = None) -> str:
    """The report page for ``run`` (and ``compare`` beside it)."""
    runs = [run] if compare is None else [run, compare]
    all_series = [series(r) for r in runs]
    x_max = max(rs.duration for rs in all_series)
    scales = _scales(all_series)
    colours = _colours(all_series)
    charts = [
        _charts(rs, r, "" if i == 0 else "-compare", scales, x_max, colours)
        for i, (rs, r) in enumerate(zip(all_series, runs, strict=True))
    ]
    if compare is None:
        chart_html = '<div class="grid">' + "".join(_figure(c) for c in charts[0]) + "</div>"
    else:
        chart_html = "".join(
            f'<div class="grid pair">{_figure(a, run.label)}{_figure(b, compare.label)}</div>'
            for a, b in zip(charts[0], charts[1], strict=True)
        )
    verdict = "pass" if run.passed else "fail"
    subtitle = f'<p class="sub">{_run_line(run)}</p>'
    if compare is not None:
        other = "PASS" if compare.passed else "FAIL"
        subtitle += (
            f'<p class="sub">compared with: {_run_line(compare)}: its gate '
            f'<span class="status {other.lower()}">{other}</span></p>'
        )
    failures = _failures(run, f"({run.label}) " if compare else "")
    if compare is not None:
        failures += _failures(compare, f"({compare.label}) ")
    directory = out_dir or run.directory
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = f"schedguard load report: {verdict.upper()}"
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{_CSS}</style></head><body><main>"
        f'<header><h1>schedguard load report <span class="verdict {verdict}" id="verdict">'
        f"{verdict.upper()}</span></h1>{subtitle}</header>"
        f'<section id="slo"><h2>SLO verdicts</h2>{_slo_table(runs)}</section>'
        f'<section id="charts"><h2>Over time</h2>{chart_html}</section>'
        f'<section id="numbers"><h2>Traffic</h2>{_numbers_table(runs)}</section>'
        '<section id="attacks"><div class="cols">'
        f"<div><h2>Attacks by class</h2>{_attack_classes(runs)}</div>"
        f"<div><h2>Guard rejections by code (totals)</h2>{_code_totals(runs)}</div>"
        f"</div>{failures}</section>"
        f"{_servers(runs)}{_files(runs, directory)}"
        f"<footer>schedguard load report, generated {generated}.</footer>"
        "</main></body></html>\n"
    )


def write_report(
    out_dir: str | Path, compare: str | Path | None = None, *, name: str = REPORT_FILE
) -> Path:
    """Write ``report.html`` into ``out_dir`` from the run there (and ``compare``'s)."""
    directory = Path(out_dir)
    run = load_run(directory)
    other = load_run(compare) if compare is not None else None
    path = directory / name
    path.write_text(build_html(run, other, out_dir=directory), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.report",
        description="Write report.html for a schedguard load run's output directory.",
    )
    parser.add_argument("out", help="the run's output directory (report.json or slo.json)")
    parser.add_argument("--compare", help="another run's directory (e.g. a --no-guard run)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.out, args.compare)
    except (OSError, ValueError) as exc:
        print(f"loadtests.report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

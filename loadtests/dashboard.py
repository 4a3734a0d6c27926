"""Locust's web UI, extended: a ``schedguard`` tab and page with the guard's memory, its
rejections by code and the SLO status, live.

Uses locust's own extension points (``web_ui.template_args`` ``extended_tabs`` /
``extended_tables`` / ``extended_csv_files``, and ``extended_stats`` added to the
``/stats/requests`` answer the UI polls every two seconds), plus three routes:

- ``GET /schedguard/status``: everything as JSON (monitor snapshot + the SLO report so far);
- ``GET /schedguard``: a self-contained page charting guard and upstream RSS over time, with
  the rejections and the SLO checks (no external assets: it works offline);
- ``GET /schedguard/memory.svg``: that chart alone (:func:`memory_svg`, drawn by
  :mod:`loadtests.svgchart` with a time axis; the page reloads it every two seconds);
- ``GET /schedguard/rejections.csv``: rejections by code.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flask import Response, jsonify, request

from loadtests.svgchart import HLine, Line, line_chart

if TYPE_CHECKING:  # importing locust monkey-patches the process with gevent
    from locust.env import Environment

__all__ = ["TAB_KEY", "install", "memory_svg", "page", "table_rows"]

TAB_KEY = "schedguard"
StatusFn = Callable[[], dict[str, Any]]

_STRUCTURE = [
    {"key": "metric", "title": "Metric"},
    {"key": "value", "title": "Value"},
    {"key": "threshold", "title": "SLO"},
    {"key": "status", "title": "Status"},
]


def table_rows(status: dict[str, Any]) -> list[dict[str, str]]:
    """The tab's rows: the SLO checks, memory of both servers, then rejections by code."""
    rows: list[dict[str, str]] = []
    report = status.get("slo") or {}
    verdict = "PASS" if report.get("passed") else "FAIL"
    rows.append({"metric": "SLO gate (so far)", "value": "", "threshold": "", "status": verdict})
    for check in report.get("checks", []):
        rows.append(
            {
                "metric": check["name"],
                "value": check["measured"],
                "threshold": check["threshold"],
                "status": check["status"].upper(),
            }
        )
    for name in ("guard", "upstream"):
        info = status.get(name) or {}
        if info.get("pid"):
            rows.append(
                {
                    "metric": f"{name} RSS now / peak",
                    "value": f"{info.get('rss_mb')} / {info.get('peak_rss_mb')} MB",
                    "threshold": "",
                    "status": "alive" if info.get("alive") else "DOWN",
                }
            )
    for code, count in (status.get("rejections") or {}).items():
        rows.append(
            {"metric": f"rejected: {code}", "value": f"{count:g}", "threshold": "", "status": ""}
        )
    return rows


_RSS_COLOURS = {"guard": "#2b6cb0", "upstream": "#dd6b20"}


def memory_svg(status: dict[str, Any]) -> str:
    """Guard and upstream RSS over the seconds since the monitor started, with the peak RSS
    SLOs when they are in range of the data."""
    lines = []
    top = 0.0
    for name, colour in _RSS_COLOURS.items():
        points = [(float(t), float(v)) for t, v in (status.get(name) or {}).get("series") or []]
        if points:
            lines.append(Line(f"{name} RSS", colour, points))
            top = max(top, *(v for _, v in points))
    hlines = []
    thresholds = (status.get("slo") or {}).get("thresholds") or {}
    for name, colour in _RSS_COLOURS.items():
        limit = thresholds.get(f"max_{name}_rss_mb")
        if limit is not None and (status.get(name) or {}).get("series") and limit <= 2 * top:
            hlines.append(HLine(f"{name} SLO {float(limit):,.0f} MB", colour, float(limit)))
    x_max = max([p[0] for line in lines for p in line.points] or [1.0])
    return line_chart(
        "memory",
        "guard and upstream RSS (MB) over time",
        lines=lines,
        x_max=max(x_max, 10.0),
        y_unit="MB",
        hlines=hlines,
        width=900,
        height=280,
        empty_text="no RSS samples yet (the servers' pids are unknown with --host)",
        x_label="time since the monitor started",
    )


def page(status: dict[str, Any]) -> str:
    """The ``/schedguard`` page, with the memory chart as of ``status``."""
    return _PAGE.replace("<!--memory-->", memory_svg(status))


def install(environment: Environment, status: StatusFn) -> None:
    """Add the tab, the routes and the stats hook to ``environment.web_ui``."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    app = web_ui.app
    assert app is not None
    web_ui.template_args["extended_tabs"] = [{"title": "schedguard", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [{"key": TAB_KEY, "structure": _STRUCTURE}]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./schedguard/rejections.csv", "title": "Download guard rejections by code CSV"}
    ]

    @app.after_request
    def _extend_stats(response: Response) -> Response:
        if request.path.rstrip("/").endswith("/stats/requests") and response.is_json:
            body = response.get_json(silent=True)
            if isinstance(body, dict):
                body["extended_stats"] = [{"key": TAB_KEY, "data": table_rows(status())}]
                response.set_data(json.dumps(body))
        return response

    @app.route("/schedguard/status")
    def _status() -> Response:
        return jsonify(status())

    @app.route("/schedguard/rejections.csv")
    def _rejections_csv() -> Response:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["code", "count"])
        for code, count in (status().get("rejections") or {}).items():
            writer.writerow([code, count])
        return Response(
            out.getvalue(),
            mimetype="text/csv",
            headers={"Content-Disposition": "attachment;filename=schedguard_rejections.csv"},
        )

    @app.route("/schedguard/memory.svg")
    def _memory_svg() -> Response:
        return Response(memory_svg(status()), mimetype="image/svg+xml")

    @app.route("/schedguard")
    def _page() -> Response:
        return Response(page(status()), mimetype="text/html")


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>schedguard load test</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px}
.PASS{color:#070}.FAIL{color:#b00}.SKIP{color:#888}#mem svg{border:1px solid #ccc;max-width:100%}
</style></head><body>
<h2>schedguard load test <span id="verdict"></span></h2>
<p><a href="./">locust UI</a> &middot; <a href="./schedguard/status">JSON</a></p>
<h3>Memory (MB) over time</h3>
<div id="mem"><!--memory--></div>
<p><span style="color:#2b6cb0">&#9632; guard</span> <span style="color:#dd6b20">&#9632; upstream</span>
 (dashed: peak RSS SLO) <span id="now"></span></p>
<h3>SLO checks</h3><table id="checks"></table>
<h3>Guard rejections by code</h3><table id="codes"></table>
<script>
function esc(s) { return String(s).replace(/[&<>]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;"})[c]); }
async function refresh() {
  const s = await (await fetch("./schedguard/status")).json();
  document.getElementById("mem").innerHTML = await (await fetch("./schedguard/memory.svg")).text();
  document.getElementById("now").textContent = " now: guard " + (s.guard && s.guard.rss_mb) +
    " MB (peak " + (s.guard && s.guard.peak_rss_mb) + "), upstream " +
    (s.upstream && s.upstream.rss_mb) + " MB (peak " + (s.upstream && s.upstream.peak_rss_mb) + ")";
  const slo = s.slo || {checks: []};
  const v = document.getElementById("verdict");
  v.textContent = slo.passed ? "PASS" : "FAIL"; v.className = slo.passed ? "PASS" : "FAIL";
  document.getElementById("checks").innerHTML = "<tr><th>SLO</th><th>threshold</th><th>measured</th><th>status</th></tr>" +
    slo.checks.map(c => "<tr><td>" + esc(c.name) + "</td><td>" + esc(c.threshold) + "</td><td>" +
      esc(c.measured) + '</td><td class="' + c.status.toUpperCase() + '">' + c.status.toUpperCase() + "</td></tr>").join("");
  document.getElementById("codes").innerHTML = "<tr><th>code</th><th>count</th></tr>" +
    Object.entries(s.rejections || {}).map(([k, n]) => "<tr><td>" + esc(k) + "</td><td>" + n + "</td></tr>").join("");
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""

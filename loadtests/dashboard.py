"""Locust's web UI, extended: a ``schedguard`` tab and page with the guard's memory, its
rejections by code and the SLO status, live.

Uses locust's own extension points (``web_ui.template_args`` ``extended_tabs`` /
``extended_tables`` / ``extended_csv_files``, and ``extended_stats`` added to the
``/stats/requests`` answer the UI polls every two seconds), plus three routes:

- ``GET /schedguard/status``: everything as JSON (monitor snapshot + the SLO report so far);
- ``GET /schedguard``: a self-contained page charting guard and upstream RSS, with the
  rejections and the SLO checks (no external assets: it works offline);
- ``GET /schedguard/rejections.csv``: rejections by code.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flask import Response, jsonify, request

if TYPE_CHECKING:  # importing locust monkey-patches the process with gevent
    from locust.env import Environment

__all__ = ["TAB_KEY", "install", "table_rows"]

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

    @app.route("/schedguard")
    def _page() -> Response:
        return Response(_PAGE, mimetype="text/html")


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>schedguard load test</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px}
.PASS{color:#070}.FAIL{color:#b00}.SKIP{color:#888}svg{border:1px solid #ccc}
</style></head><body>
<h2>schedguard load test <span id="verdict"></span></h2>
<p><a href="./">locust UI</a> &middot; <a href="./schedguard/status">JSON</a></p>
<h3>Memory (MB)</h3>
<svg id="mem" width="720" height="220"></svg>
<p><span style="color:#06c">&#9632; guard</span> <span style="color:#c60">&#9632; upstream</span>
 <span id="now"></span></p>
<h3>SLO checks</h3><table id="checks"></table>
<h3>Guard rejections by code</h3><table id="codes"></table>
<script>
function line(points, color, maxT, maxY) {
  if (!points.length) return "";
  const p = points.map(([t, y]) =>
    (40 + 670 * t / maxT).toFixed(1) + "," + (200 - 180 * y / maxY).toFixed(1)).join(" ");
  return '<polyline fill="none" stroke="' + color + '" stroke-width="2" points="' + p + '"/>';
}
function esc(s) { return String(s).replace(/[&<>]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;"})[c]); }
async function refresh() {
  const s = await (await fetch("./schedguard/status")).json();
  const g = (s.guard && s.guard.series) || [], u = (s.upstream && s.upstream.series) || [];
  const all = g.concat(u);
  const maxT = Math.max(1, ...all.map(p => p[0])), maxY = Math.max(1, ...all.map(p => p[1])) * 1.1;
  document.getElementById("mem").innerHTML =
    '<text x="4" y="24">' + maxY.toFixed(0) + '</text><text x="4" y="200">0</text>' +
    line(g, "#06c", maxT, maxY) + line(u, "#c60", maxT, maxY);
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

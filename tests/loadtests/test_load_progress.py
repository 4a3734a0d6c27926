"""``schedguard load``'s live progress (issue 26, item 1).

The decisions (how often, in place or line by line, nothing with ``--quiet``; a line's numbers
are the report's) are tested here directly; then one 20 s run of the real command inside tmux,
whose pane is captured while it runs: the progress line must change at least three times, each
update's numbers must never run ahead of the final report, and the last one must be its numbers.
tmux comes from Debian (.ci/run installs it): without it the run is skipped locally and fails
under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadtests import outcomes, progress
from loadtests.slo import CONTENT_CHECK, FLOOD_CHECK, Report, RunData, Thresholds, evaluate
from schedguard import _load_cli
from schedguard.cli import build_parser
from schedguard.servers import schedguard_argv

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 20
_LINE = re.compile(
    r"\[\s*(?P<elapsed>\d+)/(?P<total>\S+) s(?P<done> done)?\] users (?P<benign_users>\d+)\+"
    r"(?P<attack_users>\d+) \| benign (?P<benign>\d+) req (?P<rps>[\d.]+)/s "
    r"p50 (?P<p50>\S+) ms p99 (?P<p99>\S+) ms, (?P<errors>\d+) errors \| "
    r"attacks (?P<attacks>\d+): content refused (?P<refused>\d+)/(?P<judged>\d+) judged, "
    r"floods stopped (?P<floods_stopped>\d+)/(?P<floods>\d+)"
)


def _report(
    attacks: dict[str, int] | None = None, bursts: dict[str, int] | None = None, **counts: int
) -> Report:
    run = RunData(
        duration_s=10.0,
        benign_latency_ms={100: 8, 900: 2},
        attack_records=attacks or {},
        flood_bursts=bursts or {},
    )
    for name, value in counts.items():
        assert hasattr(run, name), name
        setattr(run, name, value)
    return evaluate(run, Thresholds())


def _numbers(
    attacks: dict[str, int] | None = None, bursts: dict[str, int] | None = None, **counts: int
) -> dict[str, Any]:
    return _report(attacks, bursts, **counts).numbers


def _content(status: int, code: str | None) -> str:
    return outcomes.key("json_body_bomb", outcomes.CONTENT_ATTACK, status, code)


# 6 content attacks: 4 a content check refused, 1 served, 1 a limit refused before any check
# judged it; 1 flood request, of 2 bursts of which 1 met a limit.
_ATTACKS = {
    _content(400, "json_too_deep"): 4,
    _content(200, None): 1,
    _content(429, "tenant_tokens_exhausted"): 1,
    outcomes.key("volume", outcomes.FLOOD, 429, "rate_limited_requests"): 1,
}
_BURSTS = {outcomes.BURST_STOPPED: 1, outcomes.BURST_THROUGH: 1}


def test_a_line_holds_the_reports_numbers(tmp_path: Path) -> None:
    report = _report(
        benign_requests=10,
        benign_failures=1,
        lookalike_requests=3,
        lookalike_failures=2,
        attacks=_ATTACKS,
        bursts=_BURSTS,
    )
    numbers = report.numbers
    p = progress.of_numbers(
        numbers, elapsed_s=12.34, total_s=20.0, users={"benign": 6, "attack": 2}
    )
    line = progress.render(p)
    assert line == (
        "[  12/20 s] users 6+2 | benign 10 req 1.0/s p50 100 ms p99 900 ms, 3 errors | "
        "attacks 7: content refused 4/5 judged, floods stopped 1/2"
    )
    # benign errors are the gate's: the synthetic requests' and the look-alikes' failures
    assert p.benign_errors == numbers["benign_errors"] == 3
    # the attack figures are the gate's two checks': the rate-limited content attack was not
    # judged, so it is neither refused nor through
    checks = {c.name: c.measured for c in report.checks}
    assert checks[CONTENT_CHECK].startswith("80.0% (4/5)")
    assert checks[FLOOD_CHECK] == "50.0% (1/2 bursts)"
    progress.write(tmp_path / "p.json", p)
    assert progress.read(tmp_path / "p.json") == p
    assert progress.read(tmp_path / "missing.json") is None
    final = progress.of_numbers(numbers, elapsed_s=20, total_s=20, users={}, final=True)
    assert progress.render(final).startswith("[  20/20 s done] users 0+0")


@pytest.mark.parametrize(
    ("argv", "tty", "expected"),
    [
        ([], True, _load_cli.PROGRESS_TTY_S),
        ([], False, _load_cli.PROGRESS_PLAIN_S),
        (["--progress-interval", "5"], True, 5.0),
        (["--quiet"], True, None),
        (["--quiet", "--progress-interval", "5"], False, None),
    ],
)
def test_progress_interval(argv: list[str], tty: bool, expected: float | None) -> None:
    args = build_parser().parse_args(["load", *argv])
    assert _load_cli.progress_interval(args, tty) == expected


def test_locust_writes_progress_only_when_shown() -> None:
    args = build_parser().parse_args(["load", "--duration", "5"])
    target = _load_cli.LoadEndpoints("http://g", "http://g", None, None, None)
    shown = _load_cli.locust_argv(args, target, Path("out"), 2.0)
    at = shown.index("--progress-json")
    assert shown[at + 1] == str(Path("out") / "progress.json")
    assert shown[shown.index("--progress-interval-s") + 1] == "2.0"
    assert "--progress-json" not in _load_cli.locust_argv(args, target, Path("out"), None)


def _view(tmp_path: Path, tty: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[object, io.StringIO]:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    return _load_cli._ProgressView(tmp_path / "progress.json", 60.0, tty), err


def test_plain_view_writes_a_line_per_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, err = _view(tmp_path, tty=False, monkeypatch=monkeypatch)
    assert isinstance(view, _load_cli._ProgressView)
    view.update(force=True)  # nothing written yet: nothing shown
    assert err.getvalue() == ""
    numbers = _numbers(attacks=_ATTACKS, bursts=_BURSTS, benign_requests=4)
    p = progress.of_numbers(numbers, elapsed_s=4, total_s=20, users={"benign": 2})
    progress.write(tmp_path / "progress.json", p)
    view.update()  # not due: the interval is 60 s
    assert err.getvalue() == ""
    view.update(force=True)
    view.update(force=True)
    assert err.getvalue() == (progress.render(p) + "\n") * 2
    final = progress.of_numbers(numbers, elapsed_s=20, total_s=20, users={}, final=True)
    progress.write(tmp_path / "progress.json", final)
    view.close()
    view.close()  # the final line once
    assert err.getvalue().splitlines()[-1] == progress.render(final)
    assert err.getvalue().count(progress.render(final)) == 1
    assert "\r" not in err.getvalue() and "\x1b" not in err.getvalue()


def test_terminal_view_rewrites_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view, err = _view(tmp_path, tty=True, monkeypatch=monkeypatch)
    assert isinstance(view, _load_cli._ProgressView)
    numbers = _numbers(benign_requests=4)
    for elapsed in (2, 4):
        p = progress.of_numbers(numbers, elapsed_s=elapsed, total_s=20, users={})
        progress.write(tmp_path / "progress.json", p)
        view.update(force=True)
    view.close()
    view.close()  # after an interrupt too: the line is ended once
    text = err.getvalue()
    assert text.count("\r\x1b[2K") == 3 and text.count("\n") == 1 and text.endswith("\n")


# ------------------------------------------------------------------------------ in tmux


def _tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        message = "tmux is not installed (apt-get install -y tmux)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true: .ci/run installs it)", pytrace=False)
        pytest.skip(message)
    return path


@pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="the load extra (locust) is not installed"
)
def test_progress_updates_live_in_a_terminal(tmp_path: Path) -> None:
    tmux = _tmux()
    out = tmp_path / "run"
    socket = f"sg-progress-{os.getpid()}"
    cmd = [
        *schedguard_argv("load"),
        "--duration",
        str(DURATION_S),
        "--users",
        "2",
        "--attack-share",
        "0.3",
        "--progress-interval",
        "2",
        "--out",
        str(out),
    ]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    shell = (
        "env "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + f" {shlex.join(cmd)}; echo EXIT=$?; sleep 300"
    )
    tm = [tmux, "-L", socket, "-f", "/dev/null"]
    subprocess.run(
        [*tm, "new-session", "-d", "-s", "load", "-x", "220", "-y", "60", shell],
        check=True,
        timeout=30,
    )
    captures: list[str] = []
    try:
        deadline = time.monotonic() + DURATION_S + 150  # a generous outer bound
        while time.monotonic() < deadline:
            pane = subprocess.run(
                [*tm, "capture-pane", "-p", "-t", "load"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            captures.append(pane)
            if "EXIT=" in pane:
                break
            time.sleep(1.5)
    finally:
        subprocess.run([*tm, "kill-server"], timeout=30, check=False)
    final_pane = captures[-1]
    assert "EXIT=0" in final_pane, final_pane
    # Each capture shows the line as it was then; the updates are the distinct ones seen.
    seen: list[re.Match[str]] = []
    for pane in captures[:-1]:
        for m in _LINE.finditer(pane):
            if not m["done"] and all(m.group(0) != s.group(0) for s in seen):
                seen.append(m)
    assert len(captures) >= 3
    assert len(seen) >= 3, captures
    report = json.loads((out / "report.json").read_text())
    n = report["numbers"]
    last = [m for m in _LINE.finditer(final_pane) if m["done"]]
    assert len(last) == 1, final_pane
    done = last[0]
    # The last line is the final report's numbers...
    assert int(done["benign"]) == n["benign_requests"]
    assert int(done["errors"]) == n["benign_failures"] + n["lookalike_failures"]
    attacks = n["attacks"]
    assert int(done["attacks"]) == n["attack_requests"]
    assert int(done["refused"]) == attacks["content_stopped"]
    assert int(done["judged"]) == attacks["content_judged"]
    assert int(done["floods_stopped"]) == attacks["flood_bursts_stopped"]
    assert int(done["floods"]) == attacks["flood_bursts"]
    assert done["p99"] == f"{n['benign_p99_ms']:.0f}"
    assert done["rps"] == f"{n['benign_rps']:.1f}"
    # ...and the live ones counted up to them, time going forward within the run.
    elapsed = [int(m["elapsed"]) for m in seen]
    assert elapsed == sorted(elapsed) and elapsed[-1] <= DURATION_S
    assert all(m["total"] == str(DURATION_S) for m in seen)
    for counter, final in (
        ("benign", n["benign_requests"]),
        ("attacks", n["attack_requests"]),
        ("refused", attacks["content_stopped"]),
        ("judged", attacks["content_judged"]),
        ("floods_stopped", attacks["flood_bursts_stopped"]),
        ("floods", attacks["flood_bursts"]),
    ):
        values = [int(m[counter]) for m in seen]
        assert values == sorted(values) and values[-1] <= final, (counter, values, final)
    assert any(int(m["benign_users"]) == 2 for m in seen)
    assert int(seen[-1]["benign"]) > int(seen[0]["benign"])

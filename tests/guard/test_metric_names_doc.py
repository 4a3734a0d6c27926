"""Every metric the documentation, the Grafana dashboard and the alert rules name is one that
``/metrics`` exports (issue 26): a dashboard panel or a query copied from the docs that names a
series nobody exports shows nothing, silently.

A ``schedguard_guard_*`` name is the guard's. The reference scheduler (``schedguard ref``) has
metrics of its own, ``schedguard_*`` without ``guard_``; one of those is accepted only in a
paragraph that says it is the reference scheduler's, so that a guard's name written without
``guard_`` (``schedguard_rejections_total`` for ``schedguard_guard_rejections_total``) fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._exported_metrics import guard_metric_names, reference_metric_names
from tests._support import REPO_ROOT

# What operators read: the READMEs, docs/ (the dashboard, alert rules and Prometheus files in
# docs/deploy/ included).
DOCUMENTS = sorted(
    {
        REPO_ROOT / "README.md",
        *(
            p
            for p in (REPO_ROOT / "docs").rglob("*")
            if p.suffix in (".md", ".yml", ".yaml", ".json")
        ),
        *REPO_ROOT.glob("*/README.md"),
        *REPO_ROOT.glob("scripts/*/README.md"),
    }
)
DASHBOARD = REPO_ROOT / "docs" / "deploy" / "grafana-dashboard.json"
_NAME = re.compile(r"(?<![\w$])schedguard_[a-z0-9_]*[a-z0-9]\b")
# A paragraph that speaks of the reference scheduler.
_REFERENCE = re.compile(r"reference|scheduler_ref|schedguard ref\b", re.IGNORECASE)


def _paragraphs(path: Path) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` of each block of lines between blank lines."""
    start, block = 1, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            yield start, "\n".join(block)
            block = []
    if block:
        yield start, "\n".join(block)


def _named() -> Iterator[tuple[str, str, bool]]:
    """``(where, name, the paragraph speaks of the reference scheduler)`` for every metric
    name in the documents."""
    for path in DOCUMENTS:
        for number, text in _paragraphs(path):
            about_reference = bool(_REFERENCE.search(text))
            for offset, line in enumerate(text.splitlines()):
                for name in _NAME.findall(line):
                    where = f"{path.relative_to(REPO_ROOT)}:{number + offset}"
                    yield where, name, about_reference


def test_the_documents_name_metrics() -> None:
    named = {(where.partition(":")[0], name) for where, name, _ in _named()}
    files = {where for where, _ in named}
    for needed in ("docs/ERRORS.md", "docs/deploy/README.md", "docs/deploy/grafana-dashboard.json",
                   "docs/deploy/prometheus-alerts.yml"):  # fmt: skip
        assert needed in files
    assert ("docs/ERRORS.md", "schedguard_guard_rejections_total") in named


def _accepted(name: str, about_reference: bool) -> bool:
    if name in guard_metric_names():
        return True
    reference = name in reference_metric_names() and not name.startswith("schedguard_guard_")
    return reference and about_reference


def test_every_metric_named_is_exported() -> None:
    reference = reference_metric_names()
    wrong = []
    for where, name, about_reference in _named():
        if _accepted(name, about_reference):
            continue
        said = (
            "the reference scheduler's, in a paragraph that does not say so"
            if name in reference
            else "exported by neither the guard nor the reference scheduler"
        )
        wrong.append(f"{where}: {name} ({said})")
    assert not wrong, "\n".join(wrong)


def test_the_dashboard_names_only_the_guards_metrics() -> None:
    guard = guard_metric_names()
    names = set(_NAME.findall(DASHBOARD.read_text(encoding="utf-8")))
    assert len(names) >= 10
    assert sorted(names - guard) == []


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("clients match on the `code` label of `schedguard_rejections_total`", False),
        ("the `code` label of `schedguard_guard_rejections_total`", True),
        ("the reference scheduler's `schedguard_rejections_total`", True),
        ("`schedguard_guard_rejections`", True),  # the family's own name
        ("`schedguard_guard_rejected_total`", False),
    ],
)
def test_the_reader_tells_right_from_wrong(text: str, ok: bool) -> None:
    (name,) = _NAME.findall(text)
    assert _accepted(name, bool(_REFERENCE.search(text))) is ok

"""docs/FINDINGS.md is what the records in docs/findings/ make (`schedguard fuzz
findings-doc`), and a record that lacks what the list states is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.findings_doc import DEFAULT_DOC, DEFAULT_RECORDS, load_records, render_findings_doc
from schedguard.cli import main


def test_the_committed_findings_doc_is_up_to_date_with_the_records() -> None:
    assert DEFAULT_DOC.read_text(encoding="utf-8") == render_findings_doc(DEFAULT_RECORDS), (
        "docs/FINDINGS.md is stale: run `schedguard fuzz findings-doc`"
    )
    assert main(["fuzz", "findings-doc", "--check"]) == 0


def test_check_fails_on_a_stale_doc_and_a_record_missing_its_status_is_refused(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "a.yaml").write_text(
        "id: a\nupstream: x\ntitle: t\ncomponent: c\nstatus: open\nverified: 2026-12-07\n"
        "verified_by: campaign\nversion_checked: x 1.0\nendpoint: /v1/completions\n"
        'body: {"prompt": "h", "grammar": "o"}\n'
    )
    doc = tmp_path / "FINDINGS.md"
    doc.write_text("old\n")
    args = ["fuzz", "findings-doc", "--records", str(records), "--out", str(doc)]
    assert main([*args, "--check"]) == 1
    assert main(args) == 0 and main([*args, "--check"]) == 0
    text = doc.read_text()
    assert "| 2026-12-07 |" in text and "refuses it, 400 `guided_grammar_invalid`" in text
    (records / "b.yaml").write_text("id: b\nupstream: x\ntitle: t\ncomponent: c\n")
    with pytest.raises(ValueError, match=r"b\.yaml: missing status"):
        load_records(records)

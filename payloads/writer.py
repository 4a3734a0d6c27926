"""Save a fuzz finding as a payload file in the corpus format: an attack under
``<root>/found/<target>/`` (:func:`save_found`), a benign request a guard refused (a false
positive) under ``<root>/benign/`` (:func:`save_benign_found`).

The root is always the caller's: a campaign saves under its output directory unless asked to
add to a corpus (``--found-root payloads`` for this package's own), never into an installed
package by default.

The body is stored exactly: as ``body_text`` when it is UTF-8 that YAML round-trips, otherwise
as ``body_b64``. The file is read back through the loader before it is kept, so a finding that
is saved is a finding that replays.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from payloads._exceptions import PayloadError
from payloads.loader import BENIGN, CLASSES, Payload, load_payload, parse_payload

__all__ = ["finding_id", "save_benign_found", "save_found"]

_TARGET = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def finding_id(target: str, body: bytes) -> str:
    """A stable id: the target and a hash of the body, so the same input saves once."""
    return f"found-{target}-{hashlib.sha256(body).hexdigest()[:12]}"


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode("ascii")}
    dumped = yaml.safe_dump({"body_text": text}, allow_unicode=True, width=1 << 30)
    if yaml.safe_load(dumped) == {"body_text": text}:
        return {"body_text": text}
    return {"body_b64": base64.b64encode(body).decode("ascii")}


def save_found(
    *,
    target: str,
    class_: str,
    body: bytes,
    endpoint: str,
    target_field: str,
    description: str,
    engine: str,
    cause: str,
    cost_before: Mapping[str, float],
    cost_after: Mapping[str, float],
    seed: int | None = None,
    minimised: bool = True,
    headers: Mapping[str, str] | None = None,
    expect_status: int = 400,
    expect_code: str | None = None,
    references: Sequence[str] = (),
    root: Path,
    payload_id: str | None = None,
    overwrite: bool = False,
) -> Payload:
    """Write ``<root>/found/<target>/<id>.yaml`` and return it loaded. An existing file with
    the same id (the same body) is kept unless ``overwrite``; raises :class:`PayloadError` when
    the record is invalid (nothing is written then)."""
    if not _TARGET.fullmatch(target):
        raise PayloadError(f"target {target!r}: lowercase letters, digits, '_' and '-' only")
    if class_ not in CLASSES or class_ == BENIGN:
        raise PayloadError(f"class {class_!r}: one of {', '.join(CLASSES)}")
    pid = payload_id or finding_id(target, body)
    path = Path(root) / "found" / target / f"{pid}.yaml"
    if path.exists() and not overwrite:
        return load_payload(path)
    expect: dict[str, Any] = {"status": expect_status}
    if expect_code is not None:
        expect["code"] = expect_code
    record = _record(
        pid, class_, description, target_field, endpoint, body, expect, list(references),
        target, engine, cause, seed, minimised, cost_before, cost_after,
    )  # fmt: skip
    if headers:
        record["headers"] = dict(headers)
    return _write(path, record, body)


def save_benign_found(
    *,
    target: str,
    body: bytes,
    endpoint: str,
    target_field: str,
    description: str,
    engine: str,
    cause: str,
    cost_before: Mapping[str, float],
    cost_after: Mapping[str, float],
    seed: int | None = None,
    minimised: bool = True,
    root: Path,
) -> Payload:
    """Write ``<root>/benign/found-<target>-fp-<hash>.yaml``, a benign request a fuzz campaign
    found refused (a false positive), with ``expect: {status: 200}``: a corpus that adopts it
    tests that the guard lets it through. An existing file with the same id is kept; raises
    :class:`PayloadError` when the record is invalid (nothing is written then)."""
    if not _TARGET.fullmatch(target):
        raise PayloadError(f"target {target!r}: lowercase letters, digits, '_' and '-' only")
    pid = f"found-{target}-fp-{hashlib.sha256(body).hexdigest()[:12]}"
    path = Path(root) / BENIGN / f"{pid}.yaml"
    if path.exists():
        return load_payload(path)
    record = _record(
        pid, BENIGN, description, target_field, endpoint, body, {"status": 200}, None, target,
        engine, cause, seed, minimised, cost_before, cost_after,
    )  # fmt: skip
    return _write(path, record, body)


def _record(
    pid: str,
    class_: str,
    description: str,
    target_field: str,
    endpoint: str,
    body: bytes,
    expect: dict[str, Any],
    references: list[str] | None,
    target: str,
    engine: str,
    cause: str,
    seed: int | None,
    minimised: bool,
    cost_before: Mapping[str, float],
    cost_after: Mapping[str, float],
) -> dict[str, Any]:
    return {
        "id": pid,
        "class": class_,
        "source": "fuzz",
        "description": description,
        "target_field": target_field,
        "endpoint": endpoint,
        **_body_fields(body),
        "expect": expect,
        **({} if references is None else {"references": references}),
        "found": {
            "target": target,
            "engine": engine,
            "cause": cause,
            "seed": seed,
            "found_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "minimised": minimised,
        },
        "cost": {"before": dict(cost_before), "after": dict(cost_after)},
    }


def _write(path: Path, record: dict[str, Any], body: bytes) -> Payload:
    """Validate ``record``, write it to ``path`` atomically and return it loaded."""
    parse_payload(record, path)  # validate before touching the disk
    text = yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    saved = load_payload(path)
    if saved.body_bytes() != body:  # pragma: no cover - _body_fields checks the round trip
        path.unlink()
        raise PayloadError(f"{path}: the saved body does not round-trip")
    return saved

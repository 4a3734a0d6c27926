"""The attack corpus: payload files (data) and a loader that the guard tests, the fuzzers and the
load tests share. See ``payloads/README.md`` for the file format.

The public API is what this module exports; :mod:`payloads.loader` and :mod:`payloads.writer`
hold it (and the file format's constants).
"""

from payloads._exceptions import GeneratorError, PayloadError
from payloads.loader import (
    BENIGN,
    CLASSES,
    DEFAULT_ROOT,
    Expect,
    FindingCost,
    FindingMetadata,
    Payload,
    ProfileNotes,
    Transport,
    load_corpus,
    load_payload,
    parse_payload,
)
from payloads.writer import finding_id, save_benign_found, save_found

__all__ = [
    "BENIGN",
    "CLASSES",
    "DEFAULT_ROOT",
    "Expect",
    "FindingCost",
    "FindingMetadata",
    "GeneratorError",
    "Payload",
    "PayloadError",
    "ProfileNotes",
    "Transport",
    "finding_id",
    "load_corpus",
    "load_payload",
    "parse_payload",
    "save_benign_found",
    "save_found",
]

"""The attack corpus: payload files (data) and a loader that the guard tests, the fuzzers and the
load tests share. See ``payloads/README.md`` for the file format."""

from payloads.loader import (
    BENIGN,
    CLASSES,
    Cost,
    Expect,
    Finding,
    Payload,
    PayloadError,
    ProfileNotes,
    Transport,
    load_corpus,
    load_payload,
)

__all__ = [
    "BENIGN",
    "CLASSES",
    "Cost",
    "Expect",
    "Finding",
    "Payload",
    "PayloadError",
    "ProfileNotes",
    "Transport",
    "load_corpus",
    "load_payload",
]

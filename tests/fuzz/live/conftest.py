"""The live campaigns' tests: a fake server per test (tests/fuzz/live/_fake.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.live._fake import Fake


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    f = Fake(tmp_path)
    try:
        yield f
    finally:
        f.stop()

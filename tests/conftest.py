"""Fixtures shared by every test folder (tests/e2e adds its own for the real upstreams)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._support import REPO_ROOT
from tests._support import free_port as _free_port


@pytest.fixture
def free_port() -> int:
    """A free port on 127.0.0.1 for a server the test starts."""
    return _free_port()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout's root (docs/, payloads/, the Makefile)."""
    return REPO_ROOT

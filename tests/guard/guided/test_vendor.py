"""The vendored third-party code (guard/guided/_vendor/) is its upstream's text, byte for byte:
each file's digest is the one its README records, and, when the upstream is installed (``make
e2e`` sets llama-cpp-python 0.3.36 up), the text is the installed file's."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

VENDOR = REPO_ROOT / "guard" / "guided" / "_vendor"
MARKER = "# ---- upstream below"
README = (VENDOR / "README.md").read_text("utf-8")


def _upstream_part(path: Path) -> bytes:
    """What follows the marker line of a vendored file."""
    data = path.read_bytes()
    start = data.index(MARKER.encode())
    return data[data.index(b"\n", start) + 1 :]


def test_each_vendored_file_has_its_recorded_digest_and_licence() -> None:
    recorded = dict(re.findall(r"^    (\S+\.py)  ([0-9a-f]{64})$", README, re.MULTILINE))
    files = sorted(p.name for p in VENDOR.glob("*.py") if p.name != "__init__.py")
    assert files and sorted(recorded) == files
    for name, digest in recorded.items():
        assert hashlib.sha256(_upstream_part(VENDOR / name)).hexdigest() == digest, name
    for licence in re.findall(r"`(LICENSE-[^`]+)`", README):
        assert (VENDOR / licence).read_text("utf-8").startswith("MIT License")


def _installed_llama_grammar() -> Path | None:
    base = os.environ.get("SCHEDGUARD_UPSTREAMS_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "schedguard"
        / "upstreams"
    )
    venv = Path(base) / "llamacpp" / "venv"
    for site in sorted(venv.glob("lib/python3*/site-packages")):
        if (site / "llama_cpp_python-0.3.36.dist-info").is_dir():
            path = site / "llama_cpp" / "llama_grammar.py"
            return path if path.is_file() else None
    return None


def test_the_converter_is_the_installed_upstream_s_text() -> None:
    installed = _installed_llama_grammar()
    if installed is None:
        pytest.skip("llama-cpp-python 0.3.36 is not set up (scripts/upstreams)")
    lines = installed.read_bytes().splitlines(keepends=True)
    assert _upstream_part(VENDOR / "llama_grammar.py") == b"".join(lines[234:])

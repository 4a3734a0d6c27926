"""Output into a pipe nobody reads any more (``schedguard fuzz list | head -1``): the command
stops quietly, as CLIs do (status 141, or 0 where argparse swallows it), without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from schedguard.cli import EXIT_BROKEN_PIPE


@pytest.mark.parametrize(
    "argv",
    [
        ["fuzz", "list"],
        ["fuzz", "list", "--json"],
        ["policy", "show"],
        ["--help"],
    ],
)
def test_a_closed_output_pipe_is_no_traceback(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "schedguard", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode in (0, EXIT_BROKEN_PIPE)


def test_a_broken_pipe_elsewhere_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket's broken pipe while standard output is fine is an error, not a quiet exit."""
    from schedguard import cli

    def dispatch(_: object) -> int:
        raise BrokenPipeError("a socket")

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    with pytest.raises(BrokenPipeError):
        cli.main(["policy", "show"])

"""Argument types of the ``schedguard`` command's options, shared by every subcommand.

Each parses one option's text or raises :class:`argparse.ArgumentTypeError` with a message that
names what was wrong, which argparse prints as ``schedguard CMD: error: argument --X: ...``.
"""

from __future__ import annotations

import argparse

__all__ = [
    "add_log_format",
    "fraction",
    "non_negative_float",
    "non_negative_int",
    "port",
    "positive_float",
    "positive_int",
    "whole",
]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def whole(text: str) -> int:
    """Any whole number."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A share in [0, 1)."""
    value = _number(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def positive_int(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def add_log_format(parser: argparse.ArgumentParser) -> None:
    """``--log-format json|text``, of the commands that run the guard (serve, extproc)."""
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=None,
        help="format of every line written to stderr (uvicorn's and the guard's messages, the "
        "access log): json, one object a line, or text, for a terminal; overrides "
        "observability.log_format (default json)",
    )

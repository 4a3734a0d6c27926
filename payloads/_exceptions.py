"""Every exception the payloads package defines: a file that is not a valid payload, and a
generator spec that is malformed or over a cap (reported inside a :class:`PayloadError` that
names the file and the field when it comes from a file)."""

from __future__ import annotations

__all__ = ["GeneratorError", "PayloadError"]


class PayloadError(ValueError):
    """A payload file is malformed; the message names the file and the field."""


class GeneratorError(ValueError):
    """A generator spec is malformed or over a cap; the message names the operation."""

"""Bounded JSON reading: nesting depth scanned before parsing, key/array/string/number caps,
duplicate keys, non-finite numbers and invalid UTF-8 refused.
"""

from __future__ import annotations

from guard.json._reader import (
    JsonLimits,
    json_depth,
    parse_json_body,
    scan_json_body,
)

__all__ = [
    "JsonLimits",
    "json_depth",
    "parse_json_body",
    "scan_json_body",
]

"""A local ``$ref`` resolved as the backends' schema converters read it.

``#`` is the root; ``#/a/b/0`` a JSON pointer from it (``~1`` is ``/``, ``~0`` is ``~``; no
percent-decoding, no anchors). Anything else, or a pointer that leads nowhere, is None. The
schema check reads references its own way (stricter, by index, under the depth cap: the
schema walk); this is the reading of the nested-bound walk and the outlines cost model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["resolve_ref"]


def resolve_ref(root: Any, ref: str) -> Any:
    """The value ``ref`` names in ``root``, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for raw in ref[2:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node

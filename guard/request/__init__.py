"""A request as the guard reads it: the view the checks see (:class:`RequestView`), and its
fields and content parts read the way the upstreams read them.

Nothing here knows the policy: a view is built from what the front half settled (path, method,
headers, the caller's key) and the parsed body, and its fields are read as vLLM's pydantic models
or llama.cpp read them (:func:`lax_int`, :func:`lax_bool`, :func:`classify_part`), so that the
checks and the prompt's counting judge what the upstream will see.
"""

from guard.request._fields import (
    INJECT_FIELD,
    OUTPUT_FIELDS,
    SCORE_SIDES,
    Path,
    fmt_path,
    is_int,
    is_number,
    lax_bool,
    lax_float,
    lax_int,
    output_fields,
    prompt_items,
    requested_output,
    score_inputs,
    score_pairs,
    sequences_per_prompt,
)
from guard.request._parts import (
    KNOWN_PART_FIELDS,
    PART_TYPES,
    TEXT_TYPES,
    VIDEO_FRAMES_READ,
    PartKind,
    classify_part,
    iter_parts,
    media_payload,
)
from guard.request._view import (
    ANONYMOUS_TENANT,
    KEPT_HEADERS,
    CallerKey,
    Endpoint,
    HeadersLike,
    RequestView,
    endpoint_of,
    normalise_headers,
)

__all__ = [
    "ANONYMOUS_TENANT",
    "INJECT_FIELD",
    "KEPT_HEADERS",
    "KNOWN_PART_FIELDS",
    "OUTPUT_FIELDS",
    "PART_TYPES",
    "SCORE_SIDES",
    "TEXT_TYPES",
    "VIDEO_FRAMES_READ",
    "CallerKey",
    "Endpoint",
    "HeadersLike",
    "PartKind",
    "Path",
    "RequestView",
    "classify_part",
    "endpoint_of",
    "fmt_path",
    "is_int",
    "is_number",
    "iter_parts",
    "lax_bool",
    "lax_float",
    "lax_int",
    "media_payload",
    "normalise_headers",
    "output_fields",
    "prompt_items",
    "requested_output",
    "score_inputs",
    "score_pairs",
    "sequences_per_prompt",
]

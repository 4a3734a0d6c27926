"""The Berkeley Function Calling Leaderboard's conversations as the chat requests BFCL sends.

BFCL (``bfcl-eval`` on PyPI, Apache-2.0, https://github.com/ShishirPatil/gorilla) ships its data
in its wheel: 3,641 single-turn questions with their functions and 800 multi-turn conversations
(4.4 MB of JSON lines). That does not fit payloads/ (under 500 KB), and the package's own
dependencies (torch through sentence-transformers, faiss, numpy pinned to 1.26, ...) are far too
heavy for the ``dev`` extra; so the pinned wheel is downloaded once with pip (``--no-deps``, 1.9
MB, checked against its SHA-256) into a cache and read as a zip, nothing of it imported.

Each question becomes the request BFCL's OpenAI function-calling handler sends
(``bfcl_eval/model_handler/api_inference/openai_completion.py``, ``_query_FC``): its messages, the
model, ``temperature``, ``store: false``, and its functions turned into ``tools`` the way BFCL
does (``_func_doc_language_specific_pre_processing`` and ``convert_to_tool`` with
``GORILLA_TO_OPENAPI``, re-stated below since the package cannot be imported without its
dependencies). A multi-turn conversation gives BFCL's first request (the first turn's messages
and the involved classes' functions, less the held-out ones); its later requests carry the model's
own answers and BFCL's simulated API results, which no file holds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "2026.3.23"
WHEEL = f"bfcl_eval-{VERSION}-py3-none-any.whl"
SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
DATA = "bfcl_eval/data/"
# BFCL's categories with a function list per question (its test categories, BFCL_v4_<name>.json).
SINGLE_TURN = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_relevance",
    "live_irrelevance",
)
MULTI_TURN = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
CATEGORIES = SINGLE_TURN + MULTI_TURN
# bfcl_eval/constants/executable_backend_config.py
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
# bfcl_eval/constants/type_mappings.py
GORILLA_TO_OPENAPI = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "schedguard" / "data"
    return Path(os.environ.get("SCHEDGUARD_DATA_DIR", default))


def wheel() -> Path:
    """The pinned bfcl-eval wheel, downloaded once (pip, no dependencies) and hash-checked."""
    path = cache_dir() / WHEEL
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = f"bfcl-eval=={VERSION}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        subprocess.run(
            [*cmd, "-d", str(path.parent), spec], check=True, capture_output=True, timeout=300
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {SHA256} (bfcl-eval=={VERSION})")
    return path


@dataclass(frozen=True)
class BfclRequest:
    id: str
    category: str
    body: dict[str, Any]


def _lines(archive: zipfile.ZipFile, name: str) -> list[dict[str, Any]]:
    text = archive.read(DATA + name).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _language_hint(functions: list[dict[str, Any]], category: str) -> list[dict[str, Any]]:
    """bfcl_eval/utils.py ``_func_doc_language_specific_pre_processing``."""
    js = "javascript" in category
    java = "java" in category and not js
    hint = (
        " Note that the provided function is in Java 8 SDK syntax."
        if java
        else " Note that the provided function is in JavaScript syntax."
        if js
        else " Note that the provided function is in Python 3 syntax."
    )
    lang = "Java" if java else "JavaScript"
    for item in functions:
        item["description"] = item["description"] + hint
        if not (java or js):
            continue
        for value in item["parameters"]["properties"].values():
            if value["type"] == "any":
                value["description"] += (
                    f" This parameter can be of any type of {lang} object in string representation."
                )
            else:
                value["description"] += (
                    f" This is {lang} {value['type']} type parameter in string representation."
                )
            if (java and value["type"] in ("ArrayList", "Array")) or (
                js and value["type"] == "array"
            ):
                value["description"] += (
                    f" The list elements are of type {value['items']['type']}; they are not in "
                    "string representation."
                )
                del value["items"]
            if js and value["type"] == "dict" and "properties" in value:
                value["description"] += (
                    " The dictionary entries have the following schema; they are not in string "
                    f"representation. {json.dumps(value['properties'])}"
                )
                del value["properties"]
            value["type"] = "string"
    return functions


def _cast_types(properties: dict[str, Any]) -> dict[str, Any]:
    """bfcl_eval/model_handler/utils.py ``_cast_to_openai_type`` with GORILLA_TO_OPENAPI."""
    mapping = GORILLA_TO_OPENAPI
    for key, value in properties.items():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] += " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"])
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"])
        properties[key] = value
    return properties


def to_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """bfcl_eval/model_handler/utils.py ``convert_to_tool`` for ModelStyle.OPENAI_COMPLETIONS."""
    tools = []
    for item in copy.deepcopy(functions):
        item["name"] = re.sub(r"\.", "_", item["name"])
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _cast_types(item["parameters"]["properties"])
        tools.append({"type": "function", "function": item})
    return tools


def _body(
    messages: list[dict[str, Any]], functions: list[dict[str, Any]], category: str
) -> dict[str, Any]:
    # openai_completion.py _query_FC: messages, model, temperature (BFCL's default 0.001), store.
    body: dict[str, Any] = {
        "messages": messages,
        "model": "gpt-4o-2024-11-20-FC",
        "temperature": 0.001,
        "store": False,
    }
    tools = to_tools(_language_hint(copy.deepcopy(functions), category))
    if tools:
        body["tools"] = tools
    return body


def requests(path: Path, categories: tuple[str, ...] = CATEGORIES) -> Iterator[BfclRequest]:
    """BFCL's requests for ``categories``, in file order."""
    with zipfile.ZipFile(path) as archive:
        docs = {
            cls: _lines(archive, "multi_turn_func_doc/" + name)
            for cls, name in FUNC_DOC_FILES.items()
        }
        for category in categories:
            for entry in _lines(archive, f"BFCL_v4_{category}.json"):
                if category in MULTI_TURN:
                    functions = [f for cls in entry["involved_classes"] for f in docs[cls]]
                    held_out = {
                        n for names in entry.get("missed_function", {}).values() for n in names
                    }
                    functions = [f for f in functions if f["name"] not in held_out]
                else:
                    functions = entry["function"]
                yield BfclRequest(
                    entry["id"], category, _body(entry["question"][0], functions, category)
                )

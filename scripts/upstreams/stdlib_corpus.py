"""The training text of the tiny tokenizer: docstrings of a fixed list of standard-library modules.

Standard library only, and run by tiny_tokenizer.corpus() as `python -I -S stdlib_corpus.py` so
that nothing but the standard library is loaded: third-party imports patch stdlib classes
(transformers adds methods to logging.Logger) and would change the text, and so the vocabulary.
Prints the texts as a JSON list.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

# Modules whose docstrings make the corpus: a sorted, fixed list (not "every module found"),
# so installing a package into the venv cannot change the tokenizer. Chosen for varied English
# prose plus code-like text (signatures, examples, JSON, regex, paths).
CORPUS_MODULES = sorted(
    [
        "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
        "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
        "email", "enum", "fractions", "ftplib", "functools", "gettext", "glob", "gzip", "hashlib",
        "heapq", "hmac", "html", "http.client", "http.server", "imaplib", "inspect", "io",
        "ipaddress", "itertools", "json", "locale", "logging", "mailbox", "mimetypes", "multiprocessing",
        "netrc", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "platform",
        "plistlib", "poplib", "pprint", "pydoc", "queue", "random", "re", "sched", "secrets",
        "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "socketserver", "sqlite3",
        "ssl", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
        "timeit", "tokenize", "traceback", "turtle", "typing", "unittest", "urllib.parse",
        "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
        "xml.etree.ElementTree", "zipfile", "zoneinfo",
    ]
)  # fmt: skip

# A little chat- and API-shaped text so the merges cover what tests send.
EXTRA_TEXT = """\
{"role": "user", "content": "What is the weather in Paris today?"}
{"role": "assistant", "content": "It is sunny and 21 degrees."}
{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}
{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
Hello! How can I help you today? Please answer in one short sentence.
"""


def _docstrings(module_name: str) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a module missing from a minimal build (e.g. turtle without tkinter)
        return []
    texts = [inspect.getdoc(module) or ""]
    for name in sorted(vars(module)):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module.__name__:
            continue  # re-exports would be counted twice
        texts.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            for attr in sorted(vars(obj)):
                if not attr.startswith("_"):
                    texts.append(inspect.getdoc(getattr(obj, attr, None)) or "")
    return [t for t in texts if t]


def corpus() -> list[str]:
    """The training texts, in a fixed order."""
    texts: list[str] = []
    for name in CORPUS_MODULES:
        texts.extend(_docstrings(name))
    texts.append(EXTRA_TEXT)
    return texts


if __name__ == "__main__":
    json.dump(corpus(), sys.stdout)

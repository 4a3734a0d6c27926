"""The server's own account of a finding, read from its log: signal or exception, culprit frame,
and the upstream component a report points at."""

from __future__ import annotations

from pathlib import Path

from fuzz.live._component import component_of
from fuzz.live._evidence import ServerLog, kernel_lines_about, parse_log

SITE = "/c/venv/lib/python3.11/site-packages"
# What faulthandler prints when llama.cpp dereferences a NULL grammar sampler.
SEGFAULT = f"""INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK
Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/llama_cpp/_internals.py", line 660 in add_grammar
  File "{SITE}/llama_cpp/llama.py", line 700 in _init_sampler
  File "{SITE}/llama_cpp/server/app.py", line 400 in create_completion
  File "{SITE}/starlette/concurrency.py", line 40 in run_in_threadpool

Extension modules: numpy.core._multiarray_umath (total: 1)
"""
# A 500 whose traceback a client that went away follows (another request's noise).
RECURSION = f"""ERROR 12-07 10:00:00 [serving_chat.py:1] Error in chat completion
Traceback (most recent call last):
  File "{SITE}/vllm/entrypoints/openai/serving_chat.py", line 90, in create_chat_completion
    tool_calls = parse(args)
  File "{SITE}/vllm/entrypoints/openai/tool_parsers/utils.py", line 30, in partial_json_loads
    return json.loads(s)
  File "/usr/lib/python3.11/json/decoder.py", line 353, in raw_decode
    obj, end = self.scan_once(s, idx)
RecursionError: maximum recursion depth exceeded while decoding a JSON array
INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error
Traceback (most recent call last):
  File "/usr/lib/python3.11/socketserver.py", line 834, in write
BrokenPipeError: [Errno 32] Broken pipe
"""


def test_a_segfault_is_named_by_the_faulting_threads_innermost_frame() -> None:
    ev = parse_log(SEGFAULT)
    assert ev.signal == "SIGSEGV"
    assert ev.signature == "SIGSEGV@llama_cpp/_internals.py:add_grammar"
    d = ev.to_dict()
    assert d["frames"][0] == "llama_cpp/_internals.py:660 add_grammar"
    assert component_of(d, {"grammar": "o"}, "llama_cpp") == {
        "component": "llama_cpp/_internals.py",
        "function": "add_grammar",
        "basis": "stack",
    }


def test_an_exception_is_named_past_stdlib_frames_and_transport_noise() -> None:
    ev = parse_log(RECURSION)
    assert ev.exception == "RecursionError"
    assert ev.signature == (
        "RecursionError@vllm/entrypoints/openai/tool_parsers/utils.py:partial_json_loads"
    )
    assert "maximum recursion depth" in (ev.message or "")


def test_without_a_stack_the_request_field_names_the_component() -> None:
    body = {"model": "m", "allowed_token_ids": [1], "response_format": {"type": "json_object"}}
    assert component_of({}, body, "vllm")["component"] == "vllm/v1/structured_output"
    assert component_of(None, {"model": "m", "grammar": "o"}, "llama_cpp") == {
        "component": "llama_cpp/llama_grammar.py",
        "function": None,
        "basis": "request field grammar",
    }
    assert component_of(None, {"model": "m", "n": 9}, None)["component"] == "upstream:n"
    assert parse_log("INFO: all fine\n").signature is None


def test_the_log_is_read_from_the_mark_and_again_from_the_start_after_a_truncation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "server.log"
    path.write_text("old line\n")
    log = ServerLog(path)
    mark = log.mark()
    with path.open("a") as f:
        f.write("new line\n")
    assert log.since(mark) == "new line\n"
    path.write_text("restarted\n")  # a restart truncates it: shorter than the mark
    assert log.since(log.mark() + 100) == "restarted\n"


def test_kernel_lines_are_the_servers_only() -> None:
    dmesg = (
        "[  629.2] traps: python[22833] general protection fault ip:7f2f in libpython3.11.so\n"
        "[  638.2] python[23155]: segfault at 71 ip 00007fd4 error 4 in libpython3.11.so\n"
        "[  640.0] Out of memory: Killed process 23160 (python) total-vm:9000kB\n"
    )
    assert kernel_lines_about(dmesg, [23155]) == [dmesg.splitlines()[1]]
    assert kernel_lines_about(dmesg, [23160]) == [dmesg.splitlines()[2]]
    assert kernel_lines_about(dmesg, [1]) == []

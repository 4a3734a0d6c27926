"""Fuzz campaigns against live OpenAI-compatible servers: black-box, or differential against a
guard.

``schedguard fuzz run --target http://HOST:PORT`` fuzzes a running server (vLLM, llama.cpp, the
guard in front of one) from outside: structure-aware mutations of OpenAI requests seeded from
``payloads/`` (:mod:`fuzz.live._shapes`, :mod:`fuzz.live._mutator`), cost measured as latency,
resident memory of the server's processes or its Prometheus metrics, health, 5xx answers
(:mod:`fuzz.live._oracle`, :mod:`fuzz.live._monitor`). With ``--guard http://GUARD`` every
request is first judged by the guard's dry run, what it admits is sent to the upstream
directly, and what costs the upstream more than the guard accounted is a finding; so is a
benign payload the guard refuses that the upstream serves cheaply. Findings are confirmed,
minimised on the JSON structure against the server (:func:`fuzz.minimize.shrink_json`,
:mod:`fuzz.live._recorder`) and saved as payload files; the reports and exit status are those of
every campaign (:mod:`fuzz.report`). Loopback only unless told otherwise, at a bounded request
rate (:mod:`fuzz.live._http`).

When the server's log can be read (:mod:`fuzz.live._upstreams` finds it for the project's own
upstreams), each finding carries the server's own account (:mod:`fuzz.live._evidence`): its
exception or signal and culprit frame refine the finding's cause, name the upstream component
(:mod:`fuzz.live._component`) and the triage group (:mod:`fuzz.triage`); the campaign records
the upstream's versions, model and flags (:mod:`fuzz.live._environment`), and
:mod:`fuzz.issue` turns a group into a report to file upstream.
"""

from __future__ import annotations

from fuzz._exceptions import RemoteTargetRefused, TargetUnreachable
from fuzz.live._campaign import LiveOptions, find_listener, is_url, run_live_campaign
from fuzz.live._environment import capture_environment
from fuzz.live._fields import payload_class, shape_signature
from fuzz.live._http import HttpClient, Reply, RequestPacer, discover_model, require_loopback
from fuzz.live._monitor import Health, RssMonitor, parse_prometheus_rss
from fuzz.live._mutator import CorpusScheduler, RequestMutator
from fuzz.live._oracle import LiveBudgets, LiveOracle, Measured, error_signature, extract_usage
from fuzz.live._recorder import LiveRecorder
from fuzz.live._replay import LiveReplay, replay_live
from fuzz.live._request import BUILTIN_SEEDS, LiveRequest, load_seeds
from fuzz.live._shapes import OPERATORS, nest_grammar
from fuzz.live._target import LiveTarget, live_target_name

__all__ = [
    "BUILTIN_SEEDS",
    "OPERATORS",
    "CorpusScheduler",
    "Health",
    "HttpClient",
    "LiveBudgets",
    "LiveOptions",
    "LiveOracle",
    "LiveRecorder",
    "LiveReplay",
    "LiveRequest",
    "LiveTarget",
    "Measured",
    "RemoteTargetRefused",
    "Reply",
    "RequestMutator",
    "RequestPacer",
    "RssMonitor",
    "TargetUnreachable",
    "capture_environment",
    "discover_model",
    "error_signature",
    "extract_usage",
    "find_listener",
    "is_url",
    "live_target_name",
    "load_seeds",
    "nest_grammar",
    "parse_prometheus_rss",
    "payload_class",
    "replay_live",
    "require_loopback",
    "run_live_campaign",
    "shape_signature",
]

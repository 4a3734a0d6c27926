"""Benign and attack traffic through the guard, with an SLO gate and a live dashboard.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --headless -u 20 -t 60s \\
        --attack-share 0.3 --guard-url http://127.0.0.1:8080 --upstream-url http://127.0.0.1:8000

or ``schedguard load``, which starts the servers and passes their pids and URLs. Locust's
stats rows, by request type:

- ``BENIGN``: synthetic chat and completion requests (``chat``, ``chat stream``, ...), the full
  response time; ``TTFT`` and ``ITL``: time to first token and mean inter-token gap of each
  stream; ``LOOKALIKE``: the corpus's benign look-alikes (one row per payload; one that forces a
  tool call fails unless its whole answer carries the call, :mod:`loadtests.tool_calls`);
- ``ATTACK``: one row per THREATS class; a success is an attack *rejected* (a 4xx answer), a
  failure one that got through, timed out or broke the connection. A ``flood`` payload is sent
  as a burst of ``--flood-burst`` concurrent requests and counts once, rejected when any of
  them is refused.

Each user runs at most ``--user-rps`` requests a second (constant throughput), so the share of
attack requests follows the share of attacking users (``--attack-share`` of ``-u``). The shape
(``--shape steady|ramp|spike|burst``) sets the users over time. When the test ends the SLO gate
(:mod:`loadtests.slo`) prints its table, writes ``--slo-json`` and sets the exit code: 0 when
every check passes, 1 otherwise. Works with ``--master`` / ``--worker`` unchanged: the gate,
the shape and the resource monitor run on the master, the users on the workers.

``--scenario guided-compile`` runs issue 23's phase instead (:mod:`loadtests.guided`): one
``GuidedAppUser`` (the benign key) warming up to ``--guided-schemas`` distinct benign
structured-output schemas then repeating them (``BENIGN`` rows named by phase, gated like the
other benign requests), and one ``GuidedFloodUser`` (the attack key) sending a schema it never
sent before ``--guided-flood-rps`` times a second from ``--guided-flood-after-s`` on
(``GUIDED_FLOOD`` rows: a failure is a 5xx or no answer, a refusal is expected). The gate then
prints the per-tenant table and writes ``--guided-json``.

``--scenario fair-share`` runs issue 25's fair share phase (:mod:`loadtests.fairshare`, the
``fair`` shape): ``-u`` minus ``--fair-streams`` ``FairChatUser`` (the benign key) sending short
chats (``BENIGN`` rows ``fair chat solo`` and ``fair chat flood``), alone for
``--fair-solo-s``, then ``--fair-streams`` ``FairFloodUser`` (``--flood-key``) keeping long
streams open, ``--fair-unread`` of them never read (``FAIR_FLOOD`` rows). The gate adds the
ordinary tenant's p99 ratio and unanswered requests to its checks.
"""

from __future__ import annotations

import collections
import itertools
import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
import gevent.pool
from locust import LoadTestShape, User, constant_throughput, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from loadtests import dashboard, fairshare, guided, outcomes, progress, slo
from loadtests import timeline as tl
from loadtests.httpclient import KeepAlive, Response, hold_stream, send_raw
from loadtests.monitor import Monitor
from loadtests.prompts import BenignMix, make_request
from loadtests.replay import Replay, RoundRobin, load_attacks, load_lookalikes
from loadtests.shapes import ATTACK, BENIGN, SHAPES, ShapeSpec, tick
from loadtests.target import ATTACK_KEY, BENIGN_KEY, FLOOD_KEY, KINDS, REFERENCE_MODEL
from loadtests.tool_calls import forced_call_failure

_ids = itertools.count()
# Counters the SLO report shows beside locust's stats (client-side status/code of attacks,
# flood outcomes); workers send theirs to the master with each stats report.
_tally: collections.Counter[str] = collections.Counter()
_TALLY_KEY = "schedguard_tally"
# The run over time (loadtests.timeline): filled where the users run, merged on the master.
_timeline = tl.Timeline()
_TIMELINE_KEY = "schedguard_timeline"
_run_window: dict[str, float] = {}  # "start" and "stop" (epoch) of the test, on the master
_attacks: RoundRobin | None = None
_lookalikes: list[Replay] | None = None
_monitor: Monitor | None = None


_F = TypeVar("_F", bound=Callable[..., Any])


def _on(hook: Any) -> Callable[[_F], _F]:
    """``@_on(events.init)``: locust's ``add_listener`` as a typed decorator."""

    def register(fn: _F) -> _F:
        hook.add_listener(fn)
        return fn

    return register


def _options(environment: Environment) -> Any:
    """The parsed command line (``argparse.Namespace``, our arguments included)."""
    opts = environment.parsed_options
    assert opts is not None, "run through locust's command line"
    return opts


class _Failure(Exception):
    """A locust failure; its text is the row of locust's failure table (keep it low-cardinality)."""


# ------------------------------------------------------------------------------ arguments


@_on(events.init_command_line_parser)
def _arguments(parser: LocustArgumentParser) -> None:
    g = parser.add_argument_group("schedguard traffic")
    g.add_argument("--attack-share", type=float, default=0.3, help="fraction of users attacking")
    g.add_argument("--shape", choices=SHAPES, default="steady", help="load shape")
    g.add_argument("--user-rps", type=float, default=0.5, help="requests per second per user")
    g.add_argument("--chat-weight", type=float, default=3.0, help="weight of chat requests")
    g.add_argument("--completion-weight", type=float, default=1.0, help="weight of completions")
    g.add_argument("--stream-share", type=float, default=0.5, help="share of streamed requests")
    g.add_argument(
        "--lookalike-share",
        type=float,
        default=0.1,
        help="share of benign requests replaying the corpus's benign look-alikes",
    )
    g.add_argument(
        "--attack-classes", default="", help="comma-separated THREATS classes (default: all)"
    )
    g.add_argument("--flood-burst", type=int, default=30, help="requests per flood burst")
    g.add_argument(
        "--flood-hold-s", type=float, default=5.0, help="how long flood streams stay open"
    )
    g.add_argument("--attack-timeout-s", type=float, default=15.0, help="attack request timeout")
    g.add_argument("--request-timeout-s", type=float, default=60.0, help="benign request timeout")
    g.add_argument("--benign-key", default=BENIGN_KEY, help="API key of benign users")
    g.add_argument("--attack-key", default=ATTACK_KEY, help="API key of attackers")
    g.add_argument(
        "--attacks-left-out-json",
        default="",
        help="{attack id: why} of attacks not sent (another upstream's: loadtests/fit.py)",
    )
    g.add_argument(
        "--upstream-profile",
        default="vulnerable",
        help="reference profile behind the target: look-alikes it does not serve are skipped",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of prompts and attack order")
    g.add_argument(
        "--model",
        default=REFERENCE_MODEL,
        help="the served model: benign requests name it, and the corpus's bodies name it "
        "instead of the reference's",
    )
    g.add_argument(
        "--upstream-kind",
        choices=KINDS,
        default="reference",
        help="what serves the model: the benign look-alikes sent are those it serves "
        "(loadtests/fit.py)",
    )

    c = parser.add_argument_group("schedguard guided compile phase (--scenario guided-compile)")
    c.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="mixed",
        help="mixed: benign users and attackers (the default); guided-compile: issue 23's "
        "phase, one tenant warming benign schemas, another flooding unique ones (-u is ignored); "
        "fair-share: issue 25's phase, chats alone then beside a flood of long streams",
    )
    c.add_argument(
        "--guided-schemas",
        type=int,
        default=50,
        help="distinct benign schemas the app tenant warms then repeats (at most the corpus's)",
    )
    c.add_argument(
        "--guided-app-rps", type=float, default=5.0, help="app tenant's requests per second"
    )
    c.add_argument(
        "--guided-flood-rps",
        type=float,
        default=20.0,
        help="flood tenant's unique-schema requests per second",
    )
    c.add_argument(
        "--guided-flood-after-s",
        type=float,
        default=20.0,
        help="seconds into the run the flood starts (after the app's warm-up)",
    )
    c.add_argument(
        "--guided-json", default="", help="write the per-tenant figures of the phase here"
    )

    f = parser.add_argument_group("schedguard fair share phase (--scenario fair-share)")
    f.add_argument(
        "--fair-solo-s",
        type=float,
        default=0.0,
        help="seconds the chat tenant runs alone before the flood joins (0: a third of -t)",
    )
    f.add_argument("--fair-streams", type=int, default=8, help="flood streams open at once (of -u)")
    f.add_argument("--fair-unread", type=int, default=4, help="of them, never read")
    f.add_argument(
        "--fair-hold-s",
        type=float,
        default=30.0,
        help="seconds an unread stream holds its connection before hanging up",
    )
    f.add_argument(
        "--fair-flood-tokens",
        type=int,
        default=0,
        help="max_tokens of a flood stream (0: by --upstream-kind, loadtests/fairshare.py)",
    )
    f.add_argument(
        "--fair-flood-n", type=int, default=0, help="n of a flood stream (0: by --upstream-kind)"
    )
    f.add_argument("--fair-chat-tokens", type=int, default=16, help="max_tokens of a chat")
    f.add_argument(
        "--fair-chat-timeout-s",
        type=float,
        default=20.0,
        help="seconds a chat may take before it counts as unanswered",
    )
    f.add_argument("--flood-key", default=FLOOD_KEY, help="API key of the flood tenant")
    f.add_argument(
        "--slo-fair-max-p99-ratio",
        type=float,
        default=fairshare.FairThresholds().max_p99_ratio,
        help="the chat tenant's p99 under flood at most this times its solo p99",
    )

    m = parser.add_argument_group("schedguard monitor")
    m.add_argument("--guard-url", default="", help="guard base URL for /metrics")
    m.add_argument("--upstream-url", default="", help="upstream base URL for its health check")
    m.add_argument("--guard-pid", type=int, default=0, help="guard pid (RSS sampling)")
    m.add_argument("--upstream-pid", type=int, default=0, help="upstream pid (RSS sampling)")
    m.add_argument(
        "--guard-metrics-url",
        default="",
        help="without --guard-pid: the guard's Prometheus metrics (process_resident_memory_bytes)",
    )
    m.add_argument(
        "--upstream-metrics-url",
        default="",
        help="without --upstream-pid: the upstream's Prometheus metrics "
        "(process_resident_memory_bytes)",
    )
    m.add_argument("--sample-interval-s", type=float, default=1.0, help="RSS sampling period")

    s = parser.add_argument_group("schedguard SLO gate")
    d = slo.Thresholds()
    s.add_argument("--slo-p99-ms", type=float, default=d.p99_ms, help="benign p99 latency")
    s.add_argument("--slo-max-benign-errors", type=int, default=d.max_benign_errors)
    s.add_argument("--slo-min-attack-rejected", type=float, default=d.min_attack_rejected)
    s.add_argument("--slo-max-guard-rss-mb", type=float, default=d.max_guard_rss_mb)
    s.add_argument("--slo-max-upstream-rss-mb", type=float, default=d.max_upstream_rss_mb)
    s.add_argument("--slo-max-p99-ratio", type=float, default=d.max_p99_ratio)
    s.add_argument("--slo-baseline", default="", help="an earlier run's slo.json (p99 ratio)")
    s.add_argument("--slo-max-rss-slope", type=float, default=0.0, help="MB/min; 0: not gated")
    s.add_argument(
        "--slo-skip-upstream-check", action="store_true", help="do not require a live upstream"
    )
    s.add_argument("--slo-json", default="", help="write the SLO report here")
    s.add_argument(
        "--progress-json",
        default="",
        help="write the run's progress here every --progress-interval-s (schedguard load shows it)",
    )
    s.add_argument(
        "--progress-interval-s", type=float, default=2.0, help="period of --progress-json"
    )
    s.add_argument(
        "--timeline-json",
        default="",
        help="write the run over time here (latency, attack answers, RSS, rejections by code)",
    )


def _thresholds(opts: Any) -> slo.Thresholds:
    baseline = slo.load_baseline_p99(opts.slo_baseline) if opts.slo_baseline else None
    return slo.Thresholds(
        p99_ms=opts.slo_p99_ms,
        max_benign_errors=opts.slo_max_benign_errors,
        min_attack_rejected=opts.slo_min_attack_rejected,
        max_guard_rss_mb=opts.slo_max_guard_rss_mb or None,
        max_upstream_rss_mb=opts.slo_max_upstream_rss_mb or None,
        require_upstream_alive=not opts.slo_skip_upstream_check,
        max_p99_ratio=opts.slo_max_p99_ratio,
        baseline_p99_ms=baseline,
        max_rss_slope_mb_per_min=opts.slo_max_rss_slope or None,
    )


def _fair_spec(opts: Any) -> ShapeSpec:
    """The ``fair`` shape: ``-u`` users of which ``--fair-streams`` are the flood's."""
    streams = max(1, int(opts.fair_streams))
    users = max(streams + 1, int(getattr(opts, "num_users", None) or 0))
    run_time = float(opts.run_time) if getattr(opts, "run_time", None) else None
    solo = float(opts.fair_solo_s) or None
    return ShapeSpec("fair", users, streams, run_time, float(users), solo)


def _fair_config(opts: Any) -> dict[str, Any]:
    """What the phase sent (``numbers.fair_share.config``)."""
    spec = _fair_spec(opts)
    tokens, n = fairshare.flood_shape(opts.upstream_kind)
    return {
        "chat_users": spec.benign_users,
        "chat_rps_per_user": float(opts.user_rps),
        "chat_tokens": int(opts.fair_chat_tokens),
        "solo_s": round(spec.flood_from_s, 1),
        "streams": spec.attack_users,
        "unread": min(int(opts.fair_unread), spec.attack_users),
        "hold_s": float(opts.fair_hold_s),
        "flood_tokens": int(opts.fair_flood_tokens) or tokens,
        "flood_n": int(opts.fair_flood_n) or n,
    }


def _shape_spec(environment: Environment) -> ShapeSpec:
    opts = _options(environment)
    if opts.scenario == "fair-share":
        return _fair_spec(opts)
    users = max(1, int(getattr(opts, "num_users", None) or 1))
    share = min(max(float(opts.attack_share), 0.0), 1.0)
    attackers = min(users, round(users * share))
    if share > 0 and attackers == 0:
        attackers = 1
    if opts.shape == "burst" and attackers == users:
        attackers = users - 1
    # Locust's default -r of 1/s would take a minute to start 60 users: all within a second.
    spawn = getattr(opts, "spawn_rate", None)
    return ShapeSpec(
        opts.shape,
        users,
        attackers,
        float(opts.run_time) if getattr(opts, "run_time", None) else None,
        float(spawn) if spawn and spawn != 1 else None,
    )


# ------------------------------------------------------------------------------ users


def _fire(
    user: User,
    request_type: str,
    name: str,
    seconds: float,
    length: int = 0,
    failure: str | None = None,
) -> None:
    user.environment.events.request.fire(
        request_type=request_type,
        name=name,
        response_time=seconds * 1000.0,
        response_length=length,
        exception=_Failure(failure) if failure else None,
        context={},
    )


def _process_seed(environment: Environment) -> int:
    """The run's seed, distinct per worker (workers would otherwise replay the same order)."""
    index = getattr(environment.runner, "worker_index", 0) if environment.runner else 0
    return int(_options(environment).seed) * 1000 + int(index or 0)


def _lookalike_replays(environment: Environment) -> list[Replay]:
    global _lookalikes
    if _lookalikes is None:
        opts = _options(environment)
        profile = opts.upstream_profile
        _lookalikes = load_lookalikes(
            None if profile == "any" else profile, kind=opts.upstream_kind, model=opts.model
        )
    return _lookalikes


def _attacks_left_out(environment: Environment) -> dict[str, str]:
    path = _options(environment).attacks_left_out_json
    if not path:
        return {}
    with open(path) as f:
        left: dict[str, str] = json.load(f)
    return left


def _attack_cycle(environment: Environment) -> RoundRobin:
    global _attacks
    if _attacks is None:
        opts = _options(environment)
        classes = [c.strip() for c in opts.attack_classes.split(",") if c.strip()] or None
        left = _attacks_left_out(environment)
        attacks = [a for a in load_attacks(classes, model=opts.model) if a.id not in left]
        _attacks = RoundRobin(attacks, seed=_process_seed(environment))
    return _attacks


class _PacedClient(User):
    """A client of one key on one kept-alive connection, sending ``rps`` requests a second."""

    abstract = True

    def _connect(self, rps: float, key: str, timeout_s: float) -> None:
        self.conn = KeepAlive(self.host or "", timeout_s)
        self.pace = constant_throughput(rps)
        self.auth = ("authorization", f"Bearer {key}")
        self.headers = [("content-type", "application/json"), self.auth]

    def wait_time(self) -> float:
        return self.pace(self)

    def on_stop(self) -> None:
        self.conn.close()


class BenignUser(_PacedClient):
    """An OpenAI API client: chat and completions, streamed or not, realistic lengths."""

    weight = 7

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.rng = random.Random(_process_seed(self.environment) * 1_000_003 + next(_ids))
        self.mix = BenignMix(
            chat_weight=opts.chat_weight,
            completion_weight=opts.completion_weight,
            stream_share=opts.stream_share,
            model=opts.model,
        )
        self.lookalike_share = opts.lookalike_share
        self._connect(opts.user_rps, opts.benign_key, opts.request_timeout_s)

    @task
    def request(self) -> None:
        if self.lookalike_share > 0 and self.rng.random() < self.lookalike_share:
            self._lookalike()
            return
        req = make_request(self.rng, self.mix)
        if req.stream:
            self._stream("BENIGN", req.name, req.path, req.body)
        else:
            resp = self.conn.request("POST", req.path, req.body, self.headers)
            _fire(self, "BENIGN", req.name, resp.elapsed_s, len(resp.body), _benign_failure(resp))

    def _stream(self, kind: str, name: str, path: str, body: bytes) -> None:
        res = self.conn.stream("POST", path, body, self.headers)
        failure = None
        if res.status != 200:
            failure = _benign_failure(Response(res.status, res.body, res.error))
        elif res.error:
            failure = res.error
        _fire(self, kind, name, res.elapsed_s, len(res.body), failure)
        if failure is None and res.ttft_s is not None:
            _fire(self, "TTFT", name, res.ttft_s)
            if res.itl_mean_s is not None:
                _fire(self, "ITL", name, res.itl_mean_s)

    def _lookalike(self) -> None:
        replays = _lookalike_replays(self.environment)
        if not replays:
            return
        replay = self.rng.choice(replays)
        body = replay.body()
        if b'"stream":true' in body:
            self._stream("LOOKALIKE", replay.id, replay.path, body)
            return
        resp = self.conn.request(replay.method, replay.path, body, self.headers)
        failure = _benign_failure(resp) or forced_call_failure(body, resp.body)
        _fire(self, "LOOKALIKE", replay.id, resp.elapsed_s, len(resp.body), failure)


def _benign_failure(resp: Response) -> str | None:
    if resp.status == 0:
        return resp.error or "no response"
    if resp.status >= 300:
        return f"HTTP {resp.status} {resp.code or ''}".strip()
    return None


def _rejected(status: int) -> bool:
    return 400 <= status < 500


def _record(replay: Replay, resp: Response) -> str:
    """The attack's answer as a record of loadtests.outcomes (the gate and report read these)."""
    aim = outcomes.intent(replay.flood, replay.expect_code)
    return outcomes.key(replay.class_, aim, resp.status, resp.code, resp.error or "")


class AttackUser(User):
    """Replays the attack corpus (every THREATS class) in a shuffled round robin."""

    weight = 3

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.opts = opts
        self.cycle = _attack_cycle(self.environment)
        self.pace = constant_throughput(opts.user_rps)
        self.auth = ("authorization", f"Bearer {opts.attack_key}")

    def wait_time(self) -> float:
        return self.pace(self)

    def _send(self, replay: Replay, hold_s: float | None = None) -> Response:
        headers = replay.headers()
        if not any(k.lower() == "authorization" for k, _ in headers):
            headers = [*headers, self.auth]
        return send_raw(
            self.host or "",
            replay.method,
            replay.path,
            headers,
            replay.body(),
            replay.transport,
            timeout_s=self.opts.attack_timeout_s,
            hold_s=hold_s,
        )

    @task
    def attack(self) -> None:
        replay = self.cycle.next()
        if replay.flood:
            self._flood(replay)
            return
        resp = self._send(replay)
        _tally[f"attack {resp.status or resp.error} {resp.code or '-'}"] += 1
        _timeline.attack(time.time(), _record(replay, resp))
        failure = None
        if not _rejected(resp.status):
            what = f"served {resp.status}" if resp.status else (resp.error or "no response")
            failure = f"{replay.id}: {what}"
        elif resp.status != replay.expect_status or (
            replay.expect_code is not None and resp.code != replay.expect_code
        ):
            _tally[f"unexpected {replay.id} {resp.status} {resp.code}"] += 1
        _fire(self, "ATTACK", replay.class_, resp.elapsed_s, len(resp.body), failure)

    def _flood(self, replay: Replay) -> None:
        burst = max(1, int(self.opts.flood_burst))
        hold = self.opts.flood_hold_s
        pool = gevent.pool.Pool(burst)
        started = time.time()
        start = time.perf_counter()
        results: list[Response] = list(
            pool.imap_unordered(lambda _: self._send(replay, hold), range(burst))
        )
        elapsed = time.perf_counter() - start
        refused = [r for r in results if _rejected(r.status) or r.status == 503]
        admitted = sum(1 for r in results if 200 <= r.status < 300)
        _tally[f"flood {replay.id} admitted"] += admitted
        _tally[f"flood {replay.id} refused"] += len(refused)
        for r in refused:
            _tally[f"attack {r.status} {r.code or '-'}"] += 1
        for r in results:
            _timeline.attack(started + r.elapsed_s, _record(replay, r))
        stopped = outcomes.burst_stopped([(r.status, r.code) for r in results])
        _timeline.burst(started + elapsed, stopped)
        failure = (
            None if refused else f"{replay.id}: flood of {burst} not refused ({admitted} served)"
        )
        _fire(self, "ATTACK", replay.class_, elapsed, 0, failure)


# ------------------------------------------------------------------------------ guided compile

SCENARIOS = ("mixed", "guided-compile", "fair-share")
_guided_t0: list[float] = []  # when this process's first guided user started
_guided_schemas: list[guided.BenignSchema] | None = None


def _guided_start() -> float:
    if not _guided_t0:
        _guided_t0.append(time.time())
    return _guided_t0[0]


def _benign_schemas(limit: int) -> list[guided.BenignSchema]:
    global _guided_schemas
    if _guided_schemas is None:
        _guided_schemas = guided.benign_schemas(limit)
    return _guided_schemas


class GuidedAppUser(_PacedClient):
    """The app tenant: each benign schema once (warm), then the same ones again, round robin."""

    weight = 1

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.t0 = _guided_start()
        self.flood_at = self.t0 + float(opts.guided_flood_after_s)
        self.schemas = _benign_schemas(int(opts.guided_schemas))
        self.sent = 0
        self._connect(opts.guided_app_rps, opts.benign_key, opts.request_timeout_s)

    @task
    def request(self) -> None:
        if not self.schemas:
            return
        schema = self.schemas[self.sent % len(self.schemas)]
        name = guided.phase_of(self.sent >= len(self.schemas), time.time() >= self.flood_at)
        self.sent += 1
        headers = [*schema.headers, self.auth]
        if schema.stream:
            res = self.conn.stream("POST", schema.path, schema.body, headers)
            resp = Response(res.status, res.body, res.error)
            failure = _benign_failure(resp) or res.error
        else:
            resp = self.conn.request("POST", schema.path, schema.body, headers)
            failure = _benign_failure(resp)
        _tally[guided.tally_key(guided.APP, resp.status, resp.code, resp.error)] += 1
        _fire(self, "BENIGN", name, resp.elapsed_s, len(resp.body), failure)


class GuidedFloodUser(User):
    """The flood tenant: from ``--guided-flood-after-s`` on, a schema never sent before
    ``--guided-flood-rps`` times a second, each on a connection of its own, not waiting for
    the answers (at most 64 in flight)."""

    weight = 1

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.opts = opts
        self.start_at = _guided_start() + float(opts.guided_flood_after_s)
        self.pace = constant_throughput(opts.guided_flood_rps)
        self.pool = gevent.pool.Pool(64)
        self.nonce = f"{_process_seed(self.environment)}x{random.getrandbits(32):08x}"
        self.n = 0
        self.auth = ("authorization", f"Bearer {opts.attack_key}")

    def wait_time(self) -> float:
        ahead = self.start_at - time.time()
        return ahead if ahead > 0 else self.pace(self)

    def on_stop(self) -> None:
        self.pool.join(timeout=self.opts.attack_timeout_s)

    @task
    def flood(self) -> None:
        if time.time() < self.start_at:
            return
        body = guided.unique_body(self.n, self.nonce)
        self.n += 1
        self.pool.spawn(self._send, body)

    def _send(self, body: bytes) -> None:
        headers = [("content-type", "application/json"), self.auth]
        resp = send_raw(
            self.host or "",
            "POST",
            "/v1/chat/completions",
            headers,
            body,
            timeout_s=self.opts.attack_timeout_s,
        )
        _tally[guided.tally_key(guided.FLOOD, resp.status, resp.code, resp.error)] += 1
        failure = None
        if resp.status == 0 or resp.status >= 500:
            failure = f"HTTP {resp.status} {resp.code or ''}".strip() if resp.status else resp.error
        _fire(self, "GUIDED_FLOOD", "unique schema", resp.elapsed_s, len(resp.body), failure)


def _guided_summary(environment: Environment) -> dict[str, Any]:
    assert environment.runner is not None
    opts = _options(environment)
    entries = environment.runner.stats.entries
    latency: dict[str, tuple[int, float | None, float | None]] = {}
    for phase in guided.PHASES:
        entry = entries.get((phase, "BENIGN"))
        if entry is None or not entry.num_requests:
            latency[phase] = (0, None, None)
            continue
        latency[phase] = (
            entry.num_requests,
            float(entry.get_response_time_percentile(0.5)),
            float(entry.get_response_time_percentile(0.99)),
        )
    return guided.summarize(
        _tally,
        latency,
        schemas=len(_benign_schemas(int(opts.guided_schemas))),
        flood_after_s=float(opts.guided_flood_after_s),
        flood_rps=float(opts.guided_flood_rps),
    )


# ------------------------------------------------------------------------------ fair share

_fair_t0: list[float] = []  # when this process's first fair share user started
_flood_ids = itertools.count()


def _fair_flood_at(opts: Any) -> float:
    """When the flood joins, on this process's clock (the shape adds the flood's users then)."""
    if not _fair_t0:
        _fair_t0.append(time.time())
    return _fair_t0[0] + _fair_spec(opts).flood_from_s


def _fair_record(tenant: str, segment: str, label: str, ms: float | None, tokens: int) -> None:
    """One answer (``label``; '' when only ``tokens`` arrived) in the timeline's records."""
    now = time.time()
    if label:
        _timeline.count(now, fairshare.series_name("", tenant, segment), label)
    if ms is not None:
        _timeline.latency(now, fairshare.series_name("lat", tenant, segment), ms)
    if tokens:
        _timeline.count(now, fairshare.series_name("tokens", tenant, segment), "tokens", tokens)


class FairChatUser(_PacedClient):
    """The ordinary tenant: short chats, one at a time, ``--user-rps`` each."""

    weight = 1

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.flood_at = _fair_flood_at(opts)
        self._connect(opts.user_rps, opts.benign_key, opts.fair_chat_timeout_s)
        self.body = fairshare.chat_body(opts.model, int(opts.fair_chat_tokens))

    @task
    def chat(self) -> None:
        segment = fairshare.segment_of(time.time() >= self.flood_at)
        resp = self.conn.request("POST", fairshare.CHAT_PATH, self.body, self.headers)
        failure = _benign_failure(resp)
        label = fairshare.status_label(resp.status, resp.code, resp.error)
        ok = failure is None
        tokens = fairshare.completion_tokens(resp.body) if ok else 0
        _fair_record(fairshare.CHAT, segment, label, resp.elapsed_s * 1000 if ok else None, tokens)
        _fire(self, "BENIGN", f"fair chat {segment}", resp.elapsed_s, len(resp.body), failure)


class FairFloodUser(User):
    """The flood tenant: one long stream after another; the first ``--fair-unread`` of this
    process's flood users never read theirs and hold the connection ``--fair-hold-s``."""

    weight = 1

    def on_start(self) -> None:
        opts = _options(self.environment)
        self.opts = opts
        self.unread = next(_flood_ids) < int(opts.fair_unread)
        config = _fair_config(opts)
        self.body = fairshare.flood_body(opts.model, config["flood_tokens"], config["flood_n"])
        self.headers = [
            ("content-type", "application/json"),
            ("authorization", f"Bearer {opts.flood_key}"),
        ]
        self.pause = 0.0

    def wait_time(self) -> float:
        return self.pause

    @task
    def flood(self) -> None:
        opts = self.opts
        tenant, segment = fairshare.FLOOD, fairshare.FLOOD_SEGMENT

        def head(status: int, seconds: float) -> None:
            # Served: recorded as the answer begins (a stream the run's end cuts short still
            # counts); a refusal is recorded below, with its code.
            if 200 <= status < 300:
                _fair_record(
                    tenant, segment, fairshare.status_label(status, None), seconds * 1000, 0
                )

        def tokens(n: int) -> None:
            _fair_record(tenant, segment, "", None, n)

        res = hold_stream(
            self.host or "",
            fairshare.CHAT_PATH,
            self.headers,
            self.body,
            read=not self.unread,
            hold_s=float(opts.fair_hold_s),
            timeout_s=max(float(opts.fair_hold_s), float(opts.request_timeout_s)) + 5.0,
            on_head=head,
            on_tokens=tokens,
        )
        ok = 200 <= res.status < 300
        if not ok:
            label = fairshare.status_label(res.status, res.code, res.error)
            _fair_record(tenant, segment, label, None, 0)
        # A refusal comes back at once: do not spin on it.
        self.pause = 0.0 if ok else 0.2
        failure = None if ok or res.status else (res.error or "no response")
        name = "unread stream" if self.unread else "read stream"
        _fire(self, "FAIR_FLOOD", name, res.elapsed_s, 0, failure)


_CLASSES: dict[str, type[User]] = {BENIGN: BenignUser, ATTACK: AttackUser}
_FAIR_CLASSES: dict[str, type[User]] = {BENIGN: FairChatUser, ATTACK: FairFloodUser}


class ScenarioShape(LoadTestShape):
    """``--shape`` over ``-u`` users and ``-t`` seconds (see :mod:`loadtests.shapes`)."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | tuple[int, float, list[type[User]] | None] | None:
        assert self.runner is not None
        opts = _options(self.runner.environment)
        elapsed = time.perf_counter() - float(self.start_time)
        if opts.scenario == "guided-compile":
            # one app user and one flood user for -t seconds (-u is ignored)
            run_time = getattr(opts, "run_time", None)
            if run_time and elapsed > float(run_time):
                return None
            return 2, 2.0, [GuidedAppUser, GuidedFloodUser]
        spec = _shape_spec(self.runner.environment)
        now = tick(spec, elapsed)
        if now is None:
            return None
        by_name = _FAIR_CLASSES if opts.scenario == "fair-share" else _CLASSES
        classes = [by_name[c] for c in now.classes] if now.classes else None
        return now.users, now.spawn_rate, classes


# ------------------------------------------------------------------------------ events


@_on(events.init)
def _on_init(environment: Environment, **_: Any) -> None:
    opts = _options(environment)
    if opts is None or isinstance(environment.runner, WorkerRunner):
        return
    if getattr(opts, "num_users", None):
        spec = _shape_spec(environment)
        # Exact counts when all users run (steady): the dispatcher splits users by weight.
        BenignUser.weight = FairChatUser.weight = max(1, spec.benign_users)
        AttackUser.weight = FairFloodUser.weight = max(1, spec.attack_users)
    global _monitor
    _monitor = Monitor(
        sample_interval_s=max(0.1, float(opts.sample_interval_s)),
        guard_pid=opts.guard_pid or None,
        upstream_pid=opts.upstream_pid or None,
        guard_url=opts.guard_url or None,
        upstream_url=opts.upstream_url or None,
        guard_metrics_url=opts.guard_metrics_url or None,
        upstream_metrics_url=opts.upstream_metrics_url or None,
    )
    if environment.web_ui is not None:
        dashboard.install(environment, lambda: _live_status(environment))
    gevent.spawn(_sample_forever, environment, _monitor)
    if opts.progress_json:
        gevent.spawn(_progress_forever, environment)


_USER_CLASSES = {
    "BenignUser": BENIGN,
    "AttackUser": ATTACK,
    "GuidedAppUser": BENIGN,
    "GuidedFloodUser": ATTACK,
    "FairChatUser": BENIGN,
    "FairFloodUser": ATTACK,
}


def _users_by_class(environment: Environment) -> dict[str, int]:
    runner = environment.runner
    if runner is None:
        return {}
    if isinstance(runner, MasterRunner):
        counts = dict(runner.reported_user_classes_count)
    else:
        counts = dict(runner.user_classes_count)
    # Two classes run as each kind (the mixed run's and the guided phase's): summed, not
    # overwritten by whichever is listed last (with 0 users).
    by_kind: dict[str, int] = {}
    for name, count in counts.items():
        kind = _USER_CLASSES.get(name, name)
        by_kind[kind] = by_kind.get(kind, 0) + count
    return by_kind


def _sample_forever(environment: Environment, monitor: Monitor) -> None:
    n = 0
    while True:
        try:
            if "start" in _run_window and "stop" not in _run_window:
                _timeline.sample_users(time.time(), _users_by_class(environment))
            monitor.sample()
            if n % monitor.scrape_every == 0:
                monitor.scrape()
        except Exception as exc:  # keep sampling; the dashboard shows the error
            monitor.metrics_error = f"{type(exc).__name__}: {exc}"[:200]
        n += 1
        gevent.sleep(monitor.sample_interval_s)


def _progress(environment: Environment, report: slo.Report, *, final: bool) -> None:
    """The report's numbers so far as ``--progress-json`` (:mod:`loadtests.progress`)."""
    opts = _options(environment)
    start = _run_window.get("start")
    if start is None:
        return
    run_time = getattr(opts, "run_time", None)
    snapshot = progress.of_numbers(
        report.numbers,
        elapsed_s=_run_window.get("stop", time.time()) - start,
        total_s=float(run_time) if run_time else None,
        users=_users_by_class(environment),
        final=final,
    )
    progress.write(opts.progress_json, snapshot)


def _progress_forever(environment: Environment) -> None:
    opts = _options(environment)
    interval = max(0.2, float(opts.progress_interval_s))
    while True:
        gevent.sleep(interval)
        if "start" not in _run_window or "stop" in _run_window:
            continue
        try:
            # The gate's own evaluation of the records so far: the same numbers, not a copy.
            report = evaluate(environment, collect(environment, _monitor))
            _progress(environment, report, final=False)
        except Exception as exc:  # progress is a view: never let it stop the run
            print(f"progress: {type(exc).__name__}: {exc}", flush=True)


@_on(events.request)
def _on_request(
    request_type: str, response_time: float, exception: BaseException | None, **_: Any
) -> None:
    if request_type in tl.KINDS:
        _timeline.request(time.time(), request_type, response_time or 0.0, exception is not None)


@_on(events.test_start)
def _on_test_start(environment: Environment, **_: Any) -> None:
    if not isinstance(environment.runner, WorkerRunner):
        _run_window.clear()
        _run_window["start"] = time.time()


@_on(events.test_stop)
def _on_test_stop(environment: Environment, **_: Any) -> None:
    if not isinstance(environment.runner, WorkerRunner):
        _run_window.setdefault("stop", time.time())


@_on(events.report_to_master)
def _report_tally(client_id: str, data: dict[str, Any]) -> None:
    data[_TALLY_KEY] = dict(_tally)
    _tally.clear()
    data[_TIMELINE_KEY] = _timeline.drain()


@_on(events.worker_report)
def _merge_tally(client_id: str, data: dict[str, Any]) -> None:
    _tally.update(data.get(_TALLY_KEY) or {})
    _timeline.merge(data.get(_TIMELINE_KEY) or {})


def collect(environment: Environment, monitor: Monitor | None) -> slo.RunData:
    """Locust's stats and the monitor's samples as :class:`slo.RunData`."""
    assert environment.runner is not None
    stats = environment.runner.stats
    data = slo.RunData()
    benign_hist: collections.Counter[int] = collections.Counter()
    ttft: collections.Counter[int] = collections.Counter()
    itl: collections.Counter[int] = collections.Counter()
    for (_, method), entry in stats.entries.items():
        if method == "BENIGN":
            benign_hist.update(entry.response_times)
            data.benign_requests += entry.num_requests
            data.benign_failures += entry.num_failures
        elif method == "LOOKALIKE":
            data.lookalike_requests += entry.num_requests
            data.lookalike_failures += entry.num_failures
        elif method == "TTFT":
            ttft.update(entry.response_times)
        elif method == "ITL":
            itl.update(entry.response_times)
    data.benign_latency_ms = dict(benign_hist)
    data.ttft_ms = dict(ttft)
    data.itl_ms = dict(itl)
    for err in stats.errors.values():
        text = f"{err.error} (x{err.occurrences})"
        if err.method == "ATTACK":
            data.attack_failures.append(text)
        elif err.method in ("BENIGN", "LOOKALIKE"):
            data.benign_failure_samples.append(f"{err.name}: {text}")
    total = stats.total
    if total.num_requests and total.last_request_timestamp is not None:
        data.duration_s = max(0.0, total.last_request_timestamp - total.start_time)
    # The attacks from the timeline's records, which timeline.json and the report read too.
    data.attack_records = tl.attack_records(_timeline.buckets)
    data.flood_bursts = tl.burst_records(_timeline.buckets)
    data.client_codes = {k: v for k, v in _tally.items() if k.startswith(("attack", "flood"))}
    opts = _options(environment)
    data.target = {
        "host": environment.host,
        "shape": "fair" if opts.scenario == "fair-share" else opts.shape,
        "scenario": opts.scenario,
        "users": getattr(opts, "num_users", None),
        "attack_share": opts.attack_share,
        "upstream_profile": opts.upstream_profile,
        "upstream_kind": opts.upstream_kind,
        "model": opts.model,
        "attacks_left_out": _attacks_left_out(environment),
        "unexpected_codes": {k: v for k, v in _tally.items() if k.startswith("unexpected")},
    }
    if monitor is not None:
        data.target["memory_from"] = {w.name: w.source for w in (monitor.guard, monitor.upstream)}
        data.guard_peak_rss = monitor.guard.peak
        data.upstream_peak_rss = monitor.upstream.peak
        data.guard_rejections = dict(monitor.metrics.rejections)
        data.rss_series = {
            w.name: list(w.series) for w in (monitor.guard, monitor.upstream) if w.series
        }
    return data


def evaluate(environment: Environment, data: slo.RunData) -> slo.Report:
    """The gate: :func:`slo.evaluate`, and the fair share phase's checks in that scenario."""
    opts = _options(environment)
    report = slo.evaluate(data, _thresholds(opts))
    if opts.scenario != "fair-share":
        return report
    th = fairshare.FairThresholds(max_p99_ratio=float(opts.slo_fair_max_p99_ratio))
    return fairshare.gate(report, fairshare.records(_timeline.buckets), th, _fair_config(opts))


def _timeline_data(monitor: Monitor | None) -> dict[str, Any]:
    now = time.time()
    t0 = _run_window.get("start") or (monitor.started_wall if monitor else now)
    rss: dict[str, list[tuple[float, int]]] = {}
    rejections: list[tuple[float, dict[str, float]]] = []
    died: dict[str, float] = {}
    periods: dict[str, float] = {}
    if monitor is not None:
        periods = monitor.periods()
        for w in (monitor.guard, monitor.upstream):
            rss[w.name] = [(monitor.wall(t), b) for t, b in w.series]
            if w.died_at is not None:
                died[w.name] = monitor.wall(w.died_at)
        rejections = [(monitor.wall(t), c) for t, c in monitor.rejection_series]
    return tl.build(
        _timeline,
        t0=t0,
        end=_run_window.get("stop", now),
        rss=rss,
        rejections=rejections,
        died=died,
        periods=periods,
    )


def _live_status(environment: Environment) -> dict[str, Any]:
    monitor = _monitor
    report = evaluate(environment, collect(environment, monitor))
    out = monitor.snapshot() if monitor is not None else {}
    out["slo"] = report.to_dict()
    return out


@_on(events.quitting)
def _gate(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or environment.runner is None:
        return
    monitor = _monitor
    if monitor is not None:
        monitor.sample()
        monitor.scrape()
    data = collect(environment, monitor)
    if monitor is not None:
        data.upstream_alive, data.upstream_status = monitor.upstream_health()
    opts = _options(environment)
    report = evaluate(environment, data)
    print("\n" + slo.render_table(report), flush=True)
    if "fair_share" in report.numbers:
        print("\n" + fairshare.render(report.numbers["fair_share"]), flush=True)
    if opts.scenario == "guided-compile":
        summary = _guided_summary(environment)
        print("\n" + guided.render(summary), flush=True)
        if opts.guided_json:
            guided.write(opts.guided_json, summary)
    if opts.slo_json:
        report.write_json(opts.slo_json)
    if opts.timeline_json:
        tl.write(opts.timeline_json, _timeline_data(monitor))
    environment.process_exit_code = 0 if report.passed else 1  # the verdict before the view
    if opts.progress_json:
        try:
            _progress(environment, report, final=True)
        except Exception as exc:  # progress is a view: it never takes the verdict away
            print(f"progress: {type(exc).__name__}: {exc}", flush=True)
    if monitor is not None:
        monitor.close()

"""The hypothesis engine: grammar strategies, ``target()`` on the measured cost.

One property per target (:func:`make_property`): draw an input from the target's grammar
(:func:`strategy_for`, built from :mod:`fuzz.strategies`), run it through a runner (the oracle,
or an in-process measurement), report ``Cost.scalar()`` and the cost per byte to
``hypothesis.target()`` so Hypothesis's targeted phase hill-climbs on them, and hand the outcome
to a callback. The same property serves three drivers:

- pytest: the callback asserts "no finding" and Hypothesis shrinks a counterexample
  (``tests/fuzz/test_hypothesis.py``);
- the campaign engine (:func:`run_engine`): the callback records findings in the run
  (:meth:`EngineRun.record`) and the property runs round after round (a fresh seed each, the
  example database in ``out_dir``) until the duration is spent;
- atheris (:func:`fuzz_one_input_for`, called by :mod:`fuzz.engines.atheris_harness`):
  libFuzzer's bytes drive the property through ``fuzz_one_input``; a finding raises
  :class:`~fuzz.CostFinding`, so libFuzzer saves it.

:func:`scheduler_machine` is the scheduler-state target as a ``RuleBasedStateMachine``: each
rule appends one op (submit, cancel, step, urgent submit, tick) and teardown runs the sequence.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hypothesis
import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.stateful import RuleBasedStateMachine, rule
from hypothesis.strategies import SearchStrategy

from fuzz import strategies as grammar
from fuzz._exceptions import CostFinding, RoundOver

if TYPE_CHECKING:
    from fuzz.engines._run import EngineResult, EngineRun
    from fuzz.oracle import Outcome
    from fuzz.targets import Budgets, FuzzTarget

__all__ = [
    "NAME",
    "ROUND_EXAMPLES",
    "Runner",
    "campaign_settings",
    "fuzz_one_input_for",
    "in_process_runner",
    "make_property",
    "run_engine",
    "scheduler_machine",
    "strategy_for",
]

NAME = "hypothesis"
Runner = Callable[[bytes], "Outcome"]
OnOutcome = Callable[[bytes, "Outcome"], None]
# Examples per campaign round: enough for the targeted phase to climb (Hypothesis suggests a
# few hundred at least), few enough that rounds with fresh seeds keep the search broad.
ROUND_EXAMPLES = 500
_PROGRESS_EVERY_S = 0.5


# --------------------------------------------------------------------------------- strategies


def strategy_for(target: FuzzTarget) -> SearchStrategy[bytes]:
    """Inputs for ``target`` in its own byte format, drawn from the matching grammar."""
    max_size = int(getattr(target, "max_size", 4096))
    name = target.name
    if name.startswith("placeholder"):
        from fuzz.targets.templates import join_placeholder_input

        return st.tuples(
            grammar.placeholder_templates(max_size=max_size), grammar.placeholder_variables()
        ).map(lambda t: join_placeholder_input(t[0], t[1]))
    if name.startswith("chat-template"):
        return grammar.jinja_chat_templates(max_size=max_size).map(_utf8)
    if name.startswith("guard"):
        return _guard_requests()
    if name.startswith("scheduler"):
        return grammar.scheduler_ops(max_ops=max_size // 4)
    seeds = target.seeds()
    fallback = st.binary(max_size=max_size)
    return st.one_of(st.sampled_from(seeds), fallback) if seeds else fallback


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _guard_requests() -> SearchStrategy[bytes]:
    from fuzz.targets.gateway import join_request

    def dump(body: dict[str, Any]) -> bytes:
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")

    chat = grammar.chat_request_bodies().map(dump)
    completion = grammar.completion_request_bodies().map(
        lambda b: join_request(dump(b), "/v1/completions")
    )
    return st.one_of(chat, chat, completion, grammar.json_bombs())


# ----------------------------------------------------------------------------------- property


def make_property(
    target: FuzzTarget,
    run: Runner,
    on_outcome: OnOutcome,
    *,
    strategy: SearchStrategy[bytes] | None = None,
) -> Callable[[], None]:
    """A ``@given`` test over ``target``'s grammar (no settings applied: callers add them).

    ``run`` measures one input; ``on_outcome(data, outcome)`` decides what a finding does
    (assert, record or raise)."""
    drawn = strategy_for(target) if strategy is None else strategy

    @hypothesis.given(data=drawn)
    def fuzz_property(data: bytes) -> None:
        outcome = run(data)
        hypothesis.target(outcome.cost.scalar(), label="cost")
        hypothesis.target(outcome.cost.per_byte(len(data)), label="cost per byte")
        hypothesis.event(f"verdict: {outcome.verdict}")
        on_outcome(data, outcome)

    fuzz_property.__name__ = f"fuzz_{target.name.replace('-', '_')}"
    return fuzz_property


def in_process_runner(target: FuzzTarget, budgets: Budgets | None = None) -> Runner:
    """Measure inputs in this process as the oracle's worker does, but with no CPU timer: an
    input runs to its end and a time budget crossed is classified then. Only for targets that
    bound themselves, or inside a process that is itself limited (the atheris harness)."""
    from fuzz._worker import MemProbe, execute_one
    from fuzz.oracle import classify

    probe = MemProbe()
    b = target.budgets if budgets is None else budgets

    def run(data: bytes) -> Outcome:
        return classify(execute_one(target, data, probe, None), b, len(data))

    return run


def campaign_settings(
    *, max_examples: int, database: Path | None = None, shrink: bool = False
) -> settings:
    """Settings for fuzzing: no deadline (the oracle has budgets), no health checks (inputs are
    meant to be slow and large), the targeted phase on."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if shrink:
        phases.append(Phase.shrink)
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=DirectoryBasedExampleDatabase(str(database)) if database is not None else None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
        report_multiple_bugs=False,
    )


# ------------------------------------------------------------------------------------ atheris


def fuzz_one_input_for(
    target: FuzzTarget, *, on_outcome: OnOutcome | None = None, budgets: Budgets | None = None
) -> Callable[[bytes], Any]:
    """``fuzz_one_input`` of ``target``'s property, for atheris: ``on_outcome`` sees every
    outcome, then a finding raises :class:`~fuzz.CostFinding`."""
    run = in_process_runner(target, budgets)

    def check(data: bytes, outcome: Outcome) -> None:
        if on_outcome is not None:
            on_outcome(data, outcome)
        if outcome.is_finding:
            raise CostFinding(outcome.summary())

    prop = make_property(target, run, check)
    configured = settings(
        database=None, deadline=None, suppress_health_check=list(HealthCheck), print_blob=False
    )(prop)
    fn: Callable[[bytes], Any] = configured.hypothesis.fuzz_one_input  # type: ignore[attr-defined]
    return fn


# ----------------------------------------------------------------------------------- campaign


def run_engine(run: EngineRun, *, round_examples: int = ROUND_EXAMPLES) -> EngineResult:
    """Run ``run.target``'s property round after round for the run's duration.

    One job (Hypothesis runs one test at a time; ``jobs`` is recorded, not used). The example
    database lives in ``out_dir/hypothesis-db`` when the run has an ``out_dir``, so a later
    campaign with the same ``out_dir`` starts from what this one kept; Hypothesis's own cache
    (``.hypothesis`` in the current directory otherwise) goes to ``out_dir/hypothesis-home``.
    """
    run.engine = run.engine or NAME
    opts = run.options
    oracle = run.oracle_factory()

    def on_outcome(data: bytes, outcome: Outcome) -> None:
        now = run.executed(outcome)
        if outcome.is_finding:
            run.record(data, outcome, oracle, at=now)
            if opts.stop_on_first:
                raise RoundOver
        run.report(every_s=_PROGRESS_EVERY_S)

    def measure(data: bytes) -> Outcome:
        if run.over():
            raise RoundOver
        return oracle.run(data)

    strategy = strategy_for(run.target)
    try:
        with _home_in(opts.out_dir):
            rounds = _rounds(
                run,
                lambda: make_property(run.target, measure, on_outcome, strategy=strategy),
                round_examples,
            )
    finally:
        oracle.close()
    run.report()
    return run.result(rounds=rounds, jobs_used=1)


@contextlib.contextmanager
def _home_in(out_dir: Path | None) -> Iterator[None]:
    """Hypothesis's storage (its cache of constants) under ``out_dir`` for the run, if given."""
    if out_dir is None:
        yield
        return
    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    previous = storage_directory(intent_to_write=False).home_directory
    set_hypothesis_home_dir(Path(out_dir) / "hypothesis-home")
    try:
        yield
    finally:
        set_hypothesis_home_dir(previous)


def _rounds(run: EngineRun, make: Callable[[], Callable[[], None]], round_examples: int) -> int:
    """Run a property from ``make`` in rounds, a fresh seed each, until the run is over;
    returns the number of rounds."""
    out_dir = run.options.out_dir
    database = Path(out_dir) / "hypothesis-db" if out_dir is not None else None
    base_seed = 0 if run.options.seed is None else run.options.seed
    rounds = 0
    while not run.over():
        # A fresh test each round: Hypothesis allows one settings object per function.
        configured = campaign_settings(max_examples=round_examples, database=database)(make())
        seeded = hypothesis.seed(base_seed * 1_000_003 + rounds)(configured)
        rounds += 1
        try:
            seeded()
        except RoundOver:
            break
        except Exception as exc:  # a harness error, not a finding: report it and stop
            run.error(exc)
            break
    return rounds


# ----------------------------------------------------------------------------- state machine


def scheduler_machine(
    run: Runner, on_outcome: OnOutcome, *, max_ops: int = 48
) -> type[RuleBasedStateMachine]:
    """The scheduler-state target as a state machine: rules append ops, teardown runs them.

    The target checks its invariants after every op and liveness at the end, so one run of the
    whole sequence checks every prefix; ``hypothesis.target()`` climbs on its cost (model work
    per input byte shows amplification)."""

    byte = st.integers(0, 255)

    class SchedulerOps(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ops = bytearray()
            self.ops.append(0)  # configuration byte, set by the first rule that wants it
            self.n = 0

        def _add(self, op: bytes) -> None:
            if self.n < max_ops:
                self.ops += op
                self.n += 1

        @rule(conf=byte)
        def configure(self, conf: int) -> None:
            self.ops[0] = conf

        @rule(length=byte, max_tokens=byte, priority=byte)
        def submit(self, length: int, max_tokens: int, priority: int) -> None:
            self._add(grammar.scheduler_op(grammar.SUBMIT, length, max_tokens, priority))

        @rule(index=byte)
        def cancel(self, index: int) -> None:
            self._add(grammar.scheduler_op(grammar.CANCEL, index))

        @rule(n=byte)
        def step(self, n: int) -> None:
            self._add(grammar.scheduler_op(grammar.STEP, n))

        @rule(length=byte, max_tokens=byte)
        def urgent(self, length: int, max_tokens: int) -> None:
            self._add(grammar.scheduler_op(grammar.URGENT, length, max_tokens))

        @rule(n=byte)
        def tick(self, n: int) -> None:
            self._add(grammar.scheduler_op(grammar.TICK, n))

        def teardown(self) -> None:
            data = bytes(self.ops)
            outcome = run(data)
            hypothesis.target(outcome.cost.per_byte(len(data)), label="cost per byte")
            on_outcome(data, outcome)

    return SchedulerOps

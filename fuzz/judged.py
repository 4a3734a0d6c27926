"""What a finding was judged against: the measurement that crossed, its budget, and how.

A report that shows one time beside one budget misleads when the verdict came from another
clock (a CPU timer that fired while the input's own CPU time reads lower, a wall-clock kill, a
latency budget widened per output token). :func:`judged_against` names the metric and the
budget the oracle actually compared, and the report shows it beside both the wall and the CPU
time of the finding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fuzz.oracle import Outcome

__all__ = ["judged_against", "judged_text"]


def judged_against(outcome: Outcome, budgets: dict[str, Any]) -> dict[str, Any]:
    """``metric``, ``measured``, ``budget`` and ``basis`` (a sentence) for one finding's outcome
    under the campaign's ``budgets`` (:meth:`fuzz.targets.Budgets.to_dict` of an in-process
    target, :meth:`fuzz.live.LiveBudgets.to_dict` of a live server)."""
    c = outcome.cost
    where = outcome.where or ""
    live = "timeout_s" in budgets  # a live server's budgets name the hang timeout
    wall_budget = budgets.get("wall_s")
    if outcome.verdict == "timeout":
        if live:
            limit = budgets.get("timeout_s")
            basis = f"no answer within the {limit} s timeout (wall clock)"
            return _out("wall_s", c.time_s, limit, basis)
        if (outcome.error_message or "").startswith("killed after"):
            basis = (
                "killed by the oracle on the wall clock after the worker had burnt the CPU budget"
                " (or stayed blocked past the longest wait)"
            )
            return _out("wall_s", c.time_s, wall_budget, basis)
        basis = (
            "the worker's CPU timer (ITIMER_PROF, the whole process) fired at the budget; the"
            " input's own CPU time can read lower"
        )
        return _out("cpu_s", c.cpu_s, wall_budget, basis)
    if where == "budget:wall_s":
        if live:
            basis = outcome.error_message or "latency over the budget"
            return _out("wall_s", c.time_s, wall_budget, basis)
        metric = "cpu_s" if c.cpu_s else "wall_s"
        return _out(metric, c.busy_s, wall_budget, f"{metric} over the time budget")
    if outcome.verdict == "oom" or where == "budget:mem_bytes":
        what = "resident memory growth" if live else "peak memory growth (or RLIMIT_AS)"
        return _out("peak_rss_bytes", c.peak_mem_bytes, budgets.get("mem_bytes"), what)
    if where == "budget:steps":
        return _out("steps", c.steps, budgets.get("steps"), "expansion steps over the budget")
    if where == "budget:output_tokens":
        return _out("output_tokens", c.output_tokens, budgets.get("output_tokens"), "tokens")
    if outcome.verdict == "cost_per_byte":
        return _out("cost_per_byte", None, budgets.get("cost_per_byte"), "cost per input byte")
    # Crashes, 5xx, under-counts, false positives: a fact, not a measurement near a budget.
    return _out(None, None, None, outcome.verdict)


def judged_text(j: dict[str, Any]) -> str:
    """One cell: ``cpu_s 0.942 / 1.0 (the worker's CPU timer ...)``."""
    if j.get("metric") is None:
        return str(j.get("basis", "-"))
    measured = j.get("measured")
    m = "-" if measured is None else f"{measured:.3f}" if isinstance(measured, float) else measured
    return f"{j['metric']} {m} against {j.get('budget')} ({j.get('basis')})"


def _out(metric: str | None, measured: float | None, budget: Any, basis: str) -> dict[str, Any]:
    value = round(measured, 6) if isinstance(measured, float) else measured
    return {"metric": metric, "measured": value, "budget": budget, "basis": basis}

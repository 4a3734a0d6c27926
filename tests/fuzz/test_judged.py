"""What a finding was judged against: the clock and the budget that decided it."""

from __future__ import annotations

from fuzz.judged import judged_against, judged_text
from fuzz.oracle import Outcome
from fuzz.targets import Budgets, Cost

BUDGETS = Budgets(wall_s=1.0, mem_bytes=64 << 20).to_dict()


def test_a_cpu_timer_timeout_names_the_cpu_clock_beside_a_longer_wall_time() -> None:
    # The case the summary misreported: 0.942 s of the input's CPU, 1.534 s of wall, 1 s budget.
    out = Outcome("timeout", Cost(time_s=1.534, cpu_s=0.942), "Timeout", "over 1.0 s", "timeout")
    j = judged_against(out, BUDGETS)
    assert j["metric"] == "cpu_s" and j["budget"] == 1.0 and j["measured"] == 0.942
    assert "ITIMER_PROF" in j["basis"]
    assert judged_text(j).startswith("cpu_s 0.942 against 1.0")


def test_a_wall_clock_kill_and_a_live_latency_budget_name_the_wall_clock() -> None:
    kill = Outcome("timeout", Cost(time_s=3.2, cpu_s=3.2), "Timeout", "killed after 3.20 s wall clock", "timeout")  # fmt: skip
    assert judged_against(kill, BUDGETS)["metric"] == "wall_s"
    live = {"wall_s": 20.0, "timeout_s": 60.0, "mem_bytes": 1 << 29}
    slow = Outcome("budget", Cost(time_s=25.0), None, "answered in 25.00 s", "budget:wall_s")
    j = judged_against(slow, live)
    assert (j["metric"], j["measured"], j["budget"]) == ("wall_s", 25.0, 20.0)
    hang = Outcome("timeout", Cost(time_s=60.1), "Timeout", "no answer", "timeout")
    assert judged_against(hang, live)["budget"] == 60.0


def test_a_crash_is_a_fact_not_a_measurement() -> None:
    crash = Outcome("crash", Cost(time_s=0.1), "ServerDied", "gone", "server:died")
    assert judged_against(crash, BUDGETS)["metric"] is None

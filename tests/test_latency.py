"""composer.measure.latency.interleaved on a loaded machine: bursts of load must not reorder candidates.

Most tests drive ``interleaved`` with a fake clock: each candidate's call moves it on by the
call's cost plus whatever load the test injects, so the timings are exact and the tests take
milliseconds. One test sleeps for real.
"""

from __future__ import annotations

import re
import time

import pytest

from composer.measure.latency import Latency, interleaved


class Machine:
    """A fake clock, and candidates whose calls cost a fixed time plus injected load.

    ``load(name, call_index)`` says how many seconds of load land on that call of ``name``
    (its n-th call, untimed ones included, counted from 0).
    """

    def __init__(self, costs: dict[str, float], load=lambda name, index: 0.0) -> None:
        self.now = 0.0
        self.costs = costs
        self.load = load
        self.calls = dict.fromkeys(costs, 0)

    def clock(self) -> float:
        return self.now

    def candidates(self) -> dict:
        def call(name):
            def run():
                self.now += self.costs[name] + self.load(name, self.calls[name])
                self.calls[name] += 1

            return run

        return {name: call(name) for name in self.costs}


def ranking(timed: dict[str, Latency]) -> list[str]:
    return sorted(timed, key=lambda name: timed[name].rank_us)


def test_a_burst_over_one_block_of_the_fast_candidate_does_not_rank_it_slow():
    # 20 runs in blocks of 10: the fast candidate's first block (its calls 0-10, the lead call
    # and 10 timed ones) is preempted, 8 ms each. The median of those 20 calls, the old
    # figure, lands between 1 and 9 ms: slower than the slow candidate.
    machine = Machine({"fast": 1e-3, "slow": 1.5e-3},
                      load=lambda name, i: 8e-3 if name == "fast" and i <= 10 else 0.0)  # fmt: skip
    timed = interleaved(machine.candidates(), 20, clock=machine.clock)
    assert ranking(timed) == ["fast", "slow"]
    assert timed["fast"].best_us == pytest.approx(1000)
    assert timed["slow"].best_us == pytest.approx(1500)
    assert timed["fast"].p90_us == pytest.approx(9000)  # the burst is still reported
    assert all(latency.settled for latency in timed.values())


def test_steady_load_that_preempts_most_calls_of_one_candidate_does_not_reorder_them():
    # Under steady load a program whose worker threads wait on each other is preempted more
    # often than one that runs alone: here 4 calls in 5 against 2 in 5, by 8 ms. Every round
    # agrees, and the median of each round ranks the faster program last.
    machine = Machine({"threaded": 3e-4, "single": 1.2e-3},
                      load=lambda name, i: 8e-3 if i % 5 < (4 if name == "threaded" else 2)
                      else 0.0)  # fmt: skip
    timed = interleaved(machine.candidates(), 20, clock=machine.clock)
    assert ranking(timed) == ["threaded", "single"]
    assert timed["threaded"].median_us > timed["single"].median_us
    assert all(latency.settled and latency.runs == 20 for latency in timed.values())


def test_calm_timing_costs_the_runs_asked_for():
    machine = Machine({"a": 2e-4, "b": 1e-4, "c": 3e-4})
    timed = interleaved(machine.candidates(), 21, block=4, clock=machine.clock)
    assert ranking(timed) == ["b", "a", "c"]
    assert {name: latency.runs for name, latency in timed.items()} == dict.fromkeys("abc", 21)
    a = timed["a"]
    assert (a.median_us, a.p90_us, a.best_us) == pytest.approx((200, 200, 200))
    assert all(latency.settled for latency in timed.values())


def test_rounds_that_disagree_are_timed_again_until_the_best_time_is_seen_twice():
    # Every call of the fast candidate in the first two rounds (10 + 10 timed calls and their
    # lead calls) is slowed, by 8 ms and then 4 ms: the two rounds of a single pass disagree,
    # and only timing on finds its real cost, then a fourth round confirms it.
    machine = Machine({"fast": 1e-3, "slow": 1.5e-3},
                      load=lambda name, i: {0: 8e-3, 1: 4e-3}.get(i // 11, 0.0)
                      if name == "fast" else 0.0)  # fmt: skip
    timed = interleaved(machine.candidates(), 20, clock=machine.clock)
    assert ranking(timed) == ["fast", "slow"]
    assert timed["fast"].best_us == pytest.approx(1000)
    assert timed["fast"].runs == 40  # four rounds of 10
    assert timed["fast"].settled
    two_rounds = Machine(machine.costs, machine.load)
    cut = interleaved(two_rounds.candidates(), 20, max_rounds=2, clock=two_rounds.clock)
    assert ranking(cut) == ["slow", "fast"]  # what one pass of 20 calls would say
    assert not cut["fast"].settled


def test_a_burst_over_every_candidate_of_a_round_is_timed_again():
    # The unet case: every call of every candidate in the first round takes 8 ms more.
    costs = {"openvino": 3e-4, "mixed": 2.7e-4, "xnnpack": 1.2e-3}
    machine = Machine(costs, load=lambda name, i: 8e-3 if i < 11 else 0.0)
    timed = interleaved(machine.candidates(), 20, clock=machine.clock)
    assert ranking(timed) == ["mixed", "openvino", "xnnpack"]
    assert [round(timed[name].best_us) for name in costs] == [300, 270, 1200]
    assert all(latency.runs == 30 and latency.settled for latency in timed.values())


def test_timing_that_never_settles_stops_at_the_cap():
    # Each round slower than the last by more than the tolerance: no two rounds agree.
    machine = Machine({"a": 1e-3, "b": 2e-3}, load=lambda name, i: (i // 6) * 1e-3)
    timed = interleaved(machine.candidates(), 10, max_rounds=3, clock=machine.clock)
    assert [latency.runs for latency in timed.values()] == [15, 15]
    assert not any(latency.settled for latency in timed.values())
    assert ranking(timed) == ["a", "b"]
    budgeted = Machine(machine.costs, machine.load)
    timed = interleaved(budgeted.candidates(), 10, budget_s=0.05, clock=budgeted.clock)
    assert budgeted.now == pytest.approx(0.05, abs=0.1)  # stops at the first round past it
    assert timed["a"].runs < 20  # not the four rounds the cap allows


def test_the_old_call_shapes_still_work():
    machine = Machine({"x": 1e-4})
    assert interleaved(machine.candidates(), 1, clock=machine.clock)["x"].runs == 2
    assert interleaved(machine.candidates(), 5, 2, clock=machine.clock)["x"].runs == 5
    with pytest.raises(ValueError):
        interleaved(machine.candidates(), 0)
    assert Latency(1.0, 2.0, 3).rank_us == 1.0  # built without a best time: the median
    assert Latency(5.0, 6.0, 3, 4.0).rank_us == 4.0


def test_real_sleeps_with_a_burst_rank_correctly():
    # Real time: the fast candidate sleeps 1 ms, the slow one 3 ms; 20 ms of load land on
    # the fast one's first block. Sleeping longer than asked (a loaded machine) only adds.
    calls = {"fast": 0}

    def fast():
        calls["fast"] += 1
        time.sleep(0.001 + (0.02 if calls["fast"] <= 6 else 0.0))

    def slow():
        time.sleep(0.003)

    started = time.perf_counter()
    timed = interleaved({"fast": fast, "slow": slow}, 10, block=5, max_rounds=4)
    assert ranking(timed) == ["fast", "slow"]
    assert timed["fast"].median_us > 1000
    assert time.perf_counter() - started < 3


def test_the_table_compares_with_eager_by_the_medians_and_shows_the_fastest_call():
    from composer.measure.singles import ProgramLatency
    from composer.report.latency_table import latency_table

    # By the fastest calls xnnpack would be 2x eager; by the medians it is 4x.
    rows = [
        ProgramLatency("eager", None, Latency(8000.0, 12000.0, 20, 1000.0, True)),
        ProgramLatency("xnnpack", 1, Latency(2000.0, 2100.0, 20, 500.0, True), 1e-7),
    ]
    header, eager, xnnpack = latency_table(rows).splitlines()
    assert re.split(r"\s{2,}", header.strip()) == [
        "program", "delegate calls", "fastest us", "median us", "p90 us",
        "median speed vs eager", "max |err|",
    ]  # fmt: skip
    assert xnnpack.split() == ["xnnpack", "1", "500.0", "2000.0", "2100.0", "4.00x", "1e-07"]
    assert eager.split()[-2:] == ["1.00x", "-"]


def test_a_slow_program_is_timed_fewer_times_and_a_fast_one_all_of_them():
    from composer.measure import latency

    # nf_resnet26 with XNNPACK alone (portable convolutions): 0.72 s a call on 2 cores
    assert latency.runs_within(0.72, 100) == latency.LEAST_RUNS
    assert latency.runs_within(0.05, 100) == 40  # 2 s of calls
    assert latency.runs_within(20e-6, 100) == 100
    assert latency.runs_within(1.0, 4) == 4  # never more than asked
    machine = Machine({"fast": 1e-3, "slow": 0.7})
    timed = interleaved(machine.candidates(), {"fast": 20, "slow": 6}, clock=machine.clock)
    assert (timed["fast"].runs, timed["slow"].runs) == (20, 6)
    assert ranking(timed) == ["fast", "slow"]

"""Tests for inference.allocation: exact µJ energy attribution to idle, batches and requests."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.allocation import (
    BatchRecord,
    EnergyAccountant,
    IntervalAllocation,
    MeterReading,
    allocate_interval,
    joules_to_uj,
    split_largest_remainder,
)

S = 1_000_000_000  # ns per second
MS = 1_000_000


def _parts_by_batch(alloc: IntervalAllocation) -> dict[str, int]:
    return {p.batch_id: p.energy_uj for p in alloc.batch_parts}


def _parts_by_request(alloc: IntervalAllocation) -> dict[tuple[str, str], int]:
    return {(p.batch_id, p.request_id): p.energy_uj for p in alloc.request_parts}


def _assert_conserved(alloc: IntervalAllocation) -> None:
    assert alloc.energy_uj == alloc.counter_end_uj - alloc.counter_start_uj
    assert alloc.idle_uj >= 0
    assert alloc.busy_ns >= 0 and alloc.idle_ns >= 0
    assert alloc.busy_ns + alloc.idle_ns == alloc.t1_ns - alloc.t0_ns
    assert all(p.energy_uj >= 0 for p in alloc.batch_parts)
    assert all(p.energy_uj >= 0 for p in alloc.request_parts)
    assert alloc.idle_uj + sum(p.energy_uj for p in alloc.batch_parts) == alloc.energy_uj
    assert alloc.idle_uj + sum(p.energy_uj for p in alloc.request_parts) == alloc.energy_uj
    per_batch: dict[str, int] = defaultdict(int)
    for rp in alloc.request_parts:
        per_batch[rp.batch_id] += rp.energy_uj
    assert dict(per_batch) == _parts_by_batch(alloc)


def _assert_contiguous(allocs: Sequence[IntervalAllocation]) -> None:
    for a, b in itertools.pairwise(allocs):
        assert a.t1_ns == b.t0_ns
        assert a.counter_end_uj == b.counter_start_uj


# ----------------------------------------------------------------- splitting and rounding


def test_largest_remainder_keeps_the_uj_that_naive_rounding_loses() -> None:
    # 10 over three equal weights: rounding each 3.33 gives 3+3+3 = 9, one µJ lost.
    assert sum(round(10 / 3) for _ in range(3)) == 9
    assert split_largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert split_largest_remainder(100, [1, 1, 1]) == [34, 33, 33]


def test_largest_remainder_prefers_larger_remainder_then_lower_index() -> None:
    # quotas 0.667 and 1.333: the leftover unit goes to the larger remainder (index 0).
    assert split_largest_remainder(2, [1, 2]) == [1, 1]
    # quotas 1.25 and 3.75: index 1 has the larger remainder.
    assert split_largest_remainder(5, [1, 3]) == [1, 4]
    # equal remainders: lower indices first, deterministic.
    assert split_largest_remainder(2, [1, 1, 1, 1]) == [1, 1, 0, 0]


def test_largest_remainder_gives_nothing_to_zero_weights() -> None:
    assert split_largest_remainder(7, [0, 3, 0, 4]) == [0, 3, 0, 4]
    assert split_largest_remainder(1, [0, 1, 1]) == [0, 1, 0]
    assert split_largest_remainder(0, []) == []
    assert split_largest_remainder(0, [0, 0]) == [0, 0]


def test_largest_remainder_rejects_impossible_splits() -> None:
    with pytest.raises(ValueError):
        split_largest_remainder(1, [])
    with pytest.raises(ValueError):
        split_largest_remainder(1, [0, 0])
    with pytest.raises(ValueError):
        split_largest_remainder(-1, [1])
    with pytest.raises(ValueError):
        split_largest_remainder(1, [1, -1])


@given(st.integers(0, 10**15), st.lists(st.integers(0, 10**12), min_size=1, max_size=20))
def test_largest_remainder_parts_sum_exactly_and_stay_within_one_of_quota(
    total: int, weights: list[int]
) -> None:
    if sum(weights) == 0:
        weights = [*weights[:-1], 1]
    parts = split_largest_remainder(total, weights)
    assert sum(parts) == total
    for part, w in zip(parts, weights, strict=True):
        floor = total * w // sum(weights)
        assert floor <= part <= floor + 1


def test_joules_convert_to_uj_half_even_on_the_decimal_value() -> None:
    assert joules_to_uj(10.0) == 10_000_000
    assert joules_to_uj(2.5e-6) == 2
    assert joules_to_uj(3.5e-6) == 4
    assert joules_to_uj(1.0000015) == 1_000_002
    assert joules_to_uj(0) == 0
    assert joules_to_uj(123456789) == 123_456_789_000_000
    with pytest.raises(ValueError):
        joules_to_uj(float("nan"))


# ----------------------------------------------------------------- hand-computed intervals


def test_idle_gets_idle_power_times_idle_time_and_batch_the_rest_split_by_work_units() -> None:
    # 10 J over 1 s, idle 2 W, busy 0.5 s -> idle 1 J, batch 9 J; units 1,1,2 -> 2.25/2.25/4.5 J.
    batch = BatchRecord("b1", 0, S // 2, [("r1", 1), ("r2", 1), ("r3", 2)], "resnet", "1")
    alloc = allocate_interval("gpu0", MeterReading(0, 0.0), MeterReading(S, 10.0), [batch], 2.0)
    assert alloc.energy_uj == 10_000_000
    assert alloc.busy_ns == S // 2 and alloc.idle_ns == S // 2
    assert alloc.idle_uj == 1_000_000
    assert alloc.idle_estimate_uj == 1_000_000
    assert alloc.active_uj == 9_000_000
    assert _parts_by_batch(alloc) == {"b1": 9_000_000}
    assert _parts_by_request(alloc) == {
        ("b1", "r1"): 2_250_000,
        ("b1", "r2"): 2_250_000,
        ("b1", "r3"): 4_500_000,
    }
    assert alloc.batch_parts[0].busy_ns == S // 2
    assert alloc.batch_parts[0].model_name == "resnet"
    assert alloc.request_parts[2].work_units == 2
    _assert_conserved(alloc)


def test_request_split_uses_largest_remainder_inside_an_interval() -> None:
    # 10 µJ, no idle power, three equal requests: 4/3/3, never 3/3/3.
    batch = BatchRecord("b", 0, 100, [("a", 5), ("b", 5), ("c", 5)])
    alloc = allocate_interval("cpu0", MeterReading(0, 1.0), MeterReading(100, 1.00001), [batch], 0.0)
    assert alloc.energy_uj == 10
    assert alloc.idle_uj == 0
    assert [p.energy_uj for p in alloc.request_parts] == [4, 3, 3]


def test_requests_with_zero_work_units_share_equally() -> None:
    batch = BatchRecord("b", 0, 100, [("a", 0), ("b", 0)])
    alloc = allocate_interval("cpu0", MeterReading(0, 0.0), MeterReading(100, 0.000003), [batch], 0.0)
    assert [p.energy_uj for p in alloc.request_parts] == [2, 1]


def test_overlapping_batches_of_two_models_use_union_for_idle_and_own_duration_for_shares() -> None:
    # A [0, 0.6 s] and B [0.4, 0.8 s]: union 0.8 s busy, idle 0.2 s x 2 W = 0.4 J.
    # The 9.6 J left go 0.6 : 0.4 -> 5.76 J and 3.84 J.
    a = BatchRecord("a", 0, 6 * S // 10, [("ra", 1)], "bert", "1")
    b = BatchRecord("b", 4 * S // 10, 8 * S // 10, [("rb", 1)], "resnet", "2")
    alloc = allocate_interval("gpu0", MeterReading(0, 0.0), MeterReading(S, 10.0), [b, a], 2.0)
    assert alloc.busy_ns == 8 * S // 10
    assert alloc.idle_ns == 2 * S // 10
    assert alloc.idle_uj == 400_000
    assert _parts_by_batch(alloc) == {"a": 5_760_000, "b": 3_840_000}
    assert [(p.batch_id, p.busy_ns, p.model_name) for p in alloc.batch_parts] == [
        ("a", 6 * S // 10, "bert"),
        ("b", 4 * S // 10, "resnet"),
    ]
    _assert_conserved(alloc)


def test_batch_spanning_two_intervals_gets_a_share_in_each() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=1.0)
    acct.add_batch(BatchRecord("b", S // 2, 3 * S // 2, [("r", 7)]))
    acct.add_reading(0, 0.0)
    acct.add_reading(S, 5.0)
    acct.add_reading(2 * S, 12.0)
    first, second = acct.drain()
    assert (first.t0_ns, first.t1_ns, second.t0_ns, second.t1_ns) == (0, S, S, 2 * S)
    assert (first.idle_uj, _parts_by_batch(first)) == (500_000, {"b": 4_500_000})
    assert (second.idle_uj, _parts_by_batch(second)) == (500_000, {"b": 6_500_000})
    request_total = sum(p.energy_uj for a in (first, second) for p in a.request_parts if p.request_id == "r")
    assert request_total == 11_000_000
    assert acct.stats().pending_batches == 0


def test_unchanged_counter_over_a_short_batch_defers_its_energy_to_the_longer_interval() -> None:
    # Readings at the batch boundaries (10 ms, 30 ms) show no change: the meter had not
    # updated. The 0.5 J seen at 100 ms cover [0, 100 ms], which contains the batch.
    acct = EnergyAccountant("gpu0", idle_power_w=1.0)
    acct.add_reading(0, 100.0)
    acct.add_reading(10 * MS, 100.0)
    acct.add_batch(BatchRecord("short", 10 * MS, 30 * MS, [("r", 1)]))
    acct.add_reading(30 * MS, 100.0)
    assert acct.drain() == []
    assert acct.stats().pending_batches == 1
    acct.add_reading(100 * MS, 100.5)
    (alloc,) = acct.drain()
    assert (alloc.t0_ns, alloc.t1_ns) == (0, 100 * MS)
    assert alloc.energy_uj == 500_000
    assert alloc.busy_ns == 20 * MS
    assert alloc.idle_uj == 80_000  # 1 W x 80 ms
    assert _parts_by_batch(alloc) == {"short": 420_000}
    assert _parts_by_request(alloc) == {("short", "r"): 420_000}


def test_zero_energy_interval_allocates_zero_to_everyone_when_called_directly() -> None:
    batch = BatchRecord("b", 0, 10, [("r", 1)])
    alloc = allocate_interval("gpu0", MeterReading(0, 4.0), MeterReading(20, 4.0), [batch], 50.0)
    assert alloc.energy_uj == 0 and alloc.idle_uj == 0
    assert _parts_by_request(alloc) == {("b", "r"): 0}


def test_energy_below_idle_estimate_goes_all_to_idle_and_batches_get_zero() -> None:
    # 1 J metered, but 5 W x 0.5 s idle = 2.5 J estimated.
    batch = BatchRecord("b", 0, S // 2, [("r1", 3), ("r2", 1)])
    alloc = allocate_interval("gpu0", MeterReading(0, 0.0), MeterReading(S, 1.0), [batch], 5.0)
    assert alloc.idle_estimate_uj == 2_500_000
    assert alloc.idle_uj == 1_000_000
    assert _parts_by_batch(alloc) == {"b": 0}
    assert _parts_by_request(alloc) == {("b", "r1"): 0, ("b", "r2"): 0}
    _assert_conserved(alloc)


def test_interval_without_batches_goes_entirely_to_idle() -> None:
    # The idle estimate (1 W x 1 s) is only a diagnostic here: the 3 J are all idle.
    outside = BatchRecord("later", 2 * S, 3 * S, [("r", 1)])
    touching = BatchRecord("before", -S, 0, [("r", 1)])
    alloc = allocate_interval("gpu0", MeterReading(0, 0.0), MeterReading(S, 3.0), [outside, touching], 1.0)
    assert alloc.idle_uj == 3_000_000
    assert alloc.idle_estimate_uj == 1_000_000
    assert alloc.busy_ns == 0 and alloc.idle_ns == S
    assert alloc.batch_parts == () and alloc.request_parts == ()


def test_zero_length_batch_never_receives_energy() -> None:
    point = BatchRecord("point", S // 2, S // 2, [("r", 1)])
    alloc = allocate_interval("gpu0", MeterReading(0, 0.0), MeterReading(S, 3.0), [point], 1.0)
    assert alloc.idle_uj == 3_000_000 and alloc.batch_parts == ()


def test_fractional_idle_power_is_rounded_half_even_on_exact_values() -> None:
    # 0.0015 W x 1 ms = 1.5e-6 J -> 2 µJ (half-even); 0.0025 W -> 2.5 µJ -> 2 µJ.
    batch = BatchRecord("b", 0, MS, [("r", 1)])
    for power, expected in ((0.0015, 2), (0.0025, 2), (0.0035, 4)):
        alloc = allocate_interval("cpu0", MeterReading(0, 0.0), MeterReading(2 * MS, 1.0), [batch], power)
        assert alloc.idle_estimate_uj == expected


def test_allocate_interval_rejects_bad_input() -> None:
    batch = BatchRecord("b", 0, 10, [("r", 1)])
    with pytest.raises(ValueError):
        allocate_interval("d", MeterReading(10, 0.0), MeterReading(5, 1.0), [], 1.0)
    with pytest.raises(ValueError):
        allocate_interval("d", MeterReading(0, 2.0), MeterReading(5, 1.0), [], 1.0)
    with pytest.raises(ValueError):
        allocate_interval("d", MeterReading(0, 0.0), MeterReading(5, 1.0), [batch, batch], 1.0)
    with pytest.raises(ValueError):
        allocate_interval("d", MeterReading(0, 0.0), MeterReading(5, 1.0), [], -1.0)
    with pytest.raises(ValueError):
        allocate_interval("d", MeterReading(0, 0.0), MeterReading(5, 1.0), [], float("inf"))


def test_batch_record_validates_and_normalizes_requests() -> None:
    batch = BatchRecord("b", 0, 10, [["r1", 2], ("r2", 3)])  # type: ignore[list-item]
    assert batch.requests == (("r1", 2), ("r2", 3))
    assert batch.requests[1].work_units == 3  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        BatchRecord("b", 10, 5, [("r", 1)])
    with pytest.raises(ValueError):
        BatchRecord("b", 0, 5, [])
    with pytest.raises(ValueError):
        BatchRecord("b", 0, 5, [("r", -1)])
    with pytest.raises(ValueError):
        BatchRecord("b", 0, 5, [("r", 1), ("r", 2)])


# ----------------------------------------------------------------- streaming accountant


def test_readings_going_back_in_time_or_energy_raise() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=1.0)
    acct.add_reading(100, 5.0)
    with pytest.raises(ValueError):
        acct.add_reading(99, 6.0)
    with pytest.raises(ValueError):
        acct.add_reading(200, 4.999)
    acct.add_reading(100, 5.0)  # same instant, same value: harmless duplicate
    acct.add_reading(300, 6.0)
    (alloc,) = acct.drain()
    assert (alloc.t0_ns, alloc.t1_ns, alloc.energy_uj) == (100, 300, 1_000_000)


def test_batch_ending_after_last_reading_stays_pending_until_closed() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=0.0)
    acct.add_reading(0, 0.0)
    acct.add_batch(BatchRecord("b", S // 2, 3 * S // 2, [("r", 1)]))
    acct.add_reading(S, 1.0)
    assert _parts_by_batch(acct.drain()[0]) == {"b": 1_000_000}
    assert acct.stats().pending_batches == 1
    acct.add_reading(2 * S, 3.0)
    assert _parts_by_batch(acct.drain()[0]) == {"b": 2_000_000}
    assert acct.stats().pending_batches == 0
    assert acct.drain() == []


def test_duplicate_batch_id_is_rejected_while_pending() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=1.0)
    acct.add_batch(BatchRecord("b", 0, 10, [("r", 1)]))
    with pytest.raises(ValueError):
        acct.add_batch(BatchRecord("b", 0, 10, [("r", 1)]))
    with pytest.raises(ValueError):
        acct.begin_batch("b")


def test_begin_batch_holds_closed_intervals_until_the_batch_is_reported() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=0.0)
    acct.add_reading(0, 0.0)
    acct.begin_batch("b")
    acct.add_reading(S, 4.0)  # closes [0, 1 s] while "b" is still running
    acct.add_reading(2 * S, 8.0)
    assert acct.drain() == []
    assert acct.stats().held_intervals == 2
    acct.add_batch(BatchRecord("b", S // 2, 3 * S // 2, [("r", 1)]))
    first, second = acct.drain()
    assert _parts_by_batch(first) == {"b": 4_000_000}
    assert _parts_by_batch(second) == {"b": 4_000_000}
    assert acct.stats().late_batches == 0


def test_begin_batch_with_start_bound_lets_earlier_intervals_through() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=0.0)
    acct.add_reading(0, 0.0)
    acct.begin_batch("b", start_ns=S)
    acct.add_reading(S, 1.0)  # ends at the bound: cannot overlap "b"
    acct.add_reading(2 * S, 2.0)
    assert [(a.t0_ns, a.t1_ns) for a in acct.drain()] == [(0, S)]
    acct.add_batch(BatchRecord("b", S, 2 * S, [("r", 1)]))
    (alloc,) = acct.drain()
    assert _parts_by_batch(alloc) == {"b": 1_000_000}


def test_abort_batch_releases_held_intervals() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=0.0)
    acct.add_reading(0, 0.0)
    acct.begin_batch("failed")
    acct.add_reading(S, 2.0)
    assert acct.drain() == []
    acct.abort_batch("failed")
    acct.abort_batch("never-heard-of")
    (alloc,) = acct.drain()
    assert alloc.idle_uj == 2_000_000
    assert acct.stats().in_flight_batches == 0


def test_batch_reported_after_its_interval_was_allocated_is_counted_late() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=0.0)
    acct.add_reading(0, 0.0)
    acct.add_reading(S, 2.0)  # [0, 1 s] allocated to idle: "b" was not known yet
    acct.add_batch(BatchRecord("b", S // 2, 3 * S // 2, [("r", 1)]))
    acct.add_reading(2 * S, 4.0)
    first, second = acct.drain()
    assert first.idle_uj == 2_000_000
    assert _parts_by_batch(second) == {"b": 2_000_000}
    stats = acct.stats()
    assert (stats.late_batches, stats.late_ns) == (1, S // 2)


def test_idle_power_change_applies_to_intervals_closed_afterwards() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=1.0)
    acct.add_batch(BatchRecord("b", 0, 2 * S, [("r", 1)]))
    acct.add_reading(0, 0.0)
    acct.add_batch(BatchRecord("c", 2 * S, 4 * S, [("r", 1)]))
    acct.add_reading(4 * S, 20.0)
    acct.set_idle_power_w(3.0)
    assert acct.idle_power_w == 3.0
    acct.add_batch(BatchRecord("d", 4 * S, 5 * S, [("r", 1)]))
    acct.add_reading(6 * S, 30.0)
    first, second = acct.drain()
    assert first.idle_uj == 0  # fully busy
    assert (second.idle_power_w, second.idle_uj) == (3.0, 3_000_000)
    with pytest.raises(ValueError):
        acct.set_idle_power_w(-1.0)


# ----------------------------------------------------------------- property-based


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[tuple[int, float]], list[BatchRecord], float]:
    n_readings = draw(st.integers(2, 10))
    t = draw(st.integers(-(10**9), 10**9))
    energy = draw(st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
    readings = [(t, energy)]
    for _ in range(n_readings - 1):
        t += draw(st.integers(0, 2 * S))
        # Zero increments exercise the unchanged-counter path; tiny ones the rounding.
        energy += draw(st.one_of(st.just(0.0), st.floats(0, 1e-5), st.floats(0, 500)))
        readings.append((t, energy))
    lo, hi = readings[0][0] - S // 2, readings[-1][0] + S // 2
    batches = []
    for i in range(draw(st.integers(0, 8))):
        start = draw(st.integers(lo, hi))
        end = start + draw(st.integers(0, 3 * S))
        units = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5))
        requests = [(f"r{i}-{j}", u) for j, u in enumerate(units)]
        batches.append(BatchRecord(f"b{i}", start, end, requests, f"m{i % 3}", "1"))
    idle_power = draw(st.one_of(st.floats(0, 400), st.integers(0, 400).map(float)))
    return readings, batches, idle_power


def _offline(
    readings: list[tuple[int, float]], batches: Sequence[BatchRecord], idle_power: float
) -> list[IntervalAllocation]:
    acct = EnergyAccountant("dev", idle_power)
    for batch in batches:
        acct.add_batch(batch)
    for t, e in readings:
        acct.add_reading(t, e)
    assert acct.stats().held_intervals == 0
    return acct.drain()


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_every_interval_conserves_energy_exactly_and_telescopes(
    timeline: tuple[list[tuple[int, float]], list[BatchRecord], float],
) -> None:
    readings, batches, idle_power = timeline
    allocs = _offline(readings, batches, idle_power)
    for alloc in allocs:
        _assert_conserved(alloc)
    _assert_contiguous(allocs)
    first_uj, last_uj = joules_to_uj(readings[0][1]), joules_to_uj(readings[-1][1])
    assert sum(a.energy_uj for a in allocs) == last_uj - first_uj
    if allocs:
        assert allocs[0].t0_ns == readings[0][0]
    # Every interval the accountant closes is the pure function applied to it, with the idle balance the interval
    # before it left, capped either way at idle power x the default carry of 0.25 s.
    cap_uj = round(Fraction(repr(idle_power)) * Fraction(1, 4) * 1_000_000)
    owed = 0
    for alloc in allocs:
        assert alloc.idle_owed_in_uj == owed
        again = allocate_interval(
            "dev",
            MeterReading(alloc.t0_ns, alloc.counter_start_j),
            MeterReading(alloc.t1_ns, alloc.counter_end_j),
            batches,
            idle_power,
            owed,
        )
        assert again == alloc
        owed = max(-cap_uj, min(alloc.idle_owed_out_uj, cap_uj))


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_every_request_of_an_overlapping_batch_gets_a_part_in_each_interval(
    timeline: tuple[list[tuple[int, float]], list[BatchRecord], float],
) -> None:
    readings, batches, idle_power = timeline
    for alloc in _offline(readings, batches, idle_power):
        request_keys = set(_parts_by_request(alloc))
        overlapping = {
            b.batch_id for b in batches if min(b.end_ns, alloc.t1_ns) > max(b.start_ns, alloc.t0_ns)
        }
        assert set(_parts_by_batch(alloc)) == overlapping
        for batch in batches:
            if batch.batch_id in overlapping:
                for request_id, _ in batch.requests:
                    assert (batch.batch_id, request_id) in request_keys
        assert len(request_keys) == len(alloc.request_parts)


@settings(max_examples=200, deadline=None)
@given(timelines(), st.randoms(use_true_random=False))
def test_allocation_does_not_depend_on_the_order_batches_were_added(
    timeline: tuple[list[tuple[int, float]], list[BatchRecord], float], rnd: random.Random
) -> None:
    readings, batches, idle_power = timeline
    shuffled = list(batches)
    rnd.shuffle(shuffled)
    assert _offline(readings, shuffled, idle_power) == _offline(readings, batches, idle_power)


@settings(max_examples=300, deadline=None)
@given(timelines(), st.booleans(), st.randoms(use_true_random=False))
def test_streaming_with_begin_batch_matches_offline_allocation(
    timeline: tuple[list[tuple[int, float]], list[BatchRecord], float],
    give_start: bool,
    rnd: random.Random,
) -> None:
    # Events in time order, as a server would see them: begin at batch start, report
    # at batch end, readings at their time. Ties are shuffled: order at one instant is
    # arbitrary in real life.
    readings, batches, idle_power = timeline
    events: list[tuple[int, float, str, int]] = []
    for i, batch in enumerate(batches):
        events.append((batch.start_ns, rnd.random() - 2, "begin", i))  # before same-time readings
        events.append((batch.end_ns, rnd.random(), "end", i))
    # Increasing tie keys keep same-time readings in their own order.
    read_keys = sorted(rnd.random() for _ in readings)
    for i, (t, _) in enumerate(readings):
        events.append((t, read_keys[i], "read", i))
    events.sort()
    acct = EnergyAccountant("dev", idle_power)
    streamed: list[IntervalAllocation] = []
    for _, _, kind, i in events:
        if kind == "begin":
            acct.begin_batch(batches[i].batch_id, batches[i].start_ns if give_start else None)
        elif kind == "end":
            acct.add_batch(batches[i])
        else:
            acct.add_reading(*readings[i])
        streamed.extend(acct.drain())
    assert acct.stats().late_batches == 0
    assert acct.stats().in_flight_batches == 0
    assert streamed == _offline(readings, batches, idle_power)


# ----------------------------------------------------------------- threads


def test_concurrent_batches_and_readings_conserve_energy_and_lose_no_batch_time() -> None:
    acct = EnergyAccountant("gpu0", idle_power_w=30.0)
    origin = time.monotonic_ns()
    stop = threading.Event()
    first_reading = threading.Event()
    reported: list[BatchRecord] = []
    reported_lock = threading.Lock()
    errors: list[BaseException] = []

    def energy_at(t: int) -> float:
        return (t - origin) / 1e7  # 100 W

    def reader() -> None:
        try:
            while not stop.is_set():
                t = time.monotonic_ns()
                acct.add_reading(t, energy_at(t))
                first_reading.set()
                time.sleep(0.0005)
        except BaseException as exc:
            errors.append(exc)

    def model(worker: int) -> None:
        rnd = random.Random(worker)
        try:
            first_reading.wait()
            for n in range(60):
                batch_id = f"w{worker}-{n}"
                acct.begin_batch(batch_id)
                start = time.monotonic_ns()
                time.sleep(rnd.uniform(0, 0.002))
                end = time.monotonic_ns()
                record = BatchRecord(
                    batch_id, start, end, [(f"{batch_id}-r{k}", k + 1) for k in range(3)], f"m{worker}"
                )
                acct.add_batch(record)
                with reported_lock:
                    reported.append(record)
        except BaseException as exc:
            errors.append(exc)

    reader_thread = threading.Thread(target=reader)
    workers = [threading.Thread(target=model, args=(w,)) for w in range(4)]
    reader_thread.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    reader_thread.join()
    t_end = time.monotonic_ns()
    acct.add_reading(t_end, energy_at(t_end))

    assert errors == []
    allocs = acct.drain()
    stats = acct.stats()
    assert (stats.late_batches, stats.in_flight_batches, stats.held_intervals, stats.pending_batches) == (
        0,
        0,
        0,
        0,
    )
    assert len(reported) == 240
    for alloc in allocs:
        _assert_conserved(alloc)
    _assert_contiguous(allocs)
    assert sum(a.energy_uj for a in allocs) == allocs[-1].counter_end_uj - allocs[0].counter_start_uj
    received: dict[str, int] = defaultdict(int)
    for alloc in allocs:
        for part in alloc.batch_parts:
            received[part.batch_id] += part.busy_ns
    # All batches started after the first reading, so each is fully covered by intervals.
    for record in reported:
        assert received[record.batch_id] == record.end_ns - record.start_ns


# -- the idle balance carried across intervals ----------------------------------------------------------------


def test_idle_energy_an_interval_read_too_little_to_pay_is_charged_by_the_next_one() -> None:
    batch = BatchRecord("b", 100 * MS, 200 * MS, [("r", 1)], "m", "1")
    # 10 W for 900 ms of idle is 9 J, but the counter read only 4 J (it had not updated yet)...
    short = allocate_interval("d", MeterReading(0, 0.0), MeterReading(S, 4.0), [batch], 10.0)
    assert (short.idle_uj, short.active_uj, short.idle_owed_out_uj) == (4_000_000, 0, 5_000_000)
    # ...and the next interval reads the 5 J it missed on top of its own: idle takes its 9 J and the 5 J owed.
    batch2 = BatchRecord("b2", 1100 * MS, 1200 * MS, [("r2", 1)], "m", "1")
    late = allocate_interval("d", MeterReading(S, 4.0), MeterReading(2 * S, 21.0), [batch2], 10.0, 5_000_000)
    assert (late.idle_owed_in_uj, late.idle_uj, late.active_uj, late.idle_owed_out_uj) == (
        5_000_000,
        14_000_000,
        3_000_000,
        0,
    )
    _assert_conserved(late)


def test_a_batch_free_interval_that_reads_long_leaves_a_credit_the_next_batches_get_back() -> None:
    # No batch: idle takes all 13 J against 10 J due, 3 J beyond its estimate...
    free = allocate_interval("d", MeterReading(0, 0.0), MeterReading(S, 13.0), [], 10.0)
    assert (free.idle_uj, free.idle_owed_out_uj) == (13_000_000, -3_000_000)
    # ...so the next interval, which read 3 J short (the counter caught up early), claims 3 J less for idle
    # and its batch gets its 1 J (100 ms busy at 10 W) rather than nothing.
    batch = BatchRecord("b", 1100 * MS, 1200 * MS, [("r", 1)], "m", "1")
    after = allocate_interval(
        "d", MeterReading(S, 13.0), MeterReading(2 * S, 20.0), [batch], 10.0, -3_000_000
    )
    assert (after.idle_uj, after.active_uj, after.idle_owed_out_uj) == (6_000_000, 1_000_000, 0)
    # A credit larger than the estimate leaves idle nothing, never less.
    big = allocate_interval("d", MeterReading(S, 13.0), MeterReading(2 * S, 20.0), [batch], 10.0, -50_000_000)
    assert (big.idle_uj, big.active_uj, big.idle_owed_out_uj) == (0, 7_000_000, -41_000_000)
    _assert_conserved(big)


def test_a_wrong_idle_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="idle_carry_s must be a finite number >= 0"):
        EnergyAccountant("d", 1.0, idle_carry_s=-0.5)
    with pytest.raises(ValueError, match="idle_carry_s must be a finite number >= 0"):
        EnergyAccountant("d", 1.0, idle_carry_s=float("inf"))


def test_the_idle_balance_used_is_capped_either_way_at_the_intervals_idle_power_times_the_carry() -> None:
    acct = EnergyAccountant("d", 10.0, idle_carry_s=0.5)
    acct.add_batch(BatchRecord("b", 0, 3 * S, [("r", 1)], "m", "1"))
    acct.add_reading(0, 0.0)
    # Busy the whole time, so idle estimates 0: nothing is owed however little is read.
    acct.add_reading(S, 0.5)
    acct.add_batch(BatchRecord("b2", 3 * S + 100 * MS, 3 * S + 200 * MS, [("r2", 1)], "m", "1"))
    acct.add_reading(3 * S, 1.0)
    acct.add_reading(4 * S, 1.5)  # 900 ms idle at 10 W is 9 J; 0.5 J read: 8.5 J owed, used up to 5 J
    acct.add_reading(5 * S, 100.0)  # batch-free: idle takes all 98.5 J against 10 J + 5 J owed
    acct.add_batch(BatchRecord("b3", 5 * S + 100 * MS, 5 * S + 200 * MS, [("r3", 1)], "m", "1"))
    acct.add_reading(6 * S, 110.0)
    first, second, third, fourth, fifth = acct.drain()
    assert (first.idle_owed_out_uj, second.idle_owed_out_uj) == (0, 0)
    assert (third.idle_uj, third.idle_owed_out_uj) == (500_000, 8_500_000)
    assert (fourth.idle_owed_in_uj, fourth.idle_uj, fourth.idle_owed_out_uj) == (
        5_000_000,
        98_500_000,
        -83_500_000,
    )
    # The 83.5 J credit is used up to 5 J: idle claims 9 J - 5 J, the batch gets 10 J - 4 J.
    assert (fifth.idle_owed_in_uj, fifth.idle_uj, fifth.active_uj) == (-5_000_000, 4_000_000, 6_000_000)


def test_a_balance_owed_under_an_earlier_idle_power_is_not_claimed_once_the_power_is_zero() -> None:
    acct = EnergyAccountant("d", 10.0, idle_carry_s=1.0)
    acct.add_reading(0, 0.0)
    acct.add_batch(BatchRecord("b", 100 * MS, 200 * MS, [("r", 1)], "m", "1"))
    acct.add_reading(S, 1.0)  # 9 J due, 1 J read: 8 J owed
    acct.set_idle_power_w(0.0)
    acct.add_batch(BatchRecord("b2", 1100 * MS, 1200 * MS, [("r2", 1)], "m", "1"))
    acct.add_reading(2 * S, 20.0)
    first, second = acct.drain()
    assert first.idle_owed_out_uj == 8_000_000
    assert (second.idle_owed_in_uj, second.idle_uj, second.active_uj) == (0, 0, 19_000_000)


def test_a_credit_left_while_the_idle_power_was_still_zero_does_not_reach_the_first_batch() -> None:
    # The recorder starts a device at 0 W and learns its idle power from batch-free intervals; at 0 W such an
    # interval charged all it read beyond an estimate of 0, and that must not come back as a credit.
    acct = EnergyAccountant("gpu", 0.0, idle_carry_s=0.25)
    acct.add_reading(0, 0.0)
    acct.add_reading(S, 120.0)
    acct.set_idle_power_w(120.0)
    acct.add_batch(BatchRecord("b", S + 500 * MS, S + 501 * MS, [("r", 1)], "m", "1"))
    acct.add_reading(2 * S, 240.0)
    learning, first_batch = acct.drain()
    assert learning.idle_owed_out_uj == -120_000_000  # reported as it was...
    assert (first_batch.idle_owed_in_uj, first_batch.active_uj) == (
        0,
        120_000,
    )  # ...but not kept: 1 ms at 120 W


def _lagging_counter_run(
    idle_carry_s: float, update_s: float, rate: float, seed: int, seconds: float = 20.0
) -> tuple[float, float]:
    """A device that draws a flat 120 W, busy or not, whose counter updates every ``update_s``,
    read as the recorder reads it: at a batch's end at most every 50 ms and on a 1 s timer. 1 ms batches
    arrive at ``rate`` a second (Poisson) for ``seconds``. The first and last readings fall on counter updates, so
    the intervals together meter exactly the time they span. Returns (joules charged to batches, 120 W x
    busy time): with idle charged at 120 W, the batches' fair share is their busy time at that power. (Noise in
    the power itself would go to the batches, by the rule, not to idle: it is left out to test the lag alone.)"""
    rng = random.Random(seed)
    watts = 120.0
    step_ns = int(update_s * S)
    energy_at_update = [0.0]  # the counter's value from update k (at k x step_ns) to the next
    for _ in range(int((seconds + 5) * S / step_ns) + 2):
        energy_at_update.append(energy_at_update[-1] + watts * update_s)

    def counter(t_ns: int) -> float:
        return energy_at_update[t_ns // step_ns]

    acct = EnergyAccountant("gpu", watts, idle_carry_s=idle_carry_s)
    acct.add_reading(0, counter(0))
    t = last_read = busy_ns = 0
    next_timer = S + int(rng.uniform(0, update_s) * S)  # the timer runs out of phase with the counter
    for i in itertools.count():
        if t >= seconds * S:
            break
        t += int(rng.expovariate(rate) * S)
        while t >= next_timer:
            if next_timer > last_read:
                acct.add_reading(next_timer, counter(next_timer))
                last_read = next_timer
            next_timer += S
        acct.begin_batch(f"b{i}", t)
        acct.add_batch(BatchRecord(f"b{i}", t, t + MS, [(f"r{i}", 1)], "m", "1"))
        busy_ns += MS
        t += MS
        if t - last_read >= 50 * MS:
            acct.add_reading(t, counter(t))
            last_read = t
    last = (t // step_ns + 1) * step_ns
    acct.add_reading(last, counter(last))
    allocs = acct.drain()
    for alloc in allocs:
        _assert_conserved(alloc)
    return sum(a.active_uj for a in allocs) / 1e6, watts * busy_ns / S


@pytest.mark.parametrize("update_s", [0.02, 0.1])
@pytest.mark.parametrize("rate", [100, 20, 5, 2])
def test_with_the_idle_balance_carried_requests_get_their_share_to_within_one_counter_update(
    update_s: float, rate: float
) -> None:
    # The batches' total is their busy time at the device's power, give or take the energy of one counter
    # update (what the balance still holds at the end, and what its cap let go), whatever the rate. The window
    # holds about 400 batches, so that their share (about 48 J) is well above one update (2.4 or 12 J). Shares
    # come in lumps at low rates: a batch whose interval read short gets nothing, a later one what was owed.
    one_update_j = 120.0 * update_s
    seconds = max(20.0, 400 / rate)
    for seed in range(3):
        charged_j, fair_j = _lagging_counter_run(0.25, update_s, rate, seed, seconds)
        assert fair_j > 3 * one_update_j
        assert abs(charged_j - fair_j) <= one_update_j
        # Each interval on its own gives idle less than its due where the counter read early and the batches
        # the excess where it read late: many updates' worth over the window.
        alone_j, _ = _lagging_counter_run(0.0, update_s, rate, seed, seconds)
        assert alone_j - fair_j > 3 * one_update_j

"""The energy-efficiency knob: the planner's cost models, the batcher's decisions with the knob at 0 (Triton's)
and above 0, and its adaptation to load steps and to a missed latency objective, all in simulated time.

The simulator drives the real DynamicBatcher's decision path (``enqueue``, ``plan``, ``_pop``) with a fake
clock and one model instance whose batch time and batch energy follow a fixed-cost-plus-per-row law, like a
GPU's: the planner learns that law from what it observes, as it does from the accountant in the gateway.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import efficiency
from inference.batcher import BatchPolicy, DynamicBatcher, Pending
from inference.config import ConfigError
from inference.efficiency import EfficiencyPlanner, EfficiencySettings, LinearFit
from inference.repository import efficiency_settings

MS = 1_000_000
S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 10 * S

    def __call__(self) -> int:
        return self.now


@dataclass(frozen=True)
class Device:
    """Batch time and energy against rows: a fixed cost per batch plus a cost per row."""

    t0_ns: float = 2 * MS
    t1_ns: float = 0.05 * MS
    e0_j: float = 0.6
    e1_j: float = 0.01

    def run_ns(self, rows: int) -> int:
        return int(self.t0_ns + self.t1_ns * rows)

    def energy_j(self, rows: int) -> float:
        return self.e0_j + self.e1_j * rows


@dataclass
class Outcome:
    dispatches: list[tuple[int, int]] = field(default_factory=list)  # (time, requests)
    latencies_ns: list[int] = field(default_factory=list)
    energy_j: float = 0.0
    served: int = 0

    @property
    def j_per_inference(self) -> float:
        return self.energy_j / self.served

    def p99_ms(self, skip: int = 0) -> float:
        tail = sorted(self.latencies_ns[skip:])
        return tail[min(len(tail) - 1, math.ceil(0.99 * len(tail)) - 1)] / MS


def simulate(
    policy: BatchPolicy,
    arrivals: Iterable[int],
    device: Device = Device(),
    feed_energy: bool = True,
    clock: Clock | None = None,
    stalls: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> tuple[Outcome, DynamicBatcher]:
    """Replay arrival times (ns, ascending) through one batcher instance in simulated time. ``stalls`` are
    (start, end) spans in which the host runs nothing: a batch that would run then ends that much later."""
    clock = clock or Clock()
    batcher = DynamicBatcher(
        "sim", policy, lambda i: lambda b: ([], (0, 0, 0)), lambda items: None, clock=clock
    )
    out = Outcome()
    pending = list(arrivals)
    pending.reverse()
    busy_until = 0
    wake_at: int | None = None
    while pending or batcher.queued:
        # The next event: an arrival, the end of the running batch, or the planner's timer.
        candidates = [t for t in (pending[-1] if pending else None, wake_at) if t is not None]
        if busy_until > clock.now:
            candidates.append(busy_until)
        clock.now = max(clock.now, min(candidates)) if candidates else clock.now
        while pending and pending[-1] <= clock.now:
            at = pending.pop()
            saved = clock.now
            clock.now = at
            batcher.enqueue(Pending(None))
            clock.now = saved
        if busy_until > clock.now:
            wake_at = None
            continue
        with batcher._lock:
            n, wait = batcher.plan(clock.now)
            batch = batcher._pop(n) if n else []
        if not batch:
            wake_at = clock.now + wait if wait is not None else None
            if wake_at is None and not pending:
                break
            continue
        wake_at = None
        out.dispatches.append((clock.now, len(batch)))
        start = clock.now
        end = start + device.run_ns(len(batch))
        for stall_start, stall_end in stalls:
            if stall_start < end and start < stall_end:
                end += stall_end - max(start, stall_start)
        busy_until = end
        energy = device.energy_j(len(batch))
        out.energy_j += energy
        out.served += len(batch)
        latencies = [end - p.enqueued_ns for p in batch]
        out.latencies_ns.extend(latencies)
        with batcher._lock:
            batcher._in_flight -= len(batch)
        if batcher.planner is not None:
            batcher.planner.batch_done(len(batch), end - start, latencies, end)
            if feed_energy:
                batcher.planner.batch_energy(len(batch), energy)
    return out, batcher


def poisson(rate_per_s: float, seconds: float, start_ns: int = 10 * S, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    t = float(start_ns)
    end = start_ns + seconds * S
    times = []
    while True:
        t += rng.expovariate(rate_per_s) * S
        if t >= end:
            return times
        times.append(int(t))


def policy(knob: float = 0.0, slo_ms: float = 25.0, **kw: object) -> BatchPolicy:
    base: dict[str, object] = {
        "max_batch_size": 32,
        "preferred_batch_sizes": (),
        "max_queue_delay_ns": 100_000,  # Triton-equivalent setting: 100 µs
        "adaptive_delay": False,
        "efficiency": EfficiencySettings(knob, int(slo_ms * MS)),
    }
    base.update(kw)
    return BatchPolicy(**base)  # type: ignore[arg-type]


# -- a reference for Triton's rules, written independently of the batcher -------------------------


def triton_reference(policy: BatchPolicy, arrivals: list[int], device: Device) -> list[tuple[int, int]]:
    """Triton's dynamic batcher on one instance, one priority level, compatible requests: dispatch when
    the queue reaches the largest preferred size (or max_batch_size), else when the oldest request has
    waited max_queue_delay, whichever first; the next batch forms while one runs."""
    queue: list[int] = []
    i = 0
    now = arrivals[0]
    free_at = now
    out: list[tuple[int, int]] = []
    largest = policy.preferred_batch_sizes[-1] if policy.preferred_batch_sizes else policy.max_batch_size
    while i < len(arrivals) or queue:
        while i < len(arrivals) and arrivals[i] <= now:
            queue.append(arrivals[i])
            i += 1
        if now >= free_at and queue:
            pref = max([s for s in policy.preferred_batch_sizes if s <= len(queue)], default=0)
            n = 0
            if len(queue) >= largest:
                n = largest
            elif now - queue[0] >= policy.max_queue_delay_ns:
                n = len(queue)
            elif pref:
                n = pref
            if n:
                out.append((now, n))
                del queue[:n]
                free_at = now + device.run_ns(n)
                continue
        events = [arrivals[i]] if i < len(arrivals) else []
        if now < free_at:
            events.append(free_at)
        elif queue:
            events.append(queue[0] + policy.max_queue_delay_ns)
        if not events:
            break
        now = max(now, min(events))
    return out


@settings(max_examples=40, deadline=None)
@given(
    rate=st.sampled_from([50.0, 400.0, 3000.0, 20000.0]),
    delay_us=st.sampled_from([0, 100, 2000]),
    preferred=st.sampled_from([(), (4, 8), (16,)]),
    seed=st.integers(0, 10_000),
)
def test_at_zero_the_batcher_dispatches_exactly_as_triton_s_rules(
    rate: float, delay_us: int, preferred: tuple[int, ...], seed: int
) -> None:
    p = policy(0.0, max_queue_delay_ns=delay_us * 1000, preferred_batch_sizes=preferred, max_batch_size=16)
    trace = poisson(rate, 0.3, seed=seed)
    if not trace:
        return
    device = Device()
    out, batcher = simulate(p, trace, device)
    assert batcher.planner is None
    assert out.dispatches == triton_reference(p, trace, device)


def test_the_same_trace_is_dispatched_differently_once_the_knob_is_turned_up() -> None:
    trace = poisson(300.0, 4.0)
    device = Device()
    triton = triton_reference(policy(0.0), trace, device)
    off, _ = simulate(policy(0.0), trace, device)
    on, batcher = simulate(policy(1.0), trace, device)
    assert off.dispatches == triton
    assert batcher.planner is not None
    assert on.dispatches != triton
    assert len(on.dispatches) < len(triton) / 2  # fewer, larger batches


# -- the saving, within the objective ---------------------------------------------------------------


def test_at_low_load_the_knob_saves_at_least_30_percent_with_p99_inside_the_objective() -> None:
    trace = poisson(200.0, 20.0)
    off, _ = simulate(policy(0.0), trace)
    on, batcher = simulate(policy(1.0), trace)
    warm = 400  # the planner's learning phase
    assert on.j_per_inference <= 0.7 * off.j_per_inference, (on.j_per_inference, off.j_per_inference)
    assert on.p99_ms(skip=warm) <= 25.0
    assert batcher.planner is not None and batcher.planner.safety > 0.05


def test_half_the_knob_saves_less_and_waits_less_than_the_full_knob() -> None:
    trace = poisson(200.0, 20.0)
    off, _ = simulate(policy(0.0), trace)
    half, _ = simulate(policy(0.5), trace)
    full, _ = simulate(policy(1.0), trace)
    assert full.j_per_inference < half.j_per_inference < off.j_per_inference
    assert half.p99_ms(skip=400) <= full.p99_ms(skip=400)


def test_at_high_load_the_knob_loses_nothing() -> None:
    trace = poisson(6000.0, 3.0)  # about two thirds of what full batches of 32 can serve
    off, _ = simulate(policy(0.0), trace)
    on, _ = simulate(policy(1.0), trace)
    assert on.j_per_inference <= off.j_per_inference * 1.02
    assert on.p99_ms(skip=1000) <= 25.0


def test_a_batch_that_fills_early_keeps_collecting_until_the_wait_is_out() -> None:
    # At 100 rows/s and 50 ms a batch expected to hold about 5 rows by the wait; dispatching as soon as 4
    # had come (the planner before 5 December) gave batches of 3.5 here, at the same p99 (41.1 ms).
    trace = poisson(100.0, 20.0)
    on, batcher = simulate(policy(1.0, slo_ms=50.0), trace)
    planner = batcher.planner
    assert planner is not None
    target = planner.target(trace[-1])
    assert target.state == "waiting" and target.rows > target.expected_rows + 10
    steady = on.dispatches[len(on.dispatches) // 5 :]
    mean_rows = sum(n for _, n in steady) / len(steady)
    assert mean_rows >= 0.9 * target.expected_rows and mean_rows >= 4.3
    assert on.p99_ms(skip=400) <= 50.0


def test_a_batch_never_takes_more_rows_than_can_run_inside_the_objective_after_the_wait() -> None:
    # A slow device (3 ms a row): the most rows a batch may take is what still runs in time after the wait.
    device = Device(t0_ns=2 * MS, t1_ns=3 * MS)
    planner = EfficiencyPlanner(EfficiencySettings(1.0, 100 * MS), 64)
    now = 20 * S
    for t in range(now - 3 * S, now, 20 * MS):  # 50 rows/s
        planner.arrival(t)
    for rows in [1, 2, 4, 8] * 4:
        planner.batch_done(rows, device.run_ns(rows), [], now)
        planner.batch_energy(rows, device.energy_j(rows))
    target = planner.target(now)
    assert target.state == "waiting"
    assert 1 < target.expected_rows < target.rows < 64
    assert target.wait_ns + 2 * device.run_ns(target.rows) <= 100 * MS
    assert target.wait_ns + 2 * device.run_ns(target.rows + 1) > 100 * MS


def test_the_planner_adapts_to_load_steps() -> None:
    low1 = poisson(150.0, 6.0, start_ns=10 * S, seed=2)
    high = poisson(6000.0, 3.0, start_ns=16 * S, seed=3)
    low2 = poisson(150.0, 6.0, start_ns=19 * S, seed=4)
    trace = low1 + high + low2
    p = policy(1.0)
    clock = Clock()
    on, batcher = simulate(p, trace, clock=clock)
    off, _ = simulate(policy(0.0), trace)
    planner = batcher.planner
    assert planner is not None
    # After the last step the rate estimate is back at the low load, within a factor of two.
    assert 75 <= planner.rate_rows_per_s <= 300
    # Every phase keeps the objective once learnt, and the whole run saves energy.
    latencies = on.latencies_ns
    n1, n2 = len(low1), len(high)
    for phase in (latencies[400:n1], latencies[n1 + 200 : n1 + n2], latencies[n1 + n2 + 100 :]):
        tail = sorted(phase)
        assert tail[math.ceil(0.99 * len(tail)) - 1] <= 25 * MS
    assert on.j_per_inference < 0.8 * off.j_per_inference


def _arrivals(planner: EfficiencyPlanner, start: int, end: int) -> None:
    for t in range(start, end, 5 * MS):  # 200 rows/s
        planner.arrival(t)


def _learnt_planner(now: int) -> EfficiencyPlanner:
    planner = EfficiencyPlanner(EfficiencySettings(1.0, 25 * MS), 32)
    _arrivals(planner, now - 3 * S, now)
    for rows in [1, 2, 4, 8] * 4:
        planner.batch_done(rows, Device().run_ns(rows), [], now)
        planner.batch_energy(rows, Device().energy_j(rows))
    return planner


def test_a_missed_objective_shrinks_the_wait_and_a_comfortable_one_lets_it_grow_back() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    first = planner.target(now)
    assert first.rows > 1 and first.wait_ns > 0
    for i in range(4):  # a throttled device: every request now takes 40 ms against a 25 ms objective
        planner.batch_done(8, 30 * MS, [40 * MS] * 32, now + i * 40 * MS)
    _arrivals(planner, now, now + S)
    missed = planner.target(now + S)
    assert planner.safety < 0.5
    assert missed.wait_ns < first.wait_ns and missed.rows <= first.rows
    for i in range(60):  # back to normal, 5 ms, for 6 s: the late answers leave the error budget's horizon
        planner.batch_done(8, 3 * MS, [5 * MS] * 32, now + S + i * 100 * MS)
    _arrivals(planner, now + S, now + 7 * S)
    recovered = planner.target(now + 7 * S)
    assert recovered.wait_ns > missed.wait_ns


def test_one_spike_lowers_the_safety_factor_once_not_down_to_the_floor() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    before = planner.safety
    planner.batch_done(8, 30 * MS, [40 * MS] * 32, now)  # one slow batch: a spike
    after_spike = planner.safety
    for i in range(8):  # then normal service, 10 ms against 25
        planner.batch_done(8, 3 * MS, [10 * MS] * 32, now + (i + 1) * 10 * MS)
    assert after_spike < before
    assert planner.safety >= after_spike  # the spike counted once, then recovery


def test_once_responses_are_reported_their_latency_is_judged_not_the_batch_end() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    before = planner.safety
    # The batches end well inside the 25 ms objective, but the answers leave the server late (a burst of
    # responses queued behind the event loop): that is what a client sees, so that is what counts.
    for i in range(64):
        t = now + i * 10 * MS
        planner.batch_done(8, 3 * MS, [10 * MS] * 8, t)
        for _ in range(8):
            planner.response_done(40 * MS, 0, t)
    assert planner.safety < before
    missed = planner.safety
    p99 = planner.p99_ns()
    assert p99 is not None and p99 > 25 * MS
    for i in range(64):  # batch ends keep coming in late, yet no longer count: the responses are on time
        t = now + 6 * S + i * 10 * MS
        planner.batch_done(8, 3 * MS, [60 * MS] * 8, t)
        for _ in range(8):
            planner.response_done(5 * MS, 0, t)
    assert planner.safety > missed


def test_the_wait_before_the_server_sees_a_request_comes_off_the_objective() -> None:
    now = 20 * S
    quiet, bursty = _learnt_planner(now), _learnt_planner(now)
    for planner, after_batch in ((quiet, 0), (bursty, 6 * MS)):
        # Answers handed over 20 ms after arrival, inside the 25 ms objective; in the bursty gateway each
        # answer left up to 6 ms after its batch ended, so a request arriving then waited about as long unseen.
        for _ in range(16):
            planner.response_done(20 * MS, after_batch, now)
        assert (
            planner.p99_ns() == 20 * MS + after_batch
        )  # 20 ms seen, + 6 ms unseen: a miss for the bursty one
        for _ in range(48):
            planner.response_done(20 * MS, after_batch, now)
        _arrivals(planner, now, now + S)
    calm, busy = quiet.target(now + S), bursty.target(now + S)
    assert bursty.safety < quiet.safety
    assert busy.wait_ns < calm.wait_ns


def _stalls(seed: int, start_ns: int, seconds: float, stall_ms: float) -> list[tuple[int, int]]:
    """A host that stops for about ``stall_ms`` every 1 to 2 s (a noisy neighbour, a paused VM)."""
    rng = random.Random(seed)
    spans, t = [], start_ns
    while t < start_ns + seconds * S:
        t += int(rng.uniform(1.0, 2.0) * S)
        spans.append((t, t + int(rng.uniform(0.7, 1.3) * stall_ms * MS)))
    return spans


def test_under_repeated_stalls_the_error_budget_keeps_the_p99_inside_the_objective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = poisson(1500.0, 20.0, seed=2)
    stalls = _stalls(2, 10 * S, 20.0, 30.0)
    triton, _ = simulate(policy(0.0), trace, stalls=stalls)
    budgeted, batcher = simulate(policy(1.0), trace, stalls=stalls)
    skip = len(trace) // 7  # the first seconds, while the planner learns
    assert budgeted.p99_ms(skip) <= 25.0
    assert budgeted.j_per_inference < 0.85 * triton.j_per_inference  # still saves, if less
    assert batcher.planner is not None and batcher.planner.safety < 0.5
    # The same stalls with growth allowed whatever the late share and on any 32 latencies (as before the
    # budget): each stall met the safety factor back at its ceiling, and the p99 went over the objective.
    monkeypatch.setattr(efficiency, "GROW_BELOW_SHARE", 1.0)
    monkeypatch.setattr(efficiency, "MIN_TAIL_SAMPLES", 0)
    unbudgeted, _ = simulate(policy(1.0), trace, stalls=stalls)
    assert unbudgeted.p99_ms(skip) > 25.0


def test_a_spent_error_budget_holds_the_safety_factor_until_the_late_answers_age_out() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    for i in range(30):  # 1.6 % late over one second: a p99 objective allows 1 %
        t = now + i * 33 * MS
        planner.response_done(40 * MS if i % 2 == 0 else 5 * MS, 0, t)
        for _ in range(31):
            planner.response_done(5 * MS, 0, t)
    held = planner.safety
    assert planner.late_share(now + S) > efficiency.BUDGET_SHARE
    for i in range(80):  # two comfortable seconds, 640 answers a second: the late ones still count
        for _ in range(16):
            planner.response_done(5 * MS, 0, now + S + i * 25 * MS)
    assert planner.late_share(now + 3 * S) > efficiency.GROW_BELOW_SHARE
    assert planner.safety == held
    for i in range(80):  # past the horizon the late answers no longer count: the factor grows again
        for _ in range(16):
            planner.response_done(5 * MS, 0, now + 6500 * MS + i * 25 * MS)
    assert planner.late_share(now + 8500 * MS) == 0.0
    assert planner.safety > held


def test_the_safety_factor_does_not_grow_on_too_few_latencies_to_show_a_tail() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    for _ in range(32):
        planner.response_done(40 * MS, 0, now)  # a miss: the factor shrinks, the window starts again
    shrunk = planner.safety
    later = now + 6 * S  # the miss has left the error budget's horizon
    for _ in range(64):  # 64 comfortable answers: their p99 is their maximum, blind to a 1 % tail
        planner.response_done(5 * MS, 0, later)
    assert planner.safety == shrunk
    for _ in range(64):
        planner.response_done(5 * MS, 0, later)
    assert planner.safety > shrunk


def test_metrics_show_the_late_share_of_the_last_five_seconds() -> None:
    now = 20 * S
    planner = _learnt_planner(now)
    for i in range(200):  # one answer in 50 late: 2 %
        planner.response_done(40 * MS if i % 50 == 0 else 5 * MS, 0, now + i * MS)

    def late_share(at: int) -> float:
        line = next(x for x in efficiency.prometheus_lines([("m", "1", planner)], at) if "late_share{" in x)
        return float(line.rsplit(" ", 1)[1])

    assert late_share(now + S) == pytest.approx(0.02)
    assert late_share(now + 6 * S) == 0.0  # nothing answered for five seconds: nothing late
    planner.response_done(5 * MS, 0, now - 10 * S)  # a clock that went back starts a fresh window
    assert late_share(now - 10 * S) == 0.0


def test_a_planner_that_has_seen_nothing_leaves_triton_s_rules_in_charge() -> None:
    planner = EfficiencyPlanner(EfficiencySettings(1.0, 25 * MS), 32)
    target = planner.target(10 * S)
    assert target.rows == 1 and target.reason.startswith("learning") and target.state == "learning"


# -- the planner's parts ---------------------------------------------------------------------------


def test_the_linear_fit_recovers_a_fixed_cost_and_a_cost_per_row() -> None:
    fit = LinearFit()
    for rows in [1, 2, 4, 8, 16, 32] * 5:
        fit.observe(rows, 0.6 + 0.01 * rows)
    coefficients = fit.coefficients()
    assert coefficients is not None
    assert coefficients[0] == pytest.approx(0.6) and coefficients[1] == pytest.approx(0.01)


def test_one_batch_size_alone_determines_no_line() -> None:
    fit = LinearFit()
    for _ in range(20):
        fit.observe(4, 1.0)
    assert fit.coefficients() is None


def test_without_a_fixed_cost_per_batch_the_planner_does_not_wait() -> None:
    planner = EfficiencyPlanner(EfficiencySettings(1.0, 25 * MS), 32)
    now = 10 * S
    for i in range(200):
        planner.arrival(now + i * 5 * MS)
    for rows in [1, 2, 3, 4] * 5:
        planner.batch_done(rows, int(0.1 * MS * rows), [1 * MS] * rows, now)
        planner.batch_energy(rows, 0.01 * rows)  # energy strictly per row
    target = planner.target(now + 1000 * MS)
    assert (target.rows, target.wait_ns) == (1, 0)


def test_energy_measurements_replace_the_time_model_once_there_are_enough() -> None:
    planner = EfficiencyPlanner(EfficiencySettings(1.0, 25 * MS), 32)
    for i in range(100):
        planner.arrival(10 * S + i * 5 * MS)
    for rows in [1, 2, 3, 4] * 3:
        planner.batch_done(rows, int(2 * MS + 0.05 * MS * rows), [3 * MS] * rows, 11 * S)
    assert "time model" in planner.target(11 * S).reason
    for rows in [1, 2, 3, 4] * 3:
        planner.batch_energy(rows, 0.6 + 0.01 * rows)
    assert "energy model" in planner.target(12 * S).reason


@pytest.mark.parametrize(
    ("knob", "slo_ns", "message"),
    [
        (1.5, 25 * MS, "between 0 and 1"),
        (-0.1, 25 * MS, "between 0 and 1"),
        (float("nan"), 25 * MS, "between 0 and 1"),
        (0.5, 0, "needs a latency objective"),
        (0.5, -1, "must be positive"),
    ],
)
def test_bad_knob_settings_are_refused_by_name(knob: float, slo_ns: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EfficiencySettings(knob, slo_ns)


class _Spec:
    def __init__(self, parameters: dict[str, str], dynamic: bool = True) -> None:
        self.name = "m"
        self.parameters = parameters
        self.dynamic_batching = object() if dynamic else None


@pytest.mark.parametrize(
    ("parameters", "dynamic", "message"),
    [
        ({"energy_efficiency": "lots"}, True, "parameter 'energy_efficiency' must be a number"),
        ({"energy_efficiency": "0.5"}, True, "needs a latency objective"),
        ({"energy_efficiency": "2", "latency_slo_ms": "20"}, True, "between 0 and 1"),
        ({"energy_efficiency": "0.5", "latency_slo_ms": "0"}, True, "'latency_slo_ms' must be above 0"),
        ({"energy_efficiency": "0.5", "latency_slo_ms": "inf"}, True, "must be finite"),
        ({"energy_efficiency": "0.5", "latency_slo_ms": "20"}, False, "needs dynamic_batching"),
    ],
)
def test_config_parameters_of_the_knob_are_checked_with_the_model_named(
    parameters: dict[str, str], dynamic: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        efficiency_settings(_Spec(parameters, dynamic))  # type: ignore[arg-type]
    assert "model 'm'" in str(caught.value)


def test_config_parameters_of_the_knob_are_read() -> None:
    settings_ = efficiency_settings(_Spec({"energy_efficiency": "0.5", "latency_slo_ms": "20"}))  # type: ignore[arg-type]
    assert settings_ == EfficiencySettings(0.5, 20 * MS)
    assert efficiency_settings(_Spec({})) == EfficiencySettings()  # type: ignore[arg-type]

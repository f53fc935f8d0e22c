"""The energy-efficiency knob of the dynamic batcher, free of Django and of any web framework.

Triton's batcher is static: it dispatches when a preferred size is reached or the oldest request has
waited ``max_queue_delay``. At low load that means many small batches, and every batch pays a fixed
energy cost (kernel launches, weight reads, the device waking to full clocks) whatever its size. The
planner here trades latency for energy on purpose, within the user's latency objective:

* it learns online, per model and device, two cost models against batch size (rows): batch time
  ``t(b) = t0 + t1 * b`` (from the batcher's own timings) and batch energy ``e(b) = e0 + e1 * b``
  (from the accountant's per-batch shares, once their intervals close); until enough energy has been
  seen, busy time stands in for energy (energy is power x time);
* it estimates the arrival rate (rows per second) from the requests it sees;
* it chooses the longest wait ``w*`` for the oldest request from the size ``b*`` that minimises joules
  per inference ``e(b) / b`` among the sizes the expected arrivals can fill in time, where the time
  allowed is ``energy_efficiency`` x the headroom of the objective (``latency_slo - t(b)``), scaled by a
  safety factor that shrinks whenever the observed p99 exceeds the objective and grows back slowly while
  it is comfortably inside and at most half of the objective's error budget (the 1 % of responses a p99
  allows to be late) was spent over the last few seconds;
* a batch then fills to that deadline: it dispatches when ``w*`` is out or when it holds the most rows
  whose run still fits the objective after ``w*``, not when it reaches ``b*`` (the batches that wait ``w*``
  out set the p99 anyway; earlier rows cost the p50 only, and each lowers the fixed cost a row carries);
* when waiting would save under ``MIN_SAVING`` of the energy per inference, it does not wait.

``energy_efficiency`` 0 leaves the batcher exactly as Triton's: the batcher does not consult the
planner at all (a test replays one trace through both and compares every dispatch decision).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from inference.stats import prometheus_label
from inference.variants import GridState

# Waiting must lower the modelled energy per inference by at least this fraction to be worth its latency.
MIN_SAVING = 0.02
# Observations of a batch size before the cost models are trusted, and their forgetting factor (about the
# last 200 batches count), so that the models follow a device whose clocks or load change.
MIN_OBSERVATIONS = 8
FORGET = 0.995
# The p99 window, and how the safety factor moves: down fast on a miss, up slowly when comfortable.
LATENCY_WINDOW = 256
SAFETY_MIN, SAFETY_MAX = 0.05, 0.9  # never the whole headroom: arrivals are random
SAFETY_DOWN, SAFETY_UP = 0.7, 1.05
COMFORTABLE = 0.8  # p99 below this share of the objective lets the safety factor grow
# A p99 judged on fewer latencies is their maximum or near it, blind to the 1 % tail: no growth on less.
MIN_TAIL_SAMPLES = 100
# The error budget: a p99 objective lets 1 % of responses be late. The safety factor may grow only while
# at most half of that was late over the last BUDGET_HORIZON_NS. Comfortable answers alone are no reason to
# grow: at a high rate a few dozen of them come within milliseconds of a stall, so a host that stalls every
# second or two would meet a factor back at its ceiling each time, and the tail would exceed the objective.
BUDGET_SHARE = 0.01
GROW_BELOW_SHARE = 0.5 * BUDGET_SHARE
BUDGET_HORIZON_NS = 5_000_000_000
BUDGET_BUCKETS = 10
RATE_HALF_LIFE_NS = 1_000_000_000  # the arrival rate follows a load step within a few seconds


@dataclass(frozen=True, slots=True)
class EfficiencySettings:
    """The knob and the objective of one model (``config.pbtxt`` ``parameters``)."""

    energy_efficiency: float = 0.0  # 0: Triton's behaviour; 1: use all the headroom the objective leaves
    latency_slo_ns: int = 0  # the p99 target, from arrival in the queue to the end of the batch

    def __post_init__(self) -> None:
        if not 0.0 <= self.energy_efficiency <= 1.0 or math.isnan(self.energy_efficiency):
            raise ValueError(f"energy_efficiency must be between 0 and 1, got {self.energy_efficiency}")
        if self.latency_slo_ns < 0:
            raise ValueError(f"latency_slo_ms must be positive, got {self.latency_slo_ns / 1e6}")
        if self.energy_efficiency > 0 and self.latency_slo_ns == 0:
            raise ValueError("energy_efficiency above 0 needs a latency objective (latency_slo_ms)")

    @property
    def enabled(self) -> bool:
        return self.energy_efficiency > 0


class LinearFit:
    """Exponentially weighted least squares of ``y = a + b * x``: the most recent observations weigh most."""

    __slots__ = ("_n", "_sw", "_sx", "_sxx", "_sxy", "_sy", "forget")

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        self._n = 0
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, x: float, y: float) -> None:
        f = self.forget
        self._sw = self._sw * f + 1.0
        self._sx = self._sx * f + x
        self._sy = self._sy * f + y
        self._sxx = self._sxx * f + x * x
        self._sxy = self._sxy * f + x * y
        self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def coefficients(self) -> tuple[float, float] | None:
        """(intercept, slope), or None while the sizes seen do not determine a line."""
        if self._n < 2:
            return None
        det = self._sw * self._sxx - self._sx * self._sx
        if det <= 1e-9 * max(1.0, self._sw * self._sxx):
            return None  # one size only: no slope to learn yet
        slope = (self._sw * self._sxy - self._sx * self._sy) / det
        intercept = (self._sy - slope * self._sx) / self._sw
        return intercept, slope


def _p99(values: Iterable[int]) -> int:
    """The nearest-rank 99th percentile of a non-empty window."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Target:
    """What the batcher aims at: dispatch when ``rows`` are queued or the oldest has waited ``wait_ns``."""

    rows: int
    wait_ns: int
    reason: str
    state: str = "waiting"  # learning, off, no_fixed_cost, not_worth_waiting or waiting (a /metrics label)
    # What the arrival rate should bring by the wait (``rows`` is the most a batch may take).
    expected_rows: float = 1.0


class EfficiencyPlanner:
    """Chooses a target batch size and wait for one model on one device. Thread-safe; the batcher calls
    :meth:`target` with its own lock held, so that call only reads a cached decision."""

    def __init__(
        self,
        settings: EfficiencySettings,
        max_batch_size: int,
        *,
        refresh_ns: int = 50_000_000,
        grid: GridState | None = None,
        carbon_aware_efficiency: float = 1.0,
    ) -> None:
        self.settings = settings
        self.grid = grid
        self.carbon_aware_efficiency = carbon_aware_efficiency
        self.max_batch_size = max(1, max_batch_size)
        self.refresh_ns = refresh_ns
        self._lock = threading.Lock()
        self.time_fit = LinearFit()
        self.energy_fit = LinearFit()
        self._latencies: deque[int] = deque(maxlen=LATENCY_WINDOW)
        self._from_responses = False  # set once the server reports response latencies (response_done)
        self._after_batch: deque[int] = deque(maxlen=LATENCY_WINDOW)
        self._since_adjust = 0
        self._unseen_cached = 0  # _unseen_ns() as of the last adjustment: counting misses must not sort
        # The error budget: (bucket start, responses, late ones) for the last BUDGET_HORIZON_NS.
        self._budget: deque[list[int]] = deque()
        self.safety = 0.5  # starts cautious; the observed p99 moves it
        self._decayed_rows = 0.0
        self._last_arrival_ns: int | None = None
        self._decided_at: int | None = None
        self._target = Target(1, 0, "learning", "learning")

    # -- what the planner learns from ------------------------------------------------------------

    def arrival(self, now_ns: int, rows: int = 1) -> None:
        """An arrival of ``rows`` rows (called by the batcher on enqueue)."""
        with self._lock:
            last = self._last_arrival_ns
            self._last_arrival_ns = now_ns
            if last is not None:
                # A count of rows that halves every RATE_HALF_LIFE_NS: in steady state it holds
                # rate x half-life / ln 2, an unbiased estimate (averaging 1/gap is not: it overshoots).
                self._decayed_rows *= 0.5 ** (max(0, now_ns - last) / RATE_HALF_LIFE_NS)
            self._decayed_rows += rows

    def _rate_at(self, now_ns: int) -> float:
        """Rows per ns, decayed to ``now_ns`` (nothing arriving lowers it)."""
        last = self._last_arrival_ns
        if last is None:
            return 0.0
        decayed = self._decayed_rows * 0.5 ** (max(0, now_ns - last) / RATE_HALF_LIFE_NS)
        return float(decayed * math.log(2) / RATE_HALF_LIFE_NS)

    def batch_done(self, rows: int, busy_ns: int, latencies_ns: list[int], now_ns: int) -> None:
        """A batch of ``rows`` ran for ``busy_ns`` and ended at ``now_ns``; its requests waited and ran
        ``latencies_ns`` in all (judged against the objective until the server reports response latencies)."""
        with self._lock:
            self.time_fit.observe(rows, busy_ns)
            if not self._from_responses:
                self._observe(latencies_ns, now_ns)

    def response_done(self, latency_ns: int, after_batch_ns: int, now_ns: int) -> None:
        """A response was handed to the server at ``now_ns``, ``latency_ns`` after its request arrived and
        ``after_batch_ns`` after its batch ended (0 when unknown).

        From the first such report on, these are the latencies judged against the objective instead of the
        batcher's queue-to-batch-end times: they also hold decoding, response encoding and the wait for the
        event loop, which a burst of answers from a large batch lengthens. A request that arrives during
        such a burst also waits before the server sees it at all, which no server-side clock measures; the
        p99 of ``after_batch_ns`` (about the length of a burst) stands in for that wait and is added: with
        large batches at a high rate, the clients' p99 is otherwise a few milliseconds above the server's.
        """
        with self._lock:
            self._from_responses = True
            self._after_batch.append(max(0, after_batch_ns))
            self._observe((latency_ns,), now_ns)

    def _unseen_ns(self) -> int:
        """The wait before the server sees a request, estimated as the p99 time from a batch's end to its
        answers being handed over (0 until responses are reported)."""
        return _p99(self._after_batch) if self._after_batch else 0

    @property
    def latency_source(self) -> str:
        """What the objective is judged on: "response" (the server reports them) or "batch" (batch ends)."""
        return "response" if self._from_responses else "batch"

    def _observe(self, latencies_ns: list[int] | tuple[int, ...], now_ns: int) -> None:
        self._latencies.extend(latencies_ns)
        self._since_adjust += len(latencies_ns)
        late_after = self.settings.latency_slo_ns - self._unseen_cached
        late = sum(1 for x in latencies_ns if x > late_after)
        budget = self._budget
        start = now_ns - now_ns % (BUDGET_HORIZON_NS // BUDGET_BUCKETS)
        if not budget or budget[-1][0] != start:
            self._prune(start)
            budget.append([start, 0, 0])
        budget[-1][1] += len(latencies_ns)
        budget[-1][2] += late
        if self._since_adjust >= 32 and len(self._latencies) >= 32:
            self._since_adjust = 0
            self._adjust_safety()

    def _prune(self, now_ns: int) -> None:
        """Drop the buckets that began BUDGET_HORIZON_NS or more before ``now_ns``, or after it (a clock that
        went back must not freeze the window)."""
        budget = self._budget
        while budget and (now_ns - budget[0][0] >= BUDGET_HORIZON_NS or budget[0][0] > now_ns):
            budget.popleft()
        while budget and budget[-1][0] > now_ns:
            budget.pop()

    def _late_share(self) -> float:
        """The share of the responses of the last BUDGET_HORIZON_NS that missed the objective."""
        total = sum(b[1] for b in self._budget)
        return sum(b[2] for b in self._budget) / total if total else 0.0

    def late_share(self, now_ns: int) -> float:
        """The share of the responses of the BUDGET_HORIZON_NS before ``now_ns`` that missed the objective
        (0 when there were none: an idle model has nothing late)."""
        with self._lock:
            self._prune(now_ns)
            return self._late_share()

    def batch_energy(self, rows: int, energy_j: float) -> None:
        """The accountant's energy share of a whole batch of ``rows`` (once its intervals closed)."""
        with self._lock:
            self.energy_fit.observe(rows, energy_j)

    def _adjust_safety(self) -> None:
        self._unseen_cached = unseen = self._unseen_ns()
        p99 = _p99(self._latencies) + unseen
        slo = self.settings.latency_slo_ns
        if p99 > slo:
            self.safety = max(SAFETY_MIN, self.safety * SAFETY_DOWN)
            self._decided_at = None  # decide again now
            # Judge the next step on latencies served after this one: the misses still in the window would
            # otherwise shrink the wait again and again, down to the floor after a single spike.
            self._latencies.clear()
        elif (
            p99 < COMFORTABLE * slo
            and len(self._latencies) >= MIN_TAIL_SAMPLES  # the window restarts at each miss
            and self._late_share() <= GROW_BELOW_SHARE
        ):
            self.safety = min(SAFETY_MAX, self.safety * SAFETY_UP)

    # -- the decision ---------------------------------------------------------------------------

    @property
    def rate_rows_per_s(self) -> float:
        last = self._last_arrival_ns
        return 0.0 if last is None else self._rate_at(last) * 1e9

    def p99_ns(self) -> int | None:
        """The p99 latency judged against the objective (with the unseen wait, once responses are reported)."""
        with self._lock:
            if not self._latencies:
                return None
            return _p99(self._latencies) + self._unseen_ns()

    def target(self, now_ns: int) -> Target:
        """The current target, decided again at most every ``refresh_ns``."""
        decided = self._decided_at
        if decided is not None and now_ns - decided < self.refresh_ns:
            return self._target
        with self._lock:
            self._target = self._decide(now_ns)
            self._decided_at = now_ns
            return self._target

    def _cost(self) -> tuple[tuple[float, float] | None, tuple[float, float] | None, str]:
        times = self.time_fit.coefficients() if self.time_fit.count >= MIN_OBSERVATIONS else None
        energy = self.energy_fit.coefficients() if self.energy_fit.count >= MIN_OBSERVATIONS else None
        if energy is not None:
            return times, energy, "energy model"
        # Until batch energies arrive, busy time stands in for energy (energy = power x time).
        return times, times, "time model (no energy measured yet)"

    def knob(self) -> float:
        """The knob in force: the model's, or the carbon-aware one while the grid is above its threshold."""
        knob = self.settings.energy_efficiency
        grid = self.grid
        if grid is not None and grid.high:
            knob = max(knob, self.carbon_aware_efficiency)
        return knob

    def _decide(self, now_ns: int) -> Target:
        knob = self.knob()
        if knob <= 0:
            return Target(1, 0, "knob at 0: Triton's rules", "off")
        times, energy, basis = self._cost()
        if times is None or energy is None:
            return Target(1, 0, "learning: too few batches of different sizes", "learning")
        rate = self._rate_at(now_ns)
        t0, t1 = times
        e0, e1 = energy
        if e0 <= 0:
            return Target(1, 0, f"{basis}: no fixed cost per batch, waiting saves nothing", "no_fixed_cost")
        slo = self.settings.latency_slo_ns
        unseen = self._unseen_ns()
        allowed = knob * self.safety

        def headroom(rows: int) -> float:
            # A request may also wait behind the batch before it: two batch times come off the objective,
            # and the wait before the server sees it.
            return slo - 2 * max(0.0, t0 + t1 * rows) - unseen

        # The batch the load forms anyway, without waiting: what arrives while one batch runs. Waiting must
        # beat that, not a batch of one.
        natural = 1
        if rate > 0:
            natural = max(1, min(self.max_batch_size, int(1 + rate * max(0.0, t0 + t1))))
        best_rows, best_wait, best_j = natural, 0, (e0 + e1 * natural) / natural
        baseline = best_j
        for rows in range(natural + 1, self.max_batch_size + 1):
            room = headroom(rows)
            if room <= 0:
                break
            wait = (rows - 1) / rate if rate > 0 else math.inf
            if wait > allowed * room:
                break
            per_row = (e0 + e1 * rows) / rows
            if per_row < best_j:
                best_rows, best_wait, best_j = rows, int(wait), per_row
        if best_rows == natural or best_j > baseline * (1 - MIN_SAVING):
            return Target(
                1, 0, f"{basis}: waiting would not pay at {rate * 1e9:.0f} rows/s", "not_worth_waiting"
            )
        # The longest the oldest request may wait: the expected fill time with a margin for arrival noise,
        # never past the share of the headroom the knob allows.
        wait_cap = int(allowed * headroom(best_rows))
        wait_ns = max(0, min(wait_cap, int(best_wait * 1.5) + 1))
        # Fill to the deadline: a batch that reaches best_rows early keeps collecting until wait_ns, up to the
        # largest batch whose run still fits the objective after that wait. The p99 is set by the batches that
        # wait it out, and at the loads where waiting pays a good share of them do (Poisson arrivals: about
        # 30 % at 100 rows/s and best_rows 4), so the extra rows cost the p50, not the p99, and each lowers the
        # fixed cost a row carries (bench/README.md gives the saving measured with this rule).
        fill_rows = best_rows
        while fill_rows < self.max_batch_size and wait_ns <= headroom(fill_rows + 1):
            fill_rows += 1
        expected = min(float(fill_rows), 1.0 + rate * wait_ns)
        return Target(
            fill_rows,
            wait_ns,
            f"{basis}: up to {fill_rows} rows within {wait_ns / 1e6:.2f} ms (about {expected:.1f} expected)",
            "waiting",
            expected,
        )


_METRICS = (
    (
        "carbonledger_energy_efficiency",
        "the knob in force (0: Triton's batching; raised in carbon-aware mode)",
    ),
    ("carbonledger_latency_slo_seconds", "the model's p99 latency objective"),
    (
        "carbonledger_batch_target_rows",
        "the most rows a batch may collect while it waits (1: Triton's rules apply)",
    ),
    ("carbonledger_batch_target_wait_seconds", "the longest the oldest request waits for more rows"),
    ("carbonledger_batch_expected_rows", "the rows the planner expects a batch to collect by then"),
    ("carbonledger_latency_safety", "the share of the objective's headroom the planner may spend now"),
    ("carbonledger_arrival_rows_per_second", "the arrival rate the planner estimates"),
    ("carbonledger_latency_p99_seconds", "the p99 latency over the planner's recent window"),
    (
        "carbonledger_latency_late_share",
        "the share of the last 5 s of responses that missed the objective (a p99 allows 0.01)",
    ),
    ("carbonledger_batch_planner_state", "1 for the planner's current state (the label)"),
)


def prometheus_lines(entries: list[tuple[str, str, EfficiencyPlanner]], now_ns: int) -> list[str]:
    """The planners' state at ``now_ns`` in Prometheus text format, one series per (model, version)."""
    if not entries:
        return []
    lines: list[str] = []
    values = []
    states: list[tuple[str, str]] = []
    for model, version, planner in entries:
        target = planner._target
        p99 = planner.p99_ns()
        labels = f'model="{prometheus_label(model)}",version="{prometheus_label(version)}"'
        states.append((labels, target.state))
        values.append(
            (
                labels,
                {
                    "carbonledger_energy_efficiency": planner.knob(),
                    "carbonledger_latency_slo_seconds": planner.settings.latency_slo_ns / 1e9,
                    "carbonledger_batch_target_rows": target.rows,
                    "carbonledger_batch_target_wait_seconds": target.wait_ns / 1e9,
                    "carbonledger_batch_expected_rows": round(target.expected_rows, 2),
                    "carbonledger_latency_safety": round(planner.safety, 4),
                    "carbonledger_arrival_rows_per_second": round(planner.rate_rows_per_s, 3),
                    "carbonledger_latency_p99_seconds": (p99 or 0) / 1e9,
                    "carbonledger_latency_late_share": round(planner.late_share(now_ns), 5),
                },
            )
        )
    for metric, help_text in _METRICS:
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} gauge")
        if metric == "carbonledger_batch_planner_state":
            lines.extend(f'{metric}{{{labels},state="{state}"}} 1' for labels, state in states)
            continue
        lines.extend(f"{metric}{{{labels}}} {numbers[metric]:g}" for labels, numbers in values)
    return lines

"""Dynamic batcher with Triton's semantics, free of Django and of any web framework.

One queue per model version; each model instance owns a thread that takes the batching
decision itself: it waits on the lock-protected queue with a precise timeout, pops the batch,
runs it, and hands the results to ``deliver`` once per batch. The next batch forms while the
current one runs and starts the moment it ends, with no event-loop round trip: a hop through the
event loop per batch would cost a wake-up on the serving path's busiest thread.

Triton's rules (``dynamic_batching`` in config.pbtxt), each unit-tested in
tests/inference/test_batcher.py:

* a batch never holds more than ``max_batch_size`` rows, and only shape-compatible requests;
* a forming batch that reaches a preferred size is dispatched at once (the largest preferred
  size reachable from the head of the queue);
* otherwise it is dispatched when its OLDEST request has waited ``max_queue_delay``;
* priority levels are served highest (1) first, each with its own queue policy:
  ``max_queue_size`` (a full level rejects at once), a default timeout, REJECT or DELAY when
  a request's timeout expires in the queue, and ``allow_timeout_override``;
* ``preserve_ordering`` delivers responses in the order requests arrived, across instances;
* ``instance_group`` count instances draw from the one queue.

Beyond Triton:

* a client timeout is honoured even when the level has no default timeout;
* expired requests are rejected by a reaper thread, so promptly even while every instance
  is busy executing;
* the instance and reaper threads survive a failing iteration: it is logged once, counted
  (``THREAD_ERRORS``, shown in /metrics) and the thread goes on; a batch it had taken is
  answered with a 500 rather than left waiting;
* adaptive delay (on by default, a model setting): when the queue already holds as many
  requests as the recent peak in flight, no one else can send, so dispatch now rather than
  wait out ``max_queue_delay``;
* the energy-efficiency knob (``inference/efficiency.py``, off at 0): a planner sets the longest wait
  and the most rows a batch may collect meanwhile, within the model's latency objective.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference.efficiency import EfficiencyPlanner, EfficiencySettings
from inference.errors import (
    THREAD_ERRORS,
    InferenceError,
    QueueFull,
    RequestTimeout,
    ShuttingDown,
    ThreadErrors,
)
from inference.variants import GridState

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE = 0, 1, 2
PEAK_WINDOW_NS = 1_000_000_000
# The longest a thread sleeps at once: a far deadline (a default timeout of days) is waited for in steps, since
# a lock's timeout raises OverflowError past threading.TIMEOUT_MAX.
MAX_WAIT_S = 3600.0
# After an iteration fails, a thread pauses this long before the next (doubling up to ERROR_PAUSE_MAX_S while
# failures repeat), so that a failure on every turn cannot spin a core.
ERROR_PAUSE_S = 0.01
ERROR_PAUSE_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_ns: int = 0  # 0: none
    timeout_action: str = "REJECT"  # or "DELAY"
    allow_timeout_override: bool = False


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The batching rules of one model version.

    ``dynamic`` False means no dynamic batching: every request is executed on its own, as
    Triton's default scheduler does.
    """

    max_batch_size: int
    dynamic: bool = True
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    queue_policies: dict[int, QueuePolicy] = field(default_factory=dict)
    adaptive_delay: bool = True
    # The energy-efficiency knob (inference/efficiency.py); at 0 the planner is not consulted at all.
    efficiency: EfficiencySettings = EfficiencySettings()

    @property
    def levels(self) -> int:
        return max(1, self.priority_levels)

    def policy_for(self, level: int) -> QueuePolicy:
        return self.queue_policies.get(level, self.default_queue_policy)

    @property
    def max_preferred(self) -> int:
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else max(1, self.max_batch_size)


class Pending:
    """A request waiting in (or taken from) the queue. ``payload`` is the caller's."""

    __slots__ = (
        "deadline_ns",
        "done_ns",
        "enqueued_ns",
        "level",
        "payload",
        "rows",
        "seq",
        "signature",
        "state",
        "timeout_action",
        "timeout_us",
        "variant",
    )

    def __init__(
        self,
        payload: Any,
        rows: int = 1,
        signature: Hashable = None,
        priority: int = 0,
        timeout_us: int = 0,
    ) -> None:
        self.payload = payload
        self.rows = rows
        self.signature = signature
        self.level = priority  # resolved to 1..levels by enqueue
        self.timeout_us = timeout_us  # the client's timeout, 0 for none
        self.deadline_ns = 0
        self.done_ns = 0  # when its batch ended (the batcher's clock), 0 before
        self.enqueued_ns = 0
        self.seq = 0
        self.state = QUEUED
        self.timeout_action = "REJECT"
        self.variant = ""  # the model variant that served it, set by the runner


@dataclass(frozen=True, slots=True)
class BatchTiming:
    start_ns: int
    end_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


# What an instance's runner returns: one result (or InferenceError) per request, and timings
# (compute_input_ns, compute_infer_ns, compute_output_ns).
ExecuteFn = Callable[[list[Pending]], tuple[Sequence[Any], tuple[int, int, int]]]
# Called from instance and reaper threads with (pending, result-or-error) pairs, already in
# delivery order.
DeliverFn = Callable[[list[tuple[Pending, Any]]], None]


class BatchHook(Protocol):
    """Called on the instance thread around each executed batch.

    ``begin`` runs before the batch's start time is taken; ``end`` runs after execution and
    before any answer is delivered, so what it records exists before the client hears back.
    If ``end`` raises an InferenceError, every request of the batch is answered with it
    instead (a result that cannot be recorded is not handed out).
    """

    def begin(self, index: int, batch: list[Pending]) -> None: ...

    def end(
        self, index: int, batch: list[Pending], timing: BatchTiming, error: BaseException | None
    ) -> None: ...


class DynamicBatcher:
    def __init__(
        self,
        name: str,
        policy: BatchPolicy,
        execute_factory: Callable[[int], ExecuteFn],
        deliver: DeliverFn,
        instances: int = 1,
        hooks: Sequence[BatchHook] = (),
        clock: Callable[[], int] = time.monotonic_ns,
        grid: GridState | None = None,
        carbon_aware_efficiency: float = 1.0,
        thread_errors: ThreadErrors = THREAD_ERRORS,
    ) -> None:
        self.name = name
        self._thread_errors = thread_errors
        self.policy = policy
        self._execute_factory = execute_factory
        self._deliver = deliver
        self._instances = max(1, instances)
        self._hooks = list(hooks)
        self._clock = clock
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._reap = threading.Condition(self._lock)
        levels = policy.levels
        self._queues: list[deque[Pending]] = [deque() for _ in range(levels)]
        self._delayed: list[deque[Pending]] = [deque() for _ in range(levels)]
        self._queued = 0
        self._queued_rows = 0
        # An arrival wakes a planning instance thread only when it can change the plan (see
        # _wants_wake); waking it on every arrival costs a GIL hand-off per request.
        self._idle_waiters = 0
        self._wake_rows = 0
        self._wake_count = 0
        self._wake_sig: Hashable = None
        self._level_sizes = [0] * levels
        self._deadlines: list[tuple[int, int, Pending]] = []
        self._seq = itertools.count(1)
        self._next_release = 1
        self._held: dict[int, tuple[Pending, Any]] = {}
        self._in_flight = 0
        self._peak_cur = 0
        self._peak_prev = 0
        self._window_start = 0
        self._batch_ns_avg = 0.0
        self._stopping = False
        self._stopped = threading.Event()  # set with _stopping; interrupts a pause after a failed iteration
        self._threads: list[threading.Thread] = []
        self._reaper: threading.Thread | None = None
        # A planner with the knob above 0, or with a latency objective and a grid state to lean on when the
        # grid is above its threshold (carbon-aware mode); otherwise none, and Triton's rules alone.
        wants_planner = policy.efficiency.enabled or (
            grid is not None and policy.efficiency.latency_slo_ns > 0
        )
        self.planner: EfficiencyPlanner | None = (
            EfficiencyPlanner(
                policy.efficiency,
                policy.max_batch_size,
                grid=grid,
                carbon_aware_efficiency=carbon_aware_efficiency,
            )
            if wants_planner and policy.dynamic
            else None
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self._instances):
            run = self._execute_factory(i)
            t = threading.Thread(
                target=self._instance_loop, args=(i, run), name=f"{self.name}-{i}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the instances after their current batch; reject whatever is still queued."""
        with self._lock:
            self._stopping = True
            self._stopped.set()
            leftovers = list(self._iter_queue())
            for q in (*self._queues, *self._delayed):
                q.clear()
            self._queued = 0
            self._queued_rows = 0
            self._level_sizes = [0] * len(self._level_sizes)
            self._work.notify_all()
            self._reap.notify_all()
        for t in self._threads:
            t.join(timeout_s)
        if self._reaper is not None:
            self._reaper.join(timeout_s)
        if leftovers:
            err = ShuttingDown(f"model '{self.name}' is shutting down")
            self._finish([(p, err) for p in leftovers])

    # -- submission --------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    @property
    def pending_count(self) -> int:
        """Requests accepted and not yet answered (queued or executing)."""
        return self._in_flight

    def enqueue(self, p: Pending) -> None:
        """Queue a request. Raises QueueFull (never queued) when its level is full."""
        policy = self.policy
        level = p.level or policy.default_priority_level or 1
        if policy.priority_levels and not (1 <= level <= policy.priority_levels):
            raise InferenceError(
                f"priority {p.level} is outside 1..{policy.priority_levels} for model '{self.name}'", 400
            )
        if not policy.priority_levels:
            level = 1
        qpol = policy.policy_for(level)
        requested_us = p.timeout_us
        if requested_us and (qpol.allow_timeout_override or not qpol.default_timeout_ns):
            timeout_ns = requested_us * 1000
        else:
            timeout_ns = qpol.default_timeout_ns
        with self._lock:
            if self._stopping:
                raise ShuttingDown(f"model '{self.name}' is shutting down")
            if qpol.max_queue_size and self._level_sizes[level - 1] >= qpol.max_queue_size:
                raise QueueFull(
                    f"exceeds maximum queue size for model '{self.name}' (priority level {level}: "
                    f"{qpol.max_queue_size} queued)",
                    retry_after_s=self._retry_after_s(),
                )
            now = self._clock()
            p.level = level
            p.enqueued_ns = now
            p.seq = next(self._seq)
            p.state = QUEUED
            p.timeout_action = qpol.timeout_action
            if timeout_ns:
                p.deadline_ns = now + timeout_ns
                heapq.heappush(self._deadlines, (p.deadline_ns, p.seq, p))
                self._ensure_reaper()
                self._reap.notify()
            else:
                p.deadline_ns = 0
            self._queues[level - 1].append(p)
            self._queued += 1
            self._queued_rows += p.rows
            self._level_sizes[level - 1] += 1
            self._in_flight += 1
            if now - self._window_start > PEAK_WINDOW_NS:
                self._peak_prev = self._peak_cur
                self._peak_cur = 0
                self._window_start = now
            if self._in_flight > self._peak_cur:
                self._peak_cur = self._in_flight
            if self.planner is not None:
                self.planner.arrival(now, p.rows)
            if self._wants_wake(p):
                self._work.notify()

    def _wants_wake(self, p: Pending) -> bool:
        """Whether an arrival can change what a planning thread decided (lock held)."""
        return (
            self._idle_waiters > 0
            or self._queued_rows >= self._wake_rows
            or self._queued >= self._wake_count
            or p.signature != self._wake_sig
        )

    def _retry_after_s(self) -> int:
        per_batch_s = (self._batch_ns_avg or 1e6) / 1e9
        batches_ahead = self._queued / max(1, self.policy.max_batch_size) / self._instances
        return max(1, math.ceil(batches_ahead * per_batch_s))

    # -- the batching decision (called with the lock held) -----------------------------------

    def _iter_queue(self) -> Iterator[Pending]:
        for q, d in zip(self._queues, self._delayed, strict=True):
            yield from q
            yield from d

    def plan(self, now: int) -> tuple[int, int | None]:
        """Return (requests to dispatch now, ns to wait otherwise; None: wait for arrivals)."""
        policy = self.policy
        if self._queued == 0:
            return 0, None
        if not policy.dynamic:
            return 1, None
        max_bs = policy.max_batch_size
        preferred = policy.preferred_batch_sizes
        max_pref = policy.max_preferred
        rows = 0
        count = 0
        best_pref = 0
        oldest = now
        sig: Hashable = None
        first = True
        send_now = False
        for p in self._iter_queue():
            if first:
                sig = p.signature
                first = False
            elif p.signature != sig:
                send_now = True  # the batch cannot grow past an incompatible request
                break
            if rows + p.rows > max_bs:
                send_now = True
                break
            rows += p.rows
            count += 1
            if p.enqueued_ns < oldest:
                oldest = p.enqueued_ns
            if rows in preferred:
                best_pref = count
            if rows >= max_pref:
                send_now = True
                break
        if count == 0:
            # The head alone exceeds max_batch_size; validation prevents this, but never stall.
            return 1, None
        if send_now:
            return count, None
        peak = max(self._peak_cur, self._peak_prev)
        planner = self.planner
        if planner is not None:
            target = planner.target(now)
            # A target of one row means waiting would not pay (or the planner is still learning): Triton's
            # rules below apply unchanged.
            if target.rows > 1:
                if rows >= target.rows or now - oldest >= target.wait_ns:
                    return count, None
                # Nobody else can send once everything that was in flight at once in the previous window is
                # queued (a closed loop): waiting longer costs latency and saves nothing. The previous window
                # only: under open load the current peak is the growing queue itself, and comparing with it
                # would cut every wait short (measured: latency bursts with no larger batches).
                settled_peak = self._peak_prev
                if policy.adaptive_delay and settled_peak and self._queued >= settled_peak:
                    return count, None
                self._wake_rows = target.rows
                self._wake_count = settled_peak if policy.adaptive_delay and settled_peak else 1 << 62
                self._wake_sig = sig
                return 0, oldest + target.wait_ns - now
        if now - oldest >= policy.max_queue_delay_ns:
            return count, None
        if best_pref:
            return best_pref, None
        if policy.adaptive_delay and self._queued >= peak:
            return count, None
        # Waiting: remember what an arrival must bring to change this decision.
        self._wake_rows = min([size for size in preferred if size > rows] + [max_pref])
        self._wake_count = peak if policy.adaptive_delay else 1 << 62
        self._wake_sig = sig
        return 0, oldest + policy.max_queue_delay_ns - now

    def _pop(self, n: int) -> list[Pending]:
        batch: list[Pending] = []
        for q in itertools.chain.from_iterable(zip(self._queues, self._delayed, strict=True)):
            while q and len(batch) < n:
                p = q.popleft()
                p.state = RUNNING
                self._level_sizes[p.level - 1] -= 1
                batch.append(p)
            if len(batch) == n:
                break
        self._queued -= len(batch)
        self._queued_rows -= sum(p.rows for p in batch)
        return batch

    def _expire_due(self, now: int) -> list[Pending]:
        """Apply REJECT or DELAY to queued requests whose timeout has passed."""
        rejected: list[Pending] = []
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            _, _, p = heapq.heappop(dl)
            if p.state != QUEUED:
                continue
            q = self._queues[p.level - 1]
            try:
                q.remove(p)
            except ValueError:
                continue  # already in the delayed queue
            if p.timeout_action == "DELAY":
                self._delayed[p.level - 1].append(p)
                continue
            p.state = DONE
            self._queued -= 1
            self._queued_rows -= p.rows
            self._level_sizes[p.level - 1] -= 1
            self._in_flight -= 1
            rejected.append(p)
        return rejected

    # -- threads -----------------------------------------------------------------------------

    def _instance_loop(self, index: int, run: ExecuteFn) -> None:
        failures = 0
        while True:
            try:
                if not self._instance_step(index, run):
                    return
                failures = 0
            except Exception as exc:  # the thread goes on: a dead instance would stall its model for good
                failures += 1
                self._thread_errors.record(
                    exc,
                    f"an iteration of instance {index} of model '{self.name}' failed; the instance goes on",
                )
                if self._pause_after_error(failures):
                    return

    def _instance_step(self, index: int, run: ExecuteFn) -> bool:
        """Takes one batching decision: rejects what expired, runs a batch if one is due. False once stopping."""
        clock = self._clock
        expired: list[Pending] = []
        n = 0
        try:
            with self._lock:
                while True:
                    if self._stopping:
                        return False
                    now = clock()
                    if self._deadlines and self._deadlines[0][0] <= now:
                        expired.extend(self._expire_due(now))
                    n, wait_ns = self.plan(now)
                    if n:
                        batch = self._pop(n)
                        break
                    if expired:
                        break  # deliver rejections before sleeping
                    if wait_ns is None:
                        self._idle_waiters += 1
                        try:
                            self._work.wait()
                        finally:
                            self._idle_waiters -= 1
                    else:
                        self._work.wait(min(wait_ns / 1e9, MAX_WAIT_S))
        except Exception:
            if expired:  # taken off the queue already: answered, whatever failed after
                self._reject_timed_out(expired)
            raise
        if expired:
            self._reject_timed_out(expired)
            if not n:
                return True
        self._run_batch(index, run, batch)
        return True

    def _run_batch(self, index: int, run: ExecuteFn, batch: list[Pending]) -> None:
        clock = self._clock
        finishing = False
        try:
            for hook in self._hooks:
                try:
                    hook.begin(index, batch)
                except Exception:  # a hook must not stop serving, but say so
                    log.exception("batch hook failed before a batch of model %s", self.name)
            start = clock()
            error: BaseException | None = None
            try:
                results, (t_in, t_infer, t_out) = run(batch)
                if len(results) != len(batch):
                    raise RuntimeError(f"runner returned {len(results)} results for {len(batch)} requests")
            except BaseException as exc:  # a backend failure fails its own batch only
                error = exc
                t_in = t_out = 0
                t_infer = clock() - start
                err = exc if isinstance(exc, InferenceError) else InferenceError(str(exc))
                results = [err] * len(batch)
            end = clock()
            with self._lock:
                self._batch_ns_avg = (
                    0.9 * self._batch_ns_avg + 0.1 * (end - start) if self._batch_ns_avg else (end - start)
                )
                for p in batch:
                    p.state = DONE
                    p.done_ns = end
                self._in_flight -= len(batch)
            timing = BatchTiming(start, end, t_in, t_infer, t_out)
            if self.planner is not None and error is None:  # a failure's timing says nothing of the cost
                self.planner.batch_done(
                    sum(p.rows for p in batch), end - start, [end - p.enqueued_ns for p in batch], end
                )
            for hook in self._hooks:
                try:
                    hook.end(index, batch, timing, error)
                except InferenceError as refused:
                    results = [refused] * len(batch)
                    error = refused  # later hooks (statistics) see the batch as failed
                except Exception:  # a hook must not stop serving, but say so
                    log.exception("batch hook failed after a batch of model %s", self.name)
            finishing = True
            self._finish(list(zip(batch, results, strict=True)))
        except Exception:
            self._fail_batch(batch, finishing)
            raise

    def _fail_batch(self, batch: list[Pending], finishing: bool) -> None:
        """Answers a batch whose iteration failed with a 500, so that no client waits for it forever."""
        err = InferenceError(
            f"internal error in the batcher of model '{self.name}'; the batch was not completed"
        )
        with self._lock:
            for p in batch:
                if p.state != DONE:
                    p.state = DONE
                    self._in_flight -= 1
        items = [(p, err) for p in batch]
        if finishing:
            # Delivery itself failed: hand the errors over directly (any ordering hold-back is already undone).
            self._deliver(items)
        else:
            self._finish(items)

    def _pause_after_error(self, failures: int) -> bool:
        """Waits before the next iteration after ``failures`` failed in a row; True when stopping meanwhile."""
        return self._stopped.wait(min(ERROR_PAUSE_MAX_S, ERROR_PAUSE_S * 2 ** min(failures - 1, 10)))

    def _reject_timed_out(self, expired: list[Pending]) -> None:
        self._finish(
            [(p, RequestTimeout(f"Request timeout expired for model '{self.name}'")) for p in expired]
        )

    def _ensure_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reaper_loop, name=f"{self.name}-reaper", daemon=True)
            self._reaper.start()

    def _reaper_loop(self) -> None:
        failures = 0
        while True:
            try:
                if not self._reap_step():
                    return
                failures = 0
            except Exception as exc:  # a dead reaper would leave every queue timeout unenforced
                failures += 1
                self._thread_errors.record(
                    exc, f"an iteration of the reaper of model '{self.name}' failed; the reaper goes on"
                )
                if self._pause_after_error(failures):
                    return

    def _reap_step(self) -> bool:
        """Rejects the requests whose timeout passed, or sleeps until the next one can. False once stopping."""
        with self._lock:
            if self._stopping:
                return False
            now = self._clock()
            expired = self._expire_due(now)
            if not expired:
                wait = min((self._deadlines[0][0] - now) / 1e9, MAX_WAIT_S) if self._deadlines else None
                self._reap.wait(wait)
                return True
            self._work.notify()  # a DELAYed or removed head may change the next plan
        self._reject_timed_out(expired)
        return True

    def _finish(self, items: list[tuple[Pending, Any]]) -> None:
        if not self.policy.preserve_ordering:
            self._deliver(items)
            return
        # Release strictly in arrival order: hold results until every earlier request is done.
        with self._lock:
            for p, result in items:
                self._held[p.seq] = (p, result)
            ready: list[tuple[Pending, Any]] = []
            while self._next_release in self._held:
                ready.append(self._held.pop(self._next_release))
                self._next_release += 1
            if ready:
                # Deliver under the lock so two threads cannot interleave released runs.
                self._deliver(ready)

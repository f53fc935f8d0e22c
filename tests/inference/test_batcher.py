"""Triton's dynamic-batching rules, each on its own, without a server or a database.

Decision rules are tested through ``plan()`` with a fake clock; behaviour that needs threads
(timeouts while busy, ordering across instances) runs real instance threads on tiny timings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from inference.batcher import BatchPolicy, DynamicBatcher, Pending, QueuePolicy
from inference.errors import BackendError, InferenceError, QueueFull, RequestTimeout, ShuttingDown

MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000 * MS

    def __call__(self) -> int:
        return self.now


def make(policy: BatchPolicy, clock: Any = None, run: Any = None, instances: int = 1, deliver: Any = None):
    delivered: list[tuple[Pending, Any]] = []
    lock = threading.Lock()

    def default_deliver(items: list[tuple[Pending, Any]]) -> None:
        with lock:
            delivered.extend(items)

    def default_run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        return [p.payload for p in batch], (0, 0, 0)

    kwargs = {"clock": clock} if clock is not None else {}
    b = DynamicBatcher(
        "m",
        policy,
        lambda i: run or default_run,
        deliver or default_deliver,
        instances=instances,
        **kwargs,
    )
    return b, delivered


def policy(**kw: Any) -> BatchPolicy:
    base: dict[str, Any] = {
        "max_batch_size": 8,
        "preferred_batch_sizes": (8,),
        "max_queue_delay_ns": 1 * MS,
        "adaptive_delay": False,
    }
    base.update(kw)
    return BatchPolicy(**base)


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


# -- decision rules (plan) -----------------------------------------------------------------


def test_preferred_batch_size_dispatches_at_once() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(4, 8), max_queue_delay_ns=1000 * MS), clock)
    for i in range(4):
        b.enqueue(Pending(i))
    assert b.plan(clock.now) == (4, None)


def test_largest_reachable_preferred_size_is_chosen_before_the_delay() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(2, 4), max_queue_delay_ns=1000 * MS), clock)
    for i in range(5):
        b.enqueue(Pending(i))
    # 5 requests queued: 4 is the largest preferred size reachable; the fifth waits.
    assert b.plan(clock.now) == (4, None)


def test_below_preferred_size_waits_for_the_oldest_request_delay() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(4,), max_queue_delay_ns=2 * MS), clock)
    b.enqueue(Pending("old"))
    clock.now += int(1.5 * MS)
    b.enqueue(Pending("new"))
    # The wait is counted from the OLDEST request: 0.5 ms left, not 2 ms.
    assert b.plan(clock.now) == (0, int(0.5 * MS))
    clock.now += int(0.5 * MS)
    assert b.plan(clock.now) == (2, None)


def test_zero_queue_delay_dispatches_whatever_is_queued() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(8,), max_queue_delay_ns=0), clock)
    b.enqueue(Pending(1))
    assert b.plan(clock.now) == (1, None)


def test_batch_never_exceeds_max_batch_size_in_rows() -> None:
    clock = FakeClock()
    b, _ = make(policy(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_ns=0), clock)
    for i in range(3):
        b.enqueue(Pending(i, rows=3))
    # 3 + 3 = 6 rows; a third request would make 9 > 8, so two go now.
    assert b.plan(clock.now) == (2, None)


def test_full_max_batch_size_goes_now_even_without_preferred_match() -> None:
    clock = FakeClock()
    b, _ = make(policy(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_ns=1000 * MS), clock)
    b.enqueue(Pending("a", rows=5))
    b.enqueue(Pending("b", rows=4))
    # The second request cannot join (9 rows), so the first cannot grow: it goes at once.
    assert b.plan(clock.now) == (1, None)


def test_only_shape_compatible_requests_share_a_batch() -> None:
    clock = FakeClock()
    b, _ = make(policy(max_queue_delay_ns=1000 * MS), clock)
    b.enqueue(Pending("a1", signature=((3,),)))
    b.enqueue(Pending("a2", signature=((3,),)))
    b.enqueue(Pending("b1", signature=((5,),)))
    assert b.plan(clock.now) == (2, None)
    batch = b._pop(2)
    assert [p.payload for p in batch] == ["a1", "a2"]


def test_higher_priority_level_is_batched_first() -> None:
    clock = FakeClock()
    b, _ = make(
        policy(priority_levels=2, default_priority_level=2, preferred_batch_sizes=(2,), max_queue_delay_ns=0),
        clock,
    )
    b.enqueue(Pending("low-1"))  # default level 2
    b.enqueue(Pending("high", priority=1))
    b.enqueue(Pending("low-2", priority=2))
    n, _ = b.plan(clock.now)
    assert [p.payload for p in b._pop(n)] == ["high", "low-1"]


def test_priority_outside_the_levels_is_refused() -> None:
    b, _ = make(policy(priority_levels=2, default_priority_level=1))
    with pytest.raises(InferenceError) as err:
        b.enqueue(Pending("x", priority=3))
    assert err.value.status == 400
    assert "priority 3" in err.value.message


def test_full_level_queue_rejects_at_once_with_retry_after() -> None:
    b, _ = make(
        policy(
            priority_levels=2,
            default_priority_level=1,
            queue_policies={1: QueuePolicy(max_queue_size=2)},
            max_queue_delay_ns=1000 * MS,
        )
    )
    b.enqueue(Pending(1, priority=1))
    b.enqueue(Pending(2, priority=1))
    with pytest.raises(QueueFull) as err:
        b.enqueue(Pending(3, priority=1))
    assert err.value.status == 429
    assert (b"retry-after", b"1") in err.value.headers()
    b.enqueue(Pending(4, priority=2))  # another level has its own (unbounded) queue
    assert b.queued == 3


def test_no_dynamic_batching_executes_each_request_alone() -> None:
    clock = FakeClock()
    b, _ = make(BatchPolicy(max_batch_size=8, dynamic=False), clock)
    for i in range(3):
        b.enqueue(Pending(i))
    assert b.plan(clock.now) == (1, None)


def test_adaptive_delay_dispatches_when_every_request_in_flight_is_queued() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(8,), max_queue_delay_ns=2 * MS, adaptive_delay=True), clock)
    b.enqueue(Pending("only"))
    # Peak in flight is 1 and it is queued: nobody else can send, so do not wait 2 ms.
    assert b.plan(clock.now) == (1, None)


def test_without_adaptive_delay_a_lone_request_waits_like_triton() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(8,), max_queue_delay_ns=2 * MS, adaptive_delay=False), clock)
    b.enqueue(Pending("only"))
    assert b.plan(clock.now) == (0, 2 * MS)


def test_adaptive_delay_waits_while_more_requests_are_in_flight_than_queued() -> None:
    clock = FakeClock()
    b, _ = make(policy(preferred_batch_sizes=(8,), max_queue_delay_ns=2 * MS, adaptive_delay=True), clock)
    for i in range(4):
        b.enqueue(Pending(i))
    b._pop(3)  # three are executing: peak in flight 4, one queued
    assert b.plan(clock.now) == (0, 2 * MS)


# -- timeouts --------------------------------------------------------------------------------


def test_delay_action_moves_a_timed_out_request_behind_the_others() -> None:
    clock = FakeClock()
    b, delivered = make(
        policy(
            default_queue_policy=QueuePolicy(default_timeout_ns=1 * MS, timeout_action="DELAY"),
            max_queue_delay_ns=1000 * MS,
        ),
        clock,
    )
    b.enqueue(Pending("first"))
    clock.now += 2 * MS
    b.enqueue(Pending("second"))
    clock.now += int(0.5 * MS)
    with b._lock:
        assert b._expire_due(clock.now) == []
    assert [p.payload for p in b._iter_queue()] == ["second", "first"]
    assert delivered == []


def test_reject_action_removes_a_timed_out_request() -> None:
    clock = FakeClock()
    b, _ = make(
        policy(default_queue_policy=QueuePolicy(default_timeout_ns=1 * MS), max_queue_delay_ns=1000 * MS),
        clock,
    )
    b.enqueue(Pending("late"))
    b.enqueue(Pending("no-timeout-yet"))
    # The clock moves under the batcher's lock: its scheduler thread, woken by the enqueues, would
    # otherwise see the deadlines pass first and expire them itself (this failed 8 runs in 20).
    with b._lock:
        clock.now += 2 * MS
        expired = b._expire_due(clock.now)
    assert [p.payload for p in expired] == ["late", "no-timeout-yet"]
    assert b.queued == 0


def test_client_timeout_is_honoured_without_a_default() -> None:
    clock = FakeClock()
    b, _ = make(policy(max_queue_delay_ns=1000 * MS), clock)
    p = Pending("x", timeout_us=500)
    b.enqueue(p)
    assert p.deadline_ns == clock.now + 500_000


def test_client_timeout_cannot_override_a_default_unless_allowed() -> None:
    clock = FakeClock()
    fixed, _ = make(policy(default_queue_policy=QueuePolicy(default_timeout_ns=10 * MS)), clock)
    p = Pending("x", timeout_us=500)
    fixed.enqueue(p)
    assert p.deadline_ns == clock.now + 10 * MS
    allowed, _ = make(
        policy(default_queue_policy=QueuePolicy(default_timeout_ns=10 * MS, allow_timeout_override=True)),
        clock,
    )
    q = Pending("y", timeout_us=500)
    allowed.enqueue(q)
    assert q.deadline_ns == clock.now + 500_000


def test_expired_request_is_rejected_promptly_while_every_instance_is_busy() -> None:
    release = threading.Event()
    started = threading.Event()

    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        started.set()
        release.wait(5)
        return [p.payload for p in batch], (0, 0, 0)

    b, delivered = make(policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0), run=run)
    b.start()
    try:
        b.enqueue(Pending("busy"))
        assert started.wait(2)
        t0 = time.monotonic()
        b.enqueue(Pending("waiting", timeout_us=30_000))
        wait_for(lambda: len(delivered) == 1)
        elapsed = time.monotonic() - t0
        ((p, result),) = delivered
        assert p.payload == "waiting"
        assert isinstance(result, RequestTimeout)
        assert result.reason == "REJECTED"
        assert elapsed < 1.0  # the only instance is still busy with "busy"
        assert not release.is_set()
    finally:
        release.set()
        b.stop()
    assert [p.payload for p, _ in delivered] == ["waiting", "busy"]


# -- threads: instances, ordering, failures ------------------------------------------------


def test_instance_group_count_instances_draw_from_one_queue() -> None:
    active = 0
    peak = 0
    lock = threading.Lock()

    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.02)
        with lock:
            active -= 1
        return [threading.current_thread().name for _ in batch], (0, 0, 0)

    b, delivered = make(
        policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0), run=run, instances=2
    )
    b.start()
    try:
        for i in range(6):
            b.enqueue(Pending(i))
        wait_for(lambda: len(delivered) == 6)
    finally:
        b.stop()
    assert peak == 2
    assert {r for _, r in delivered} == {"m-0", "m-1"}


def test_preserve_ordering_delivers_in_arrival_order_across_instances() -> None:
    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        # Earlier requests take longer, so without ordering they would finish last.
        time.sleep(0.05 if batch[0].payload == 0 else 0.001)
        return [p.payload for p in batch], (0, 0, 0)

    order: list[Any] = []
    lock = threading.Lock()

    def deliver(items: list[tuple[Pending, Any]]) -> None:
        with lock:
            order.extend(p.payload for p, _ in items)

    b, _ = make(
        policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0, preserve_ordering=True),
        run=run,
        instances=2,
        deliver=deliver,
    )
    b.start()
    try:
        for i in range(4):
            b.enqueue(Pending(i))
        wait_for(lambda: len(order) == 4)
    finally:
        b.stop()
    assert order == [0, 1, 2, 3]


def test_without_preserve_ordering_a_fast_later_batch_is_not_held_back() -> None:
    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        time.sleep(0.1 if batch[0].payload == 0 else 0.001)
        return [p.payload for p in batch], (0, 0, 0)

    b, delivered = make(
        policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0), run=run, instances=2
    )
    b.start()
    try:
        b.enqueue(Pending(0))
        b.enqueue(Pending(1))
        wait_for(lambda: len(delivered) == 2)
    finally:
        b.stop()
    assert [p.payload for p, _ in delivered] == [1, 0]


def test_backend_exception_fails_only_the_requests_of_its_batch() -> None:
    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        if any(p.payload == "bad" for p in batch):
            raise BackendError("model 'm' failed: boom")
        return [p.payload for p in batch], (0, 0, 0)

    b, delivered = make(policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0), run=run)
    b.start()
    try:
        for payload in ("ok-1", "bad", "ok-2"):
            b.enqueue(Pending(payload))
        wait_for(lambda: len(delivered) == 3)
    finally:
        b.stop()
    results = {p.payload: r for p, r in delivered}
    assert results["ok-1"] == "ok-1" and results["ok-2"] == "ok-2"
    assert isinstance(results["bad"], BackendError) and results["bad"].status == 500


def test_batches_form_while_the_previous_one_runs() -> None:
    sizes: list[int] = []

    def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
        sizes.append(len(batch))
        time.sleep(0.03)
        return [p.payload for p in batch], (0, 0, 0)

    b, delivered = make(
        policy(max_batch_size=8, preferred_batch_sizes=(4, 8), max_queue_delay_ns=100 * MS), run=run
    )
    b.start()
    try:
        b.enqueue(Pending("first"))  # alone: waits its delay... unless more arrive
        for i in range(3):
            b.enqueue(Pending(i))  # reaches preferred size 4 at once
        wait_for(lambda: len(delivered) == 4)
        for i in range(8):
            b.enqueue(Pending(f"second-{i}"))
        wait_for(lambda: len(delivered) == 12)
    finally:
        b.stop()
    assert sizes == [4, 8]


def test_stop_rejects_what_is_still_queued() -> None:
    b, delivered = make(policy(max_queue_delay_ns=1000 * MS))
    b.enqueue(Pending("never-run"))
    b.stop()
    ((_p, result),) = delivered
    assert isinstance(result, ShuttingDown)
    with pytest.raises(ShuttingDown):
        b.enqueue(Pending("after-stop"))


def test_a_hook_that_refuses_a_batch_fails_its_answers_and_later_hooks_see_the_failure() -> None:
    seen: list[BaseException | None] = []

    class Refuse:
        def begin(self, index: int, batch: list[Pending]) -> None:
            pass

        def end(self, index: int, batch: list[Pending], timing: Any, error: BaseException | None) -> None:
            raise InferenceError("the ledger spool is full", 503)

    class Record:
        def begin(self, index: int, batch: list[Pending]) -> None:
            pass

        def end(self, index: int, batch: list[Pending], timing: Any, error: BaseException | None) -> None:
            seen.append(error)

    delivered: list[tuple[Pending, Any]] = []
    b = DynamicBatcher(
        "m",
        policy(max_batch_size=1, preferred_batch_sizes=(1,), max_queue_delay_ns=0),
        lambda i: lambda batch: ([p.payload for p in batch], (0, 0, 0)),
        delivered.extend,
        hooks=[Refuse(), Record()],
    )
    b.start()
    try:
        b.enqueue(Pending("x"))
        wait_for(lambda: len(delivered) == 1)
    finally:
        b.stop()
    ((_p, result),) = delivered
    assert isinstance(result, InferenceError) and result.status == 503
    assert isinstance(seen[0], InferenceError)

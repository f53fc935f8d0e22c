"""What the modelled CPU meter of a gateway counts (inference/meters/serving_cpu.py): the threads that execute
batches, the native threads of compute libraries and the event loop less its web work; not Django's work, on the
loop or in its threads. Real threads and a real event loop burning real CPU time; no Django."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from inference.meters.serving_cpu import ServingCpu

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread CPU clocks are Linux's")

BURN_S = 0.15


def burn(seconds: float = BURN_S) -> None:
    """Spend about ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class FakeThreads:
    """The process's threads and their CPU clocks, set by hand."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.python: list[Any] = []

    def account(self, **kwargs: Any) -> ServingCpu:
        return ServingCpu(
            task_ids=lambda: list(self.cpu),
            thread_cpu_s=self.cpu.get,
            python_threads=lambda: self.python,
            **kwargs,
        )


class PythonThread:
    def __init__(self, native_id: int) -> None:
        self.native_id = native_id


def _attached(threads: FakeThreads, loop_tid: int) -> ServingCpu:
    cpu = threads.account()
    cpu.loop_tid = loop_tid
    cpu._process_mode = False  # as attach() leaves it, without a running loop
    return cpu


def test_threads_that_execute_batches_count_whole_other_python_threads_not_at_all() -> None:
    threads = FakeThreads()
    threads.cpu = {1: 0.0, 10: 0.0, 11: 0.0}
    threads.python = [PythonThread(1), PythonThread(10), PythonThread(11)]
    cpu = _attached(threads, loop_tid=1)
    assert cpu.cpu_seconds() == 0.0
    threads.cpu.update({10: 2.0, 11: 5.0})  # 10 runs batches; 11 is a Django request thread or a keeper
    cpu.hook_for(None).begin(0, [])  # registers the calling thread...
    cpu.serving_threads.add(10)  # ...as the batcher's instance thread 10 does at its first batch
    assert cpu.cpu_seconds() == pytest.approx(2.0)  # its time up to the first batch was serving too
    threads.cpu.update({10: 2.5, 11: 9.0})
    assert cpu.cpu_seconds() == pytest.approx(2.5)


def test_native_threads_count_from_when_first_seen_and_a_finishing_python_thread_never_does() -> None:
    threads = FakeThreads()
    threads.cpu = {1: 0.0, 20: 3.0, 30: 7.0}
    threads.python = [PythonThread(1), PythonThread(30)]
    cpu = _attached(threads, loop_tid=1)
    cpu.cpu_seconds()
    threads.cpu.update({20: 4.0, 30: 8.0})  # 20: onnxruntime's pool thread, 30: a Django request thread
    threads.python = [PythonThread(1)]  # 30 left threading's table and is exiting
    assert cpu.cpu_seconds() == pytest.approx(1.0)
    threads.cpu.pop(30)
    threads.cpu[40] = 6.0  # a new native thread: its time before it was seen is not known to be ours
    assert cpu.cpu_seconds() == pytest.approx(1.0)
    threads.cpu[40] = 6.5
    assert cpu.cpu_seconds() == pytest.approx(1.5)


def test_the_loop_counts_less_its_web_work_and_the_webs_share_of_the_untimed_work() -> None:
    threads = FakeThreads()
    threads.cpu = {1: 1.0}
    threads.python = [PythonThread(1)]
    cpu = _attached(threads, loop_tid=1)
    cpu.cpu_seconds()
    # Inference only: the loop's time is all the gateway's.
    threads.cpu[1] = 3.0
    cpu.gateway_requests += 100
    assert cpu.cpu_seconds() == pytest.approx(2.0)
    # Web only: 0.9 s timed in Django, 0.1 s untimed (parsing its requests): none of it.
    threads.cpu[1] = 4.0
    cpu.web_s += 0.9
    cpu.web_requests += 50
    assert cpu.cpu_seconds() == pytest.approx(2.0)
    # Both: the gateway's timed 0.6 s, the web's 0.2 s, 0.2 s untimed shared 3:1 by request counts.
    threads.cpu[1] = 5.0
    cpu.gateway_s += 0.6
    cpu.web_s += 0.2
    cpu.gateway_requests += 30
    cpu.web_requests += 10
    assert cpu.cpu_seconds() == pytest.approx(2.0 + 0.6 + 0.15)


def test_where_threads_cannot_be_told_apart_the_whole_process_counts() -> None:
    process = [1.0]

    def no_tasks() -> list[int]:
        raise OSError("no /proc")

    cpu = ServingCpu(task_ids=no_tasks, process_cpu_s=lambda: process[0])

    async def attach() -> bool:
        return cpu.attach()

    assert asyncio.run(attach()) is False
    assert not cpu.per_thread
    assert cpu.cpu_seconds() == 0.0
    process[0] = 3.5
    assert cpu.cpu_seconds() == 2.5


def test_web_work_on_the_loop_and_in_the_tasks_it_starts_is_left_out_while_the_gateways_counts() -> None:
    """A real loop: Django's ASGI handler runs each request's view in a task of its own."""
    cpu = ServingCpu()

    async def django_like(scope: Any, receive: Any, send: Any) -> None:
        burn()  # reading the body, building the request: on the handler's own steps

        async def process_request() -> None:
            await asyncio.sleep(0)
            burn()  # middleware and rendering: in a task the handler started
            await asyncio.sleep(0)
            burn()

        await asyncio.gather(asyncio.create_task(process_request()))

    web = cpu.web_app(django_like)

    async def gateway_like() -> None:
        burn()
        await asyncio.sleep(0)
        burn()

    async def run(handler: Callable[[], Any]) -> float:
        before = cpu.cpu_seconds()
        await handler()
        return cpu.cpu_seconds() - before

    async def main() -> tuple[float, float, float]:
        assert cpu.attach()
        cpu.cpu_seconds()
        web_d = await run(lambda: web({"type": "http"}, None, None))
        gateway_d = await run(gateway_like)
        cpu.gateway_requests += 1
        timed_d = await run(lambda: cpu.timed(gateway_like()))
        return web_d, gateway_d, timed_d

    web_d, gateway_d, timed_d = asyncio.run(main())
    assert cpu.web_requests == 1 and cpu.web_active
    assert cpu.web_s >= 3 * BURN_S * 0.9
    assert web_d < 0.3 * BURN_S, (web_d, cpu.web_s)
    assert gateway_d >= 2 * BURN_S * 0.9
    assert timed_d >= 2 * BURN_S * 0.9 and cpu.gateway_s >= 2 * BURN_S * 0.9


def test_a_registered_instance_thread_counts_and_an_unregistered_python_thread_does_not() -> None:
    cpu = ServingCpu()
    hook = cpu.hook_for(None)

    def instance() -> None:
        hook.begin(0, [])
        burn()

    async def main() -> tuple[float, float]:
        assert cpu.attach()
        cpu.cpu_seconds()
        before = cpu.cpu_seconds()
        for target in (instance, burn):
            t = threading.Thread(target=target)
            t.start()
            while t.is_alive():
                cpu.cpu_seconds()  # read while it runs, as the meter's timer does
                await asyncio.sleep(0.01)
            t.join()
            if target is instance:
                after_instance = cpu.cpu_seconds()
        return after_instance - before, cpu.cpu_seconds() - after_instance

    instance_d, other_d = asyncio.run(main())
    assert instance_d >= BURN_S * 0.5
    assert other_d < 0.3 * BURN_S


def test_cancelling_timed_work_reaches_it_and_its_result_and_errors_pass_through() -> None:
    cpu = ServingCpu()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("boom")

    async def returns() -> int:
        await asyncio.sleep(0)
        return 7

    async def main() -> None:
        task = asyncio.ensure_future(cpu.timed(waits()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(KeyError):
            await cpu.timed(fails())
        assert await cpu.timed(returns()) == 7

    asyncio.run(main())
    assert seen == ["cancelled"]

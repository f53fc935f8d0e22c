"""The CPU time of a gateway's serving work, which the modelled CPU meter turns into energy.

A gateway process may host the dashboard and the management API too (the ``all`` role): their CPU time is not
the inference device's, and must not land on its idle line. What counts, in every role:

* **the threads that execute batches**: each registers itself at its first batch (:meth:`ServingCpu.hook_for`,
  a batch hook), and counts whole from then on;
* **the threads Python did not start**: the native pools of the compute libraries (onnxruntime's intra-op
  threads, gRPC's core threads);
* **the event loop's thread**, less its web work: the dashboard's and the API's requests go through
  :meth:`ServingCpu.web_app`, which times each step of Django's ASGI handler and of the tasks it starts, on the
  loop's own CPU clock, and leaves that out. What no timer saw (parsing requests, accepting connections, a
  direct infer's answer) is shared between the gateway and the web by their request counts, so a web request's
  parsing does not count either. While web requests come (in the last :data:`WEB_ACTIVE_S`), the gateway's own
  handlers are timed too (:meth:`ServingCpu.timed`), so that its timed work is never shared away.

Not counted: Django's threads (asgiref runs each request's sync code in a thread of its own), the pool that
looks API keys up, the bookkeeping threads (meter timer, lease keepers, ledger status, carbon signal), and the
ledger drainer, a process of its own. With the web role apart, the loop's time is all the gateway's.

Linux only (``/proc/self/task`` and the per-thread CPU clocks); elsewhere, and until :meth:`ServingCpu.attach`
names the event loop, the whole process's CPU time counts, as before.

Framework-free: no Django. One instance per process (:data:`SERVING_CPU`): CPU time is a process's.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from pathlib import Path
from typing import Any, Final, cast

TASKS: Final = Path("/proc/self/task")
#: After the last web request, how long the gateway's handlers stay timed.
WEB_ACTIVE_S: Final = 10.0

Scope = dict[str, Any]
AsgiApp = Callable[[Scope, Any, Any], Awaitable[None]]

_WEB: contextvars.ContextVar[bool] = contextvars.ContextVar("carbonledger_web_work", default=False)


def thread_cpu_clock(tid: int) -> int:
    """The CPU-time clock of thread ``tid`` of this process (Linux: what ``pthread_getcpuclockid`` returns for
    the thread, built from its kernel id, so native threads that Python never saw can be read too)."""
    return (~tid << 3) | 6  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


def _thread_cpu_s(tid: int) -> float | None:
    try:
        return time.clock_gettime(thread_cpu_clock(tid))
    except OSError:  # the thread has exited
        return None


def _task_ids() -> list[int]:
    return [int(name) for name in os.listdir(TASKS)]


class _Steps:
    """Awaits ``coro``, adding the loop thread's CPU time of each of its steps to ``add``."""

    __slots__ = ("_add", "_coro")

    def __init__(self, coro: Coroutine[Any, Any, Any], add: Callable[[float], None]) -> None:
        self._coro = coro
        self._add = add

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, add, clock = self._coro, self._add, time.thread_time
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                add(clock() - t0)
                return stop.value
            except BaseException:
                add(clock() - t0)
                raise
            add(clock() - t0)
            try:
                value = yield yielded
                error = None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation and the like: the inner coroutine handles it
                value, error = None, exc


class _RegisterThread:
    """A batch hook that counts the instance thread it runs on as serving (once)."""

    __slots__ = ("_threads",)

    def __init__(self, threads: set[int]) -> None:
        self._threads = threads

    def begin(self, index: int, batch: Any) -> None:
        tid = threading.get_native_id()
        if tid not in self._threads:
            self._threads.add(tid)

    def end(self, index: int, batch: Any, timing: Any, error: BaseException | None) -> None:
        pass


class ServingCpu:
    """CPU seconds of this process's serving work (see the module doc); :meth:`cpu_seconds` is the meter's
    ``cpu_time_s``. The counters the event loop moves are plain attributes, written on the loop's thread only
    and read with their last values by :meth:`cpu_seconds`, so the request path takes no lock."""

    def __init__(
        self,
        *,
        task_ids: Callable[[], list[int]] = _task_ids,
        thread_cpu_s: Callable[[int], float | None] = _thread_cpu_s,
        python_threads: Callable[[], list[threading.Thread]] = threading.enumerate,
        process_cpu_s: Callable[[], float] = time.process_time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._task_ids = task_ids
        self._thread_cpu_s = thread_cpu_s
        self._python_threads = python_threads
        self._process_cpu_s = process_cpu_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.serving_threads: set[int] = set()
        self.loop_tid: int | None = None
        # Moved on the event loop's thread only.
        self.web_s = 0.0  # loop CPU time in web work
        self.gateway_s = 0.0  # loop CPU time in the gateway's handlers, timed while web requests come
        self.web_requests = 0
        self.gateway_requests = 0
        self.web_active = False  # time the gateway's handlers (web requests came in the last WEB_ACTIVE_S)
        self._web_until = 0.0
        # The reader's state (under _lock).
        self._total_s = 0.0
        self._last: dict[int, float] = {}
        self._python_seen: set[int] = set()
        self._last_loop = (0.0, 0.0, 0.0, 0, 0)  # loop CPU, web_s, gateway_s, web and gateway requests
        self._process_mode = True
        self._last_process_s: float | None = None
        self._read = False  # a meter reads this account: only then is web work timed

    # -- wiring ----------------------------------------------------------------------------------

    @property
    def per_thread(self) -> bool:
        """Whether serving work is told apart (Linux, the loop attached); else the whole process counts."""
        return not self._process_mode

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Call on the event loop's thread once the loop runs: names the loop's thread and times the tasks
        that web work starts. False (the whole process then counts) where threads cannot be told apart."""
        loop = loop or asyncio.get_running_loop()
        try:
            self._task_ids()
            usable = self._thread_cpu_s(threading.get_native_id()) is not None
        except OSError:
            usable = False
        if not usable:
            return False
        previous = loop.get_task_factory()
        if getattr(previous, "__self__", None) is not self:
            self._previous_factory = previous
            # Typeshed's factory type has no ``context`` keyword, which create_task passes since 3.11.
            loop.set_task_factory(cast(Any, self._task_factory))
        with self._lock:
            self.loop_tid = threading.get_native_id()
            self._process_mode = False
            self._last_process_s = None
            self._last_loop = (0.0, 0.0, 0.0, 0, 0)  # the next reading is this loop's baseline
        return True

    def hook_for(self, mv: Any) -> _RegisterThread:
        """A batch hook (``Gateway(hooks=[...])``): the threads that execute batches count as serving."""
        return _RegisterThread(self.serving_threads)

    def web_app(self, app: AsgiApp) -> AsgiApp:
        """``app`` (Django's ASGI handler), with its work on the event loop timed and left out of serving."""

        async def web(scope: Scope, receive: Any, send: Any) -> None:
            if self._process_mode or not self._read or threading.get_native_id() != self.loop_tid:
                await app(scope, receive, send)  # nothing to tell apart, or no meter reads serving time
                return
            self.web_requests += 1
            self.web_active = True
            self._web_until = self._monotonic() + WEB_ACTIVE_S
            token = _WEB.set(True)
            try:
                await _Steps(app(scope, receive, send), self._add_web)  # type: ignore[arg-type]
            finally:
                _WEB.reset(token)

        return web

    def timed(self, coro: Coroutine[Any, Any, Any]) -> _Steps:
        """``coro`` (a gateway handler), its steps on the loop counted as the gateway's."""
        return _Steps(coro, self._add_gateway)

    def charge_gateway(self, seconds: float) -> None:
        """Loop CPU time a gateway handler spent outside any task (a direct infer), timed by its caller."""
        self.gateway_s += seconds

    def _add_web(self, seconds: float) -> None:
        self.web_s += seconds

    def _add_gateway(self, seconds: float) -> None:
        self.gateway_s += seconds

    _previous_factory: Any = None

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Future[Any]:
        context: contextvars.Context | None = kwargs.get("context")
        web = context.get(_WEB, False) if context is not None else _WEB.get()
        if web:  # a task web work started (Django runs each request's view in one)
            coro = self._web_task(coro)
        previous = self._previous_factory
        if previous is not None:
            return previous(loop, coro, **kwargs)  # type: ignore[no-any-return]
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def _web_task(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await _Steps(coro, self._add_web)

    # -- reading ---------------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """Cumulative CPU seconds of serving work (non-decreasing); the first call is the baseline's."""
        with self._lock:
            self._read = True
            if self._process_mode:
                now = self._process_cpu_s()
                if self._last_process_s is not None:
                    self._total_s += max(0.0, now - self._last_process_s)
                self._last_process_s = now
                return self._total_s
            self._total_s += self._threads_delta() + self._loop_delta()
            if self.web_active and self._monotonic() >= self._web_until:
                self.web_active = False
            return self._total_s

    def _threads_delta(self) -> float:
        tasks = set(self._task_ids())
        # A thread Python started, once seen as one, is never taken for a native thread: between leaving
        # threading's table and exiting, a finishing request thread of Django's must not count.
        python = {t.native_id for t in self._python_threads() if t.native_id is not None}
        self._python_seen = (self._python_seen | python) & tasks
        self.serving_threads.intersection_update(tasks)  # in place: the batch hooks hold this set
        registered = set(self.serving_threads)
        native = tasks - self._python_seen - registered
        if self.loop_tid is not None:
            native.discard(self.loop_tid)
        delta = 0.0
        seen: dict[int, float] = {}
        for tid, whole in [*((t, True) for t in registered), *((t, False) for t in native)]:
            now = self._thread_cpu_s(tid)
            if now is None:
                continue
            seen[tid] = now
            last = self._last.get(tid)
            if last is not None and now >= last:
                delta += now - last
            elif whole:
                # An instance thread registers at its first batch: its time up to then was serving too.
                delta += now
            # A native thread counts from when it is first seen (a lower value: a new thread, a reused id).
        self._last = seen
        return delta

    def _loop_delta(self) -> float:
        assert self.loop_tid is not None
        loop_now = self._thread_cpu_s(self.loop_tid)
        if loop_now is None:
            return 0.0
        web_s, gateway_s, web_n, gateway_n = (
            self.web_s,
            self.gateway_s,
            self.web_requests,
            self.gateway_requests,
        )
        loop0, web0, gateway0, web_n0, gateway_n0 = self._last_loop
        self._last_loop = (loop_now, web_s, gateway_s, web_n, gateway_n)
        if loop0 == 0.0:
            return 0.0  # the baseline
        loop_d = max(0.0, loop_now - loop0)
        web_d = max(0.0, web_s - web0)
        gateway_d = max(0.0, gateway_s - gateway0)
        web_n_d = web_n - web_n0
        gateway_n_d = gateway_n - gateway_n0
        untimed = max(0.0, loop_d - web_d - gateway_d)
        web_share = untimed * web_n_d / (web_n_d + gateway_n_d) if web_n_d > 0 else 0.0
        return max(0.0, loop_d - web_d - web_share)


#: The process's one account of serving CPU time.
SERVING_CPU: Final = ServingCpu()

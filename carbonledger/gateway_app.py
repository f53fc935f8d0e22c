"""Builds the inference gateway from Django settings: API keys from the database, and (unless
LEDGER_ENABLED is off) the energy recorder and the ledger writer as its services."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection
from django.utils import timezone

from carbon.selectors import grid_signal
from inference.errors import THREAD_ERRORS, ThreadErrors
from inference.gateway import Gateway, Principal
from inference.meters import registry
from inference.recorder import LedgerRecorder, RecorderOptions
from inference.repository import GatewayOptions
from inference.spool import Spool
from ledger.selectors import quarantined_count
from ledger.writer import LedgerWriter, default_site, read_drainer_status
from tenancy import selectors

log = logging.getLogger(__name__)


def _principal_for(raw_key: str) -> Principal | None:
    close_old_connections()
    key = selectors.api_key_lookup(raw_key)
    if key is None:
        return None
    return Principal(
        organization_id=key.organization_id,
        organization_slug=key.organization.slug,
        key_id=key.pk,
        scopes=key.scope_set,
    )


# thread_sensitive=False: lookups run in the default thread pool, never on the event loop.
resolve_principal = sync_to_async(_principal_for, thread_sensitive=False)


def gateway_options() -> GatewayOptions:
    return GatewayOptions(
        triton_url=settings.TRITON_URL,
        triton_protocol=settings.TRITON_PROTOCOL,
        remote_timeout_s=settings.TRITON_TIMEOUT_S,
        onnx_threads=settings.GATEWAY_ONNX_THREADS,
        adaptive_delay=settings.GATEWAY_ADAPTIVE_DELAY,
        max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
        carbon_aware=settings.CARBON_AWARE,
        carbon_aware_efficiency=settings.CARBON_AWARE_EFFICIENCY,
        freeze_heap_after_start=settings.GATEWAY_GC_FREEZE,
    )


def detect_meters() -> list[Any]:
    sources = (
        None if settings.METERS == "auto" else [s.strip() for s in settings.METERS.split(",") if s.strip()]
    )
    options: dict[str, Any] = {
        "triton_url": settings.METER_TRITON_URL or None,
        "cpu_model_options": {
            "tdp_w": settings.CPU_TDP_W,
            "cores": settings.CPU_CORES or None,
            "memory_w_per_gb": settings.MEMORY_W_PER_GB,
        },
    }
    if sources is not None:
        options["sources"] = sources
    try:
        meters = registry.detect_meters(**options)
    except ValueError as exc:
        raise ImproperlyConfigured(f"METERS: {exc}") from exc
    if not meters:
        raise ImproperlyConfigured(f"METERS={settings.METERS!r} found no usable meter on this host")
    return meters


class DrainerThreadError(Exception):
    """Stands in this process's tally for a failure a thread of the drainer process survived and logged."""


class DrainerProcess:
    """The ledger writer in a process of its own (``manage.py drain_ledger``), kept running.

    Measured here: an in-process writer takes a quarter of the GIL at 4,000 requests/s and
    doubles the gateway's p99; in its own process it costs the event loop nothing. A watchdog
    thread restarts it if it dies; the spool holds everything meanwhile.
    """

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        # Thread error counts each drainer process started here published, as far as they are in this
        # process's tally already (a status file left by another gateway's drainer is not ours).
        self._mirrored: dict[int, dict[str, int]] = {}

    def _spawn(self) -> None:
        manage = Path(settings.BASE_DIR) / "manage.py"
        argv = [sys.executable, str(manage), "drain_ledger", "--spool", str(self.spool_dir)]
        # A session of its own: a Ctrl-C or SIGTERM sent to the gateway's process group must not
        # stop the drainer before the gateway has spooled its last interval; the gateway stops
        # it last, and if the gateway is killed outright the drainer sees it is orphaned.
        self.proc = subprocess.Popen(
            [*argv, "--parent-pid", str(os.getpid())], cwd=settings.BASE_DIR, start_new_session=True
        )
        self._mirrored.setdefault(self.proc.pid, {})
        log.info("ledger writer process %d drains %s", self.proc.pid, self.spool_dir)

    def mirror_thread_errors(self) -> None:
        """Count in this process's tally (hence in /metrics) the failures the drainer process's threads
        survived since the last call, as it publishes them next to the spool."""
        status = read_drainer_status(self.spool_dir)
        if status is None or status[0] not in self._mirrored:
            return
        pid, counts = status
        mirrored = self._mirrored[pid]
        for thread, count in counts.items():
            for _ in range(count - mirrored.get(thread, 0)):
                THREAD_ERRORS.record(
                    DrainerThreadError(f"ledger writer process {pid}, thread {thread}"),
                    f"the ledger writer process {pid} survived a failure in its thread {thread} (its log says which)",
                    thread=thread,
                )
            mirrored[thread] = max(count, mirrored.get(thread, 0))

    def start(self) -> None:
        self._spawn()
        self._watchdog = threading.Thread(target=self._watch, name="ledger-writer-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        backoff = 1.0
        while not self._stopping.wait(backoff):
            try:
                proc = self.proc
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    log.error(
                        "ledger writer process %d exited with %s; restarting it", proc.pid, proc.returncode
                    )
                    # Before the spawn: a spawn that fails must not be retried at once either.
                    backoff = min(30.0, backoff * 2)
                    self._spawn()
                else:
                    backoff = 1.0
            except Exception as exc:  # a watchdog that dies would leave the spool undrained for good
                THREAD_ERRORS.record(exc, "the ledger writer's watchdog could not restart it; it tries again")

    def stop(self) -> None:
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(5)
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=70)
        except subprocess.TimeoutExpired:
            log.error("ledger writer process %d did not stop; killing it", self.proc.pid)
            self.proc.kill()
            self.proc.wait(5)


class LedgerStatusService:
    """What /metrics says about the ledger, kept on a thread of its own every ``interval_s``: the spool lines
    quarantined and not yet resolved (one indexed count in the database), and the failures the drainer
    process's threads survived. A scrape (on the event loop) reads this snapshot, never the database."""

    def __init__(self, interval_s: float, drainer: DrainerProcess | None = None) -> None:
        self.interval_s = interval_s
        self.drainer = drainer
        self.quarantined: int | None = None  # None until the first count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        self.quarantined = quarantined_count()
        if self.drainer is not None:
            self.drainer.mirror_thread_errors()

    def prometheus_lines(self) -> list[str]:
        quarantined = self.quarantined
        if quarantined is None:
            return []
        name = "carbonledger_ledger_quarantined_records"
        return [
            f"# HELP {name} spool lines the database refused for their data, neither retried nor dismissed "
            "(manage.py ledger_quarantine); the records around them were written",
            f"# TYPE {name} gauge",
            f"{name} {quarantined}",
        ]

    def _run(self) -> None:
        try:
            while True:
                try:
                    close_old_connections()
                    self.refresh()
                except Exception as exc:  # the database may be down: /metrics keeps the last count
                    THREAD_ERRORS.record(
                        exc, "the ledger's quarantine not counted; /metrics keeps the last count"
                    )
                if self._stop.wait(self.interval_s):
                    return
        finally:
            connection.close()  # this thread's own connection (Django's are per thread)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ledger-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class LedgerGateway(Gateway):
    """The inference gateway, with what the Django side knows of the ledger appended to /metrics."""

    def __init__(self, *args: Any, ledger_status: LedgerStatusService | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger_status = ledger_status

    def metrics(self) -> bytes:
        body = super().metrics()
        lines = self.ledger_status.prometheus_lines() if self.ledger_status is not None else []
        return body + "".join(f"{line}\n" for line in lines).encode() if lines else body


class WriterService:
    """The ledger writer as a gateway service: recover the chain, then drain the spool."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def start(self) -> None:
        self.writer.recover()
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()


class SpoolService:
    """Owns the spool: closes it (releasing the directory lock) once everything writing to it stopped."""

    def __init__(self, spool: Any) -> None:
        self.spool = spool

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.spool.close()


class GridSignalService:
    """Carbon-aware serving: every ``CARBON_SIGNAL_INTERVAL_S`` reads the intensity and the threshold of the
    gateway's site (where its devices are placed) and hands them to the gateway's grid state, on a thread of
    its own (the ORM never runs on the event loop)."""

    def __init__(self, interval_s: float, thread_errors: ThreadErrors = THREAD_ERRORS) -> None:
        self.interval_s = interval_s
        self.grid: Any = None  # the repository's GridState, set once the gateway is built
        self._thread_errors = thread_errors
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        signal_now = grid_signal(default_site(), timezone.now())
        self.grid.update(
            None if signal_now.intensity_g_per_kwh is None else float(signal_now.intensity_g_per_kwh),
            None if signal_now.threshold_g_per_kwh is None else float(signal_now.threshold_g_per_kwh),
            f"{signal_now.zone}: {signal_now.intensity_source}; threshold {signal_now.threshold_source}",
        )
        log.info("carbon-aware mode %s (%s)", signal_now.mode, self.grid.source)

    def _run(self) -> None:
        while True:
            try:
                close_old_connections()  # a connection the database dropped since the last round
                self.refresh()
            except Exception as exc:  # the database may be down: serving goes on with the last state
                # Logged once (not every round while it lasts) and counted in /metrics.
                self._thread_errors.record(exc, "carbon-aware signal not refreshed; keeping the last one")
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="carbon-signal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def build_gateway() -> Gateway:
    hooks: list[Any] = []
    services: list[Any] = []
    admission = None
    ledger_status = None
    if settings.LEDGER_ENABLED:
        spool = Spool(settings.SPOOL_DIR, max_backlog_bytes=settings.SPOOL_MAX_BYTES)
        spool.sync_acknowledged()  # what a drainer process already had in the database
        writer_service: Any
        if settings.LEDGER_WRITER == "process":
            writer_service = DrainerProcess(settings.SPOOL_DIR)
        else:
            writer_service = WriterService(LedgerWriter(spool, interval_s=settings.LEDGER_WRITE_INTERVAL_S))
        recorder = LedgerRecorder(
            spool,
            detect_meters(),
            RecorderOptions(
                sample_interval_s=settings.METER_INTERVAL_S,
                idle_power_w=settings.DEVICE_IDLE_POWER_W,
                idle_carry_s=settings.DEVICE_IDLE_CARRY_S,
            ),
        )
        hooks.append(recorder.hook_for)
        ledger_status = LedgerStatusService(
            settings.LEDGER_STATUS_INTERVAL_S,
            writer_service if isinstance(writer_service, DrainerProcess) else None,
        )
        # Stopped in reverse: the recorder spools its last interval, the writer drains, then the
        # spool closes.
        services = [SpoolService(spool), writer_service, recorder, ledger_status]
        admission = recorder
    signal_service = GridSignalService(settings.CARBON_SIGNAL_INTERVAL_S) if settings.CARBON_AWARE else None
    if signal_service is not None:
        services.append(signal_service)
    gateway = LedgerGateway(
        settings.MODEL_REPOSITORY,
        gateway_options(),
        resolve_principal,
        hooks=hooks,
        key_cache_seconds=settings.API_KEY_CACHE_SECONDS,
        services=services,
        admission=admission,
        ledger_status=ledger_status,
    )
    if signal_service is not None:
        signal_service.grid = gateway.repository.grid
    return gateway

"""Builds the inference gateway from Django settings: API keys from the database, and (unless
LEDGER_ENABLED is off) the energy recorder and the ledger writer as its services."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection
from django.utils import timezone

from carbon.selectors import grid_signal
from carbonledger.db_wait import call_until_database_answers
from carbonledger.device_leases import DeviceLeases, LeasedRecorder
from carbonledger.replica_status import ReplicaStatus, database_checks
from inference.errors import THREAD_ERRORS, ThreadErrors
from inference.gateway import DirectInfer, Gateway, Principal, Respond
from inference.grpc_server import GrpcFrontEnd
from inference.meters import Meter, registry
from inference.meters.host import detect_host_id
from inference.meters.serving_cpu import SERVING_CPU
from inference.metrics import EnergyMetrics
from inference.readiness import Readiness
from inference.recorder import RecorderOptions
from inference.repository import GatewayOptions
from inference.spool import Spool
from ledger.ownership import EXIT_CHAIN_HELD, ChainOwnership
from ledger.selectors import quarantined_count
from ledger.writer import LedgerWriter, default_site, read_drainer_state, read_drainer_status
from tenancy import selectors

log = logging.getLogger(__name__)


def _principal_for(raw_key: str) -> Principal | None:
    try:
        key = selectors.api_key_lookup(raw_key)
    finally:
        # Released at once (back to the pool, or closed): a thread of the executor keeps none between lookups.
        connection.close()
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


def host_id() -> str:
    """This host's id in device ids: CARBONLEDGER_HOST_ID, else detected (inference/meters/host.py)."""
    if settings.HOST_ID:
        return str(settings.HOST_ID)
    found, source = detect_host_id()
    log.info("host id %s (from %s; CARBONLEDGER_HOST_ID names it otherwise)", found, source)
    return found


def cpu_model_options() -> dict[str, Any]:
    """The modelled CPU meter books the gateway's serving work only (inference/meters/serving_cpu.py)."""
    return {
        "tdp_w": settings.CPU_TDP_W,
        "cores": settings.CPU_CORES or None,
        "memory_w_per_gb": settings.MEMORY_W_PER_GB,
        "cpu_time_s": SERVING_CPU.cpu_seconds,
        "cpu_time_label": "the gateway's serving work (inference/meters/serving_cpu.py)",
    }


def detect_meters(host: str | None = None, instance: str | None = None) -> list[Any]:
    """The meters this host has, unclaimed. ``instance`` names this gateway in its modelled CPU's device id
    (its ledger chain id)."""
    sources = (
        None if settings.METERS == "auto" else [s.strip() for s in settings.METERS.split(",") if s.strip()]
    )
    options: dict[str, Any] = {
        "triton_url": settings.METER_TRITON_URL or None,
        "rapl_root": settings.METER_RAPL_ROOT,
        "host_id": host or host_id(),
        "instance": instance,
        "cpu_model_options": cpu_model_options(),
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


def leased_recorder(spool: Spool, **kwargs: Any) -> LeasedRecorder:
    """The ledger recorder, its meters claimed in the database when it starts (carbonledger/device_leases.py):
    one gateway per device."""
    host = host_id()

    def own_cpu() -> Meter:  # this gateway's own modelled CPU, when the host's RAPL package is another's
        return registry.cpu_model_meter(cpu_model_options(), host, spool.chain_id)

    return LeasedRecorder(
        spool,
        detect_meters(host, spool.chain_id),
        RecorderOptions(
            sample_interval_s=settings.METER_INTERVAL_S,
            idle_power_w=settings.DEVICE_IDLE_POWER_W,
            idle_carry_s=settings.DEVICE_IDLE_CARRY_S,
        ),
        leases=DeviceLeases(settings.DEVICE_LEASE_TTL_S),
        fallback=own_cpu,
        **kwargs,
    )


class DrainerThreadError(Exception):
    """Stands in this process's tally for a failure a thread of the drainer process survived and logged."""


class DrainerProcess:
    """The ledger writer in a process of its own (``manage.py drain_ledger``), kept running.

    Measured here: an in-process writer takes a quarter of the GIL at 4,000 requests/s and
    doubles the gateway's p99; in its own process it costs the event loop nothing. A watchdog
    thread restarts it if it dies; the spool holds everything meanwhile.
    """

    def __init__(self, spool_dir: Path, ownership: ChainOwnership | None = None) -> None:
        self.spool_dir = spool_dir
        # The chain's lease, held by this (the gateway's) process: the drainer claims it as the same owner, and
        # exits with EXIT_CHAIN_HELD when another process holds it; it is then not restarted.
        self.ownership = ownership
        self.chain_refused = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        # Thread error counts each drainer process started here published, as far as they are in this
        # process's tally already (a status file left by another gateway's drainer is not ours).
        self._mirrored: dict[int, dict[str, int]] = {}
        self.restarts = 0  # processes found dead and started again (/metrics)
        self._written: dict[int, int] = {}  # records each drainer process started here last said it committed
        self._healthy: bool | None = None

    def _spawn(self) -> None:
        manage = Path(settings.BASE_DIR) / "manage.py"
        argv = [sys.executable, str(manage), "drain_ledger", "--spool", str(self.spool_dir)]
        if self.ownership is not None:
            argv += ["--lease-owner", self.ownership.owner]
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

    def alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None

    def written_and_healthy(self) -> tuple[int, bool | None]:
        """Records the drainer processes started here committed (as each last published), and whether the
        running one's last attempt succeeded (None until it said)."""
        state = read_drainer_state(self.spool_dir)
        if state is not None and state.pid in self._mirrored:
            if state.records_written is not None:
                self._written[state.pid] = max(state.records_written, self._written.get(state.pid, 0))
            proc = self.proc
            self._healthy = state.healthy if proc is not None and proc.pid == state.pid else None
        return sum(self._written.values()), self._healthy

    def start(self) -> None:
        self._spawn()
        self._watchdog = threading.Thread(target=self._watch, name="ledger-writer-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        backoff = 1.0
        while not self._stopping.wait(backoff):
            try:
                proc = self.proc
                if proc is not None and proc.poll() == EXIT_CHAIN_HELD:
                    # Another process holds this spool's chain: a restart would only be refused again.
                    self.chain_refused = True
                    if self.ownership is not None:
                        self.ownership.mark_lost(
                            f"the ledger writer process {proc.pid} was refused the chain"
                        )
                    log.error(
                        "ledger writer process %d was refused the ledger chain of %s (its log names the holder); "
                        "not restarted: what this gateway spools stays in its spool",
                        proc.pid,
                        self.spool_dir,
                    )
                    return
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    log.error(
                        "ledger writer process %d exited with %s; restarting it", proc.pid, proc.returncode
                    )
                    # Before the spawn: a spawn that fails must not be retried at once either.
                    backoff = min(30.0, backoff * 2)
                    self._spawn()
                    self.restarts += 1
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

    def __init__(
        self,
        interval_s: float,
        drainer: DrainerProcess | None = None,
        ownership: ChainOwnership | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.drainer = drainer
        # The chain's lease: held, or lost to another process (known without a database read).
        self.ownership = ownership
        self.quarantined: int | None = None  # None until the first count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def chain_lease_ok(self) -> bool:
        """Whether this gateway holds its ledger chain (claimed, not taken over, its drainer not refused): what
        it answers is written to the ledger. False when another process took the chain (read by readiness)."""
        if self.ownership is not None and not self.ownership.held:
            return False
        return not (self.drainer is not None and self.drainer.chain_refused)

    def refresh(self) -> None:
        self.quarantined = quarantined_count()
        if self.drainer is not None:
            self.drainer.mirror_thread_errors()

    def prometheus_lines(self) -> list[str]:
        lines = self.ownership.prometheus_lines() if self.ownership is not None else []
        quarantined = self.quarantined
        if quarantined is None:
            return lines
        name = "carbonledger_ledger_quarantined_records"
        return [
            *lines,
            f"# HELP {name} spool lines the database refused for their data, neither retried nor dismissed "
            "(manage.py ledger_quarantine); the records around them were written",
            f"# TYPE {name} gauge",
            f"{name} {quarantined}",
        ]

    def _run(self) -> None:
        try:
            while True:
                try:
                    self.refresh()
                except Exception as exc:  # the database may be down: /metrics keeps the last count
                    THREAD_ERRORS.record(
                        exc, "the ledger's quarantine not counted; /metrics keeps the last count"
                    )
                finally:
                    connection.close()  # none held between rounds (a pooled one goes back to the pool)
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


class _TimedDirectInfer:
    """A direct infer request whose work on the event loop counts as the gateway's serving CPU time."""

    __slots__ = ("_ticket", "received_ns")

    def __init__(self, ticket: DirectInfer) -> None:
        self._ticket = ticket
        self.received_ns = ticket.received_ns

    def serve(self, body: bytes, respond: Respond) -> None:
        t0 = time.thread_time()
        try:
            self._ticket.serve(body, respond)
        finally:
            SERVING_CPU.charge_gateway(time.thread_time() - t0)


class LedgerGateway(Gateway):
    """The inference gateway, with what the Django side knows of the ledger appended to /metrics, and its KServe
    v2 gRPC front end on ``GRPC_HOST:GRPC_PORT`` (none when the port is 0)."""

    def __init__(self, *args: Any, ledger_status: LedgerStatusService | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger_status = ledger_status
        self.grpc: GrpcFrontEnd | None = None
        if settings.GRPC_PORT:
            self.grpc = GrpcFrontEnd(
                self.core,
                max_message_bytes=settings.GATEWAY_MAX_BODY_BYTES,
                max_metadata_bytes=settings.GATEWAY_MAX_HEADER_BYTES,
                # The HTTP port's limits, counted apart: a client gets as many connections on each.
                max_connections=settings.GATEWAY_MAX_CONNECTIONS,
                header_timeout_s=settings.GATEWAY_HEADER_TIMEOUT_S,
                body_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S,
            )

    async def startup(self) -> None:
        # Before anything starts: the modelled CPU meter's baseline is then already the serving work's.
        SERVING_CPU.attach()
        await super().startup()
        if self.grpc is not None:
            try:
                # After the models have loaded, as Triton opens its ports; on the event loop the lifespan runs on.
                await self.grpc.start(settings.GRPC_HOST, settings.GRPC_PORT)
            except OSError as exc:
                await super().shutdown()
                raise ImproperlyConfigured(f"CARBONLEDGER_GRPC_PORT: {exc}") from exc

    async def shutdown(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop()  # the calls in progress finish while the models still run
        await super().shutdown()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # While web requests come (the all role), the gateway's own work on the event loop is timed, so that the
        # loop's untimed work alone is shared between the two by request counts (inference/meters/serving_cpu.py).
        cpu = SERVING_CPU
        if scope["type"] == "http":
            cpu.gateway_requests += 1
            if cpu.web_active:
                await cpu.timed(super().__call__(scope, receive, send))
                return
        await super().__call__(scope, receive, send)

    def direct_infer(
        self, method: str, path: str, headers: dict[bytes, bytes], received_ns: int
    ) -> DirectInfer | None:
        ticket = super().direct_infer(method, path, headers, received_ns)
        if ticket is None:
            return None
        cpu = SERVING_CPU
        cpu.gateway_requests += 1
        return cast(DirectInfer, _TimedDirectInfer(ticket)) if cpu.web_active else ticket

    def metrics(self) -> bytes:
        body = super().metrics()
        lines = self.ledger_status.prometheus_lines() if self.ledger_status is not None else []
        return body + "".join(f"{line}\n" for line in lines).encode() if lines else body


class WriterService:
    """The ledger writer as a gateway service: recover the chain, then drain the spool."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.restarts = 0  # a thread is not restarted: it survives its failed iterations

    def start(self) -> None:
        self.writer.recover()
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()

    def alive(self) -> bool:
        return bool(self.writer.alive)

    def written_and_healthy(self) -> tuple[int, bool | None]:
        return self.writer.records_written, self.writer.healthy


class ChainLeaseService:
    """Claims the spool's ledger chain in the database before anything is served, keeps the lease renewed,
    and releases it last (after the writer stopped). A chain another live process holds (a copy of its spool)
    stops the start-up with ``ChainHeld``: one line naming the chain and its holder."""

    def __init__(self, ownership: ChainOwnership, database_wait_s: float = 60.0) -> None:
        self.ownership = ownership
        self.database_wait_s = database_wait_s

    def start(self) -> None:
        # Records answered from an unclaimed spool could belong to a chain another process writes: nothing is
        # served before the claim, so a database down at start-up is waited for, a while.
        try:
            call_until_database_answers(
                self.ownership.claim,
                what="claim the ledger chain",
                deadline=time.monotonic() + self.database_wait_s,
            )
        finally:
            close_old_connections()
        self.ownership.start_keeper()

    def stop(self) -> None:
        self.ownership.release()


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
    its own (the ORM never runs on the event loop). The same intensity, with the site's PUE, prices the
    location-based CO2e counters of /metrics (``energy``), carbon-aware mode on or off."""

    def __init__(
        self,
        interval_s: float,
        thread_errors: ThreadErrors = THREAD_ERRORS,
        energy: EnergyMetrics | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.grid: Any = None  # the repository's GridState when carbon-aware, set once the gateway is built
        self.energy = energy
        self._thread_errors = thread_errors
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        site = default_site()
        signal_now = grid_signal(site, timezone.now())
        intensity = None if signal_now.intensity_g_per_kwh is None else float(signal_now.intensity_g_per_kwh)
        if self.energy is not None:
            self.energy.set_intensity(
                intensity_g_per_kwh=intensity, pue=float(site.pue), zone=signal_now.zone
            )
        if self.grid is None:
            return
        self.grid.update(
            intensity,
            None if signal_now.threshold_g_per_kwh is None else float(signal_now.threshold_g_per_kwh),
            f"{signal_now.zone}: {signal_now.intensity_source}; threshold {signal_now.threshold_source}",
        )
        log.info("carbon-aware mode %s (%s)", signal_now.mode, self.grid.source)

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception as exc:  # the database may be down: serving goes on with the last state
                # Logged once (not every round while it lasts) and counted in /metrics.
                self._thread_errors.record(exc, "carbon-aware signal not refreshed; keeping the last one")
            finally:
                connection.close()  # none held between rounds (a pooled one goes back to the pool)
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
    device_leases: DeviceLeases | None = None
    energy = EnergyMetrics() if settings.LEDGER_ENABLED else None  # closed intervals come from the recorder
    replica_options: dict[str, Any] = {
        "interval_s": settings.LEDGER_STATUS_INTERVAL_S,
        "max_drain_lag_s": settings.READY_MAX_DRAIN_LAG_S,
        "max_spool_fraction": settings.READY_SPOOL_MAX_FRACTION,
        "worker_heartbeat_s": settings.WORKER_HEARTBEAT_INTERVAL_S,
    }
    replica = ReplicaStatus(spool=None, drainer=None, **replica_options)
    if settings.LEDGER_ENABLED:
        spool = Spool(settings.SPOOL_DIR, max_backlog_bytes=settings.SPOOL_MAX_BYTES)
        spool.sync_acknowledged()  # what a drainer process already had in the database
        chain_ownership = ChainOwnership(spool.chain_id)
        writer_service: Any
        if settings.LEDGER_WRITER == "process":
            writer_service = DrainerProcess(settings.SPOOL_DIR, chain_ownership)
        else:
            writer_service = WriterService(
                LedgerWriter(spool, interval_s=settings.LEDGER_WRITE_INTERVAL_S, ownership=chain_ownership)
            )
        recorder = leased_recorder(spool, energy_metrics=energy)
        device_leases = recorder.leases
        hooks.append(recorder.hook_for)
        hooks.append(SERVING_CPU.hook_for)  # the threads that execute batches are serving CPU time
        ledger_status = LedgerStatusService(
            settings.LEDGER_STATUS_INTERVAL_S,
            writer_service if isinstance(writer_service, DrainerProcess) else None,
            chain_ownership,
        )
        status = ledger_status
        replica = ReplicaStatus(
            spool=spool,
            drainer=writer_service,
            # The hook /readyz reads the chain's lease through (ledger/ownership.py).
            chain_lease=lambda: (
                status.chain_lease_ok,
                chain_ownership.lost_reason
                or f"ledger chain {chain_ownership.chain_id} is not leased by this replica",
            ),
            **replica_options,
        )
        # Stopped in reverse: the recorder spools its last interval, the writer drains, the chain's lease is
        # released, then the spool closes. The chain is claimed before anything else starts.
        services = [
            SpoolService(spool),
            ChainLeaseService(chain_ownership),
            writer_service,
            recorder,
            ledger_status,
        ]
        admission = recorder
    services.append(replica)
    signal_service = (
        GridSignalService(settings.CARBON_SIGNAL_INTERVAL_S, energy=energy)
        if settings.CARBON_AWARE or energy is not None
        else None
    )
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
    if signal_service is not None and settings.CARBON_AWARE:
        signal_service.grid = gateway.repository.grid
    chain = replica.chain
    gateway.readiness = Readiness(
        blocking=lambda: database_checks(chain),
        inline=replica.checks,
        timeout_s=settings.READY_DB_TIMEOUT_S,
        cache_s=settings.READY_CACHE_S,
        blocking_names=("database", "ledger_quarantine") if chain is not None else ("database",),
    )
    if energy is not None:
        gateway.metric_sources.append(energy.prometheus_lines)
    if device_leases is not None:
        gateway.metric_sources.append(device_leases.prometheus_lines)
    gateway.metric_sources.append(replica.prometheus_lines)
    return gateway

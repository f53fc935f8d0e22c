"""A fleet on one machine, with real parts: HAProxy (Debian's package) in front of three gateway processes on one
PostgreSQL database and RabbitMQ, with one web process, one worker and one beat, as deploy/ runs them.

About a minute of infer traffic goes through the balancer, which sends traffic only to gateways whose `/readyz`
answers 200; one gateway is SIGKILLed mid-run and restarted on its own spool. Then: every answered ledger id is
in the ledger exactly once, every chain verifies, the rollups (made by the beat and the worker during the run)
equal the raw ledger, the database connections stayed within the documented bound, and the balancer sent no
request to the killed gateway from the moment it marked it down until its restarted process was ready again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from carbon.models import HourlyRollup
from tests.support.gateway_process import (
    DEMO_LINEAR,
    PYTHON,
    REPO_ROOT,
    LedgerDatabase,
    LoadClients,
    gateway_env,
    manage,
    postgres_url_from_env,
    wait_until,
)
from tests.support.servers import free_port

pytestmark = pytest.mark.django_db(False)

POSTGRES = postgres_url_from_env()
HAPROXY = shutil.which("haproxy") or (
    Path("/usr/sbin/haproxy") if Path("/usr/sbin/haproxy").exists() else None
)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
GATEWAYS = 3
LOAD_S = 60.0
KILL_AT_S = 20.0
LEASE_TTL_S = 6.0
ROLLUP_INTERVAL_S = 5.0
# The connection pool's bound per process (docs/operations.md): a gateway replica (serve and its ledger writer)
# holds at most 2 N + 1, the web and worker processes N each, the beat 1.
POOL_N = 3


def _rabbitmq_up() -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 5672), timeout=2):
        return True
    return False


needs_fleet = pytest.mark.skipif(
    POSTGRES is None or HAPROXY is None or not _rabbitmq_up(),
    reason="the fleet test needs PostgreSQL (DATABASE_URL=postgres://...), RabbitMQ on 127.0.0.1:5672 and haproxy "
    "(apt-get install haproxy)",
)


class Process:
    """A command of the product in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def log_tail(self, chars: int = 2500) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def _http_status(port: int, path: str) -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            head = sock.recv(64)
        return int(head.split()[1])
    except (OSError, IndexError, ValueError):
        return None


HAPROXY_CFG = """
global
    maxconn 4000
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 2
    option redispatch
    retry-on conn-failure

frontend kserve
    bind 127.0.0.1:{port}
    default_backend gateways

backend gateways
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 300ms fall 2 rise 2
{servers}
"""


@dataclass
class StatSample:
    at: float
    status: dict[str, str]
    sessions: dict[str, int]


@dataclass
class Watcher:
    """Samples HAProxy's server states and session counters, and the database's connection count."""

    haproxy_socket: Path
    db: LedgerDatabase
    database: str
    samples: list[StatSample] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _show_stat(self) -> StatSample:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(self.haproxy_socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        status: dict[str, str] = {}
        sessions: dict[str, int] = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == "gateways" and row.get("svname", "").startswith("gateway-"):
                status[row["svname"]] = row["status"]
                sessions[row["svname"]] = int(row["stot"] or 0)
        return StatSample(time.monotonic(), status, sessions)

    def run(self) -> None:
        last_db = 0.0
        while not self.stop.is_set():
            with contextlib.suppress(OSError, IndexError):
                self.samples.append(self._show_stat())
            if time.monotonic() - last_db >= 0.5:
                last_db = time.monotonic()
                rows = self.db.query(
                    f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{self.database}'"
                )
                self.connections.append(int(rows[0][0]))
            self.stop.wait(0.1)


@needs_fleet
def test_a_fleet_behind_haproxy_loses_and_doubles_nothing_when_a_gateway_is_killed(
    tmp_path: Path, fleet_database: str
) -> None:
    database = fleet_database.rsplit("/", 1)[1]
    db = LedgerDatabase(postgres_url=fleet_database)
    shared = {
        "SECRET_KEY": secrets.token_urlsafe(48),
        "CELERY_BROKER_URL": AMQP_URL,
        "CELERY_QUEUE": f"fleet-{uuid.uuid4().hex[:12]}",
        "LEDGER_CHAIN_LEASE_TTL_S": str(LEASE_TTL_S),
        "ROLLUP_INTERVAL_S": str(ROLLUP_INTERVAL_S),
        "LEDGER_WRITE_INTERVAL_S": "0.2",
        "CARBONLEDGER_GRPC_PORT": "0",
        "CARBONLEDGER_DB_POOL_MAX_SIZE": str(
            POOL_N
        ),  # HTTP is what goes through the balancer here; three gateways, one host
    }

    def env_for(name: str) -> dict[str, str]:
        var = tmp_path / name
        (var / "models").mkdir(parents=True)
        shutil.copytree(DEMO_LINEAR, var / "models" / "linear")
        return gateway_env(var, fleet_database, **shared)

    logs = tmp_path / "logs"
    logs.mkdir()
    gateway_envs = [env_for(f"gateway-{i}") for i in range(1, GATEWAYS + 1)]
    # `setup` from every gateway at once, as replicas of a roll-out would run it.
    setups = [
        subprocess.Popen([PYTHON, "manage.py", "setup"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
        for env in gateway_envs
    ]  # fmt: skip
    for proc in setups:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    org = manage(gateway_envs[0], "create_organization", "fleet")
    assert org.returncode == 0, org.stderr
    made = manage(gateway_envs[0], "create_api_key", "fleet", "--scopes", "infer,read")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]

    ports = [free_port() for _ in gateway_envs]

    def gateway(i: int) -> Process:
        argv = [PYTHON, "manage.py", "serve", "--role", "gateway", "--port", str(ports[i])]
        return Process(f"gateway-{i + 1}", argv, gateway_envs[i], logs)

    gateways = [gateway(i).start() for i in range(GATEWAYS)]
    others_env = env_for("web")
    web_port = free_port()
    others = [
        Process("web", [PYTHON, "manage.py", "serve", "--role", "web", "--port", str(web_port)], others_env, logs),
        Process("worker", [PYTHON, "-m", "celery", "-A", "carbonledger", "worker", "--pool=threads",
                           "--concurrency=2", "--loglevel=INFO"], env_for("worker"), logs),
        Process("beat", [PYTHON, "manage.py", "beat"], env_for("beat"), logs),
    ]  # fmt: skip
    for proc in others:
        proc.start()
    lb_port = free_port()
    haproxy_socket = tmp_path / "haproxy.sock"
    cfg = tmp_path / "haproxy.cfg"
    servers = "\n".join(f"    server gateway-{i + 1} 127.0.0.1:{port} check" for i, port in enumerate(ports))
    cfg.write_text(HAPROXY_CFG.format(socket=haproxy_socket, port=lb_port, servers=servers))
    balancer = Process("haproxy", [str(HAPROXY), "-db", "-f", str(cfg)], dict(os.environ), logs).start()
    watcher = Watcher(haproxy_socket, db, database)
    watch = threading.Thread(target=watcher.run, daemon=True)
    restarted: Process | None = None
    try:
        assert wait_until(lambda: all(_http_status(p, "/readyz") == 200 for p in ports), 90), "\n".join(
            g.log_tail() for g in gateways
        )
        assert wait_until(lambda: _http_status(web_port, "/accounts/login/") == 200, 60), others[0].log_tail()
        assert wait_until(lambda: haproxy_socket.exists(), 20), balancer.log_tail()
        watch.start()
        assert wait_until(
            lambda: bool(watcher.samples) and all(s == "UP" for s in watcher.samples[-1].status.values()), 20
        ), watcher.samples[-1:]

        load = LoadClients(
            ("127.0.0.1", lb_port), key, threads=8, max_seconds=LOAD_S, max_requests=10**7
        ).start()
        time.sleep(KILL_AT_S)
        victim = gateways[1]
        victim.kill()
        killed_at = time.monotonic()
        time.sleep(1.0)
        restarted = gateway(1).start()  # the same spool: its chain's lease expires, then it takes it back
        gateways[1] = restarted
        end = time.monotonic() + LOAD_S - KILL_AT_S
        while time.monotonic() < end and load._threads[0].is_alive():
            time.sleep(0.5)
        outcomes = load.stop(timeout_s=40)
        assert restarted.proc is not None and restarted.proc.poll() is None, restarted.log_tail()
        assert wait_until(lambda: _http_status(ports[1], "/readyz") == 200, 60), restarted.log_tail()

        # Answers: all 200 but the requests that were inside the killed gateway when it died.
        answered = outcomes.ok_ids
        assert len(answered) > 1000, outcomes.statuses
        failed = sum(n for status, n in outcomes.statuses.items() if status != 200) + outcomes.no_answer
        assert failed <= 8 * 3, (outcomes.statuses, outcomes.no_answer, outcomes.unexpected[:5])
        assert {status for status, _ in outcomes.unexpected} <= {502, 503}, outcomes.unexpected[:5]

        # Every answered ledger id in the ledger exactly once (after the drainers caught up).
        def drained() -> bool:
            counts = db.request_id_counts()
            return all(counts.get(rid, 0) >= 1 for rid in answered)

        assert wait_until(drained, 90), "answered requests missing from the ledger"
        counts = db.request_id_counts()
        assert not [rid for rid in answered if counts[rid] != 1]
        chains = db.query("SELECT COUNT(*) FROM carbonledger_ledgerchain")[0][0]
        assert chains == GATEWAYS, f"{chains} chains for {GATEWAYS} gateways (a restart must keep its chain)"
        verified = manage(gateway_envs[0], "verify_ledger", timeout_s=300)
        assert verified.returncode == 0, verified.stdout + verified.stderr

        # The balancer: gateway-2 went down after the kill, and from the first sample that showed it down until
        # the one that showed it up again, it was sent no session.
        after_kill = [s for s in watcher.samples if s.at >= killed_at]
        down = [i for i, s in enumerate(after_kill) if s.status.get("gateway-2", "").startswith("DOWN")]
        assert down, "HAProxy never marked the killed gateway down"
        up_again = [
            i for i in range(down[0], len(after_kill)) if after_kill[i].status.get("gateway-2") == "UP"
        ]
        assert up_again, "HAProxy never marked the restarted gateway up"
        window = after_kill[down[0] : up_again[0]]
        sent = window[-1].sessions["gateway-2"] - window[0].sessions["gateway-2"]
        assert sent == 0, f"{sent} sessions went to gateway-2 while it was down"

        # Rollups by the beat and the worker equal the raw ledger, once the gateways have stopped adding to it.
        for proc in gateways:
            proc.stop()
        table = HourlyRollup._meta.db_table

        def rolled_up() -> bool:
            raw = db.query(
                "SELECT (SELECT COUNT(*) FROM ledger_request), (SELECT COALESCE(SUM(energy_uj), 0) FROM ledger_idle)"
            )[0]
            rolled = db.query(
                f"SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(energy_uj) FILTER (WHERE kind = 'idle'), 0) "
                f"FROM {table}"
            )[0]
            return (int(rolled[0]), int(rolled[1])) == (int(raw[0]), int(raw[1]))

        assert wait_until(rolled_up, 120, interval_s=1.0), others[1].log_tail() + others[2].log_tail()

        # Connections: within the documented bound of the fleet's processes, every sample of the run.
        bound = GATEWAYS * (2 * POOL_N + 1) + POOL_N + POOL_N + 1 + 1  # and the sampling query's own
        assert watcher.connections and max(watcher.connections) <= bound, (max(watcher.connections), bound)
    finally:
        watcher.stop.set()
        for proc in [*gateways, *others]:
            proc.stop()
        balancer.stop()

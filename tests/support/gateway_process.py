"""Real gateway processes for durability tests: set-up commands, start/kill/stop, a KServe
client that records every answer, throwaway PostgreSQL databases and a TCP proxy that can
simulate a database outage.

Everything here has a timeout, and every process is started in its own session so that the
whole process group can be killed.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import selectors
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from tests.support.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_LINEAR = REPO_ROOT / "inference" / "demo_repository" / "linear"
PYTHON = str(REPO_ROOT / ".venv" / "bin" / "python") if (REPO_ROOT / ".venv").exists() else sys.executable

# Settings a developer's shell may carry that would point the subprocesses elsewhere.
_INHERITED_SETTINGS = (
    "CARBONLEDGER_VAR_DIR",
    "DATABASE_URL",
    "SPOOL_DIR",
    "SPOOL_MAX_BYTES",
    "LEDGER_ENABLED",
    "LEDGER_WRITE_INTERVAL_S",
    "MODEL_REPOSITORY",
    "TRITON_URL",
    "METERS",
    "METER_INTERVAL_S",
    "API_KEY_CACHE_SECONDS",
    "PORT",
    "DJANGO_SETTINGS_MODULE",
)


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_url_from_env() -> str | None:
    """$DATABASE_URL when it is a PostgreSQL URL (the tests then also run there), else None."""
    url = os.environ.get("DATABASE_URL", "")
    return url if url.split(":", 1)[0] in {"postgres", "postgresql", "pgsql"} else None


def with_database(url: str, name: str, port: int | None = None) -> str:
    """``url`` pointing at database ``name`` (and, when given, at 127.0.0.1:``port``)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if port is not None:
        userinfo = netloc.rsplit("@", 1)[0] + "@" if "@" in netloc else ""
        netloc = f"{userinfo}127.0.0.1:{port}"
    return urlunsplit(("postgres", netloc, f"/{name}", parts.query, ""))


def _psycopg_url(url: str) -> str:
    return "postgresql" + url[url.index(":") :]


def _admin_connect(url: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(_psycopg_url(url), autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        # The named database may not exist yet (pytest-django creates test_<name>): use the
        # maintenance database of the same server.
        return psycopg.connect(
            _psycopg_url(with_database(url, "postgres")), autocommit=True, connect_timeout=10
        )


@contextlib.contextmanager
def fresh_postgres_database(admin_url: str) -> Iterator[str]:
    """A new, empty database with a random name on the server of ``admin_url``; dropped afterwards."""
    name = f"cl_durability_{uuid.uuid4().hex[:12]}"
    with _admin_connect(admin_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with _admin_connect(admin_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- reading the ledger directly ----------------------------------------------------------------


class LedgerDatabase:
    """Read-only queries on a gateway's database, without Django: sqlite3 or psycopg."""

    def __init__(self, *, sqlite_path: Path | None = None, postgres_url: str | None = None) -> None:
        if (sqlite_path is None) == (postgres_url is None):
            raise ValueError("give exactly one of sqlite_path and postgres_url")
        self.sqlite_path = sqlite_path
        self.postgres_url = postgres_url

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.sqlite_path is not None:
            conn = sqlite3.connect(self.sqlite_path, timeout=20)
            try:
                return list(conn.execute(sql).fetchall())
            finally:
                conn.close()
        import psycopg

        assert self.postgres_url is not None
        with psycopg.connect(_psycopg_url(self.postgres_url), autocommit=True, connect_timeout=10) as conn:
            return list(conn.execute(sql).fetchall())

    def request_id_counts(self) -> Counter[str]:
        """How many times each request id is in ``ledger_request``."""
        return Counter(
            {
                rid: n
                for rid, n in self.query(
                    "SELECT request_id, COUNT(*) FROM ledger_request GROUP BY request_id"
                )
            }
        )

    def energy_parts(self) -> list[tuple[str, str, int, bool]]:
        """Every request's energy parts as (request id, interval id, µJ, final): the split of each batch row,
        and the per-request rows of older records."""
        parts = [
            (rid, iid, int(uj), bool(final))
            for rid, iid, uj, final in self.query(
                "SELECT request_id, interval_id, energy_uj, final FROM ledger_request_energy"
            )
        ]
        for iid, uj, request_ids, shares_uj, final in self.query(
            "SELECT interval_id, energy_uj, request_ids, shares_uj, final FROM ledger_batch_energy"
        ):
            shares = orjson.loads(shares_uj)
            assert sum(shares) == int(uj), f"a batch's shares in {iid} do not add up to its energy"
            parts.extend(
                (rid, iid, share, bool(final))
                for rid, share in zip(orjson.loads(request_ids), shares, strict=True)
            )
        return parts

    def conservation_violations(self) -> tuple[int, list[tuple[Any, ...]]]:
        """(intervals checked, intervals where parts + idle != interval energy)."""
        totals: Counter[str] = Counter()
        for _rid, iid, uj, _final in self.energy_parts():
            totals[iid] += uj
        rows = self.query(
            "SELECT i.interval_id, i.energy_uj, idl.energy_uj FROM ledger_interval i "
            "LEFT JOIN ledger_idle idl ON idl.interval_id = i.interval_id"
        )
        bad = [(*r, totals[r[0]]) for r in rows if r[2] is None or totals[r[0]] + int(r[2]) != int(r[1])]
        return len(rows), bad

    def orphan_energy_parts(self) -> int:
        """Request energy parts whose interval is not in the ledger (energy outside every interval)."""
        intervals = {r[0] for r in self.query("SELECT interval_id FROM ledger_interval")}
        return sum(1 for _rid, iid, _uj, _final in self.energy_parts() if iid not in intervals)

    def requests_without_final_energy(self) -> list[str]:
        """Request ids in the ledger none of whose energy parts is final."""
        final = {rid for rid, _iid, _uj, is_final in self.energy_parts() if is_final}
        return [rid for (rid,) in self.query("SELECT request_id FROM ledger_request") if rid not in final]


# -- the gateway process ------------------------------------------------------------------------


def gateway_env(var_dir: Path, database_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_SETTINGS}
    env.update(
        CARBONLEDGER_VAR_DIR=str(var_dir),
        MODEL_REPOSITORY=str(var_dir / "models"),
        DJANGO_SETTINGS_MODULE="carbonledger.settings",
        METERS="cpu-model",  # the same meter on every host: these tests are about durability
        OPENBLAS_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``manage.py`` with ``args``; never raises for a non-zero exit (callers assert on it)."""
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def prepare_gateway(env: dict[str, str]) -> str:
    """Model repository, migrations, an organization and an API key; returns the key."""
    models = Path(env["MODEL_REPOSITORY"])
    models.mkdir(parents=True, exist_ok=True)
    if not (models / "linear").exists():
        shutil.copytree(DEMO_LINEAR, models / "linear")
    for args in (("migrate", "--noinput"), ("create_organization", "acme")):
        done = manage(env, *args)
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    done = manage(env, "create_api_key", "acme", "--scopes", "infer,read")
    assert done.returncode == 0, f"create_api_key failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


class CeleryWorker:
    """A real Celery worker (solo pool) of the project in its own process group, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, *, beat: bool = False) -> None:
        self.env = env
        self.log_path = log_path
        self.beat = beat  # with the embedded beat scheduler (-B), as `make run` starts it
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CeleryWorker:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "carbonledger",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
        ]
        if self.beat:
            argv.append("-B")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """SIGTERM to the process group (a warm shutdown), SIGKILL after 20 s."""
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class GatewayProcess:
    """``manage.py serve`` in its own process group, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None) -> None:
        self.env = env
        self.log_path = log_path
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self, timeout_s: float = 30.0) -> GatewayProcess:
        for attempt in range(3):
            try:
                return self._start(timeout_s)
            except RuntimeError as exc:
                # Another process may take the port between free_port() and uvicorn's bind.
                if attempt == 2 or "address already in use" not in str(exc).lower():
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout_s: float) -> GatewayProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the gateway exited during start-up ({self.proc.returncode}):\n{self.log_tail()}"
                )
            if self._ready():
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the gateway was not ready within {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        conn = http.client.HTTPConnection(*self.address, timeout=2)
        try:
            conn.request("GET", "/v2/health/ready")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def kill(self) -> None:
        """SIGKILL the whole process group (idempotent)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM, a graceful shutdown that drains the spool; SIGKILL after ``timeout_s``.

        True when the shutdown completed: uvicorn re-raises the signal once the lifespan
        shutdown is done, so the exit status is -SIGTERM (or 0), and it logs the completion.
        """
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the gateway did not stop within {timeout_s} s of SIGTERM:\n{self.log_tail()}"
            ) from None
        return rc in (0, -signal.SIGTERM) and "Application shutdown complete" in self.log_tail(200)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> GatewayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# -- a client that keeps the score --------------------------------------------------------------


def infer_body(seed: int = 0) -> bytes:
    data = [((seed * 7919 + i) % 1000) / 1000.0 for i in range(256)]
    return orjson.dumps({"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": data}]})


@dataclass
class Outcomes:
    """Every answer the clients received, and every request that got no answer."""

    ok_ids: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    no_answer: int = 0
    unexpected: list[tuple[int, str]] = field(default_factory=list)  # (status, body) other than 200/503-spool
    spool_full_503: int = 0
    in_flight: int = 0  # requests sent by LoadClients and not answered (or failed) yet
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self) -> None:
        with self.lock:
            self.in_flight += 1

    def record(self, status: int, body: bytes, *, began: bool = False) -> None:
        with self.lock:
            self.in_flight -= began
            self.statuses[status] += 1
            if status == 200:
                self.ok_ids.append(orjson.loads(body)["parameters"]["ledger_id"])
                return
            text = body.decode("utf-8", "replace")
            if status == 503 and "spool" in text and "full" in text:
                self.spool_full_503 += 1
            else:
                self.unexpected.append((status, text[:300]))

    def lost(self, *, began: bool = False) -> None:
        with self.lock:
            self.in_flight -= began
            self.no_answer += 1

    def snapshot(self) -> tuple[int, int, int]:
        """(answered 200, answered 503 spool full, other answers)."""
        with self.lock:
            return len(self.ok_ids), self.spool_full_503, len(self.unexpected)


class LoadClients:
    """``threads`` clients sending infer requests back to back until stopped, a deadline or a cap."""

    def __init__(
        self,
        address: tuple[str, int],
        key: str,
        *,
        threads: int = 8,
        max_seconds: float = 30.0,
        max_requests: int = 20_000,
        outcomes: Outcomes | None = None,
    ) -> None:
        self.address = address
        self.key = key
        self.outcomes = outcomes or Outcomes()
        self.stop_event = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._budget = threading.Semaphore(max_requests)
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"load-client-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> LoadClients:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 20.0) -> Outcomes:
        self.stop_event.set()
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"client threads did not stop: {alive}"
        return self.outcomes

    def _loop(self, index: int) -> None:
        body = infer_body(index)
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        conn: http.client.HTTPConnection | None = None
        while not self.stop_event.is_set() and time.monotonic() < self._deadline:
            if not self._budget.acquire(blocking=False):
                break
            self.outcomes.begin()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(*self.address, timeout=15)
                conn.request("POST", "/v2/models/linear/infer", body=body, headers=headers)
                resp = conn.getresponse()
                self.outcomes.record(resp.status, resp.read(), began=True)
            except (OSError, http.client.HTTPException):
                self.outcomes.lost(began=True)
                if conn is not None:
                    conn.close()
                conn = None
                self.stop_event.wait(0.05)
        if conn is not None:
            conn.close()


def infer_once(address: tuple[str, int], key: str, timeout_s: float = 15.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        conn.request(
            "POST",
            "/v2/models/linear/infer",
            body=infer_body(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def spool_backlog_bytes(spool_dir: Path, db: LedgerDatabase) -> int:
    """Bytes in the spool after the checkpoint that the database holds for it: what waits.

    The same quantity that ``SPOOL_MAX_BYTES`` bounds, measured from outside the gateway.
    """
    chain_id = (spool_dir / "chain_id").read_text().strip()
    rows = db.query(f"SELECT spool_position FROM carbonledger_ledgerchain WHERE chain_id = '{chain_id}'")
    segment, offset = (int(x) for x in rows[0][0].split(":")) if rows else (0, 0)
    total = 0
    for path in spool_dir.glob("*.spool"):
        number = int(path.name.split(".", 1)[0])
        try:
            size = path.stat().st_size
        except FileNotFoundError:  # drained and deleted meanwhile
            continue
        if number > segment:
            total += size
        elif number == segment:
            total += max(0, size - offset)
    return total


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


# -- a TCP proxy that can take the database away ------------------------------------------------

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST instead of FIN


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to an upstream address, on one selector thread.

    ``cut()`` is an outage: the listener is closed (new connections are refused) and every
    forwarded connection is reset on both sides. ``restore()`` listens again on the same port.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._commands: list[tuple[str, threading.Event]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.connections_accepted = 0
        self.connections_reset = 0
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        s.setblocking(False)
        return s

    def cut(self) -> None:
        self._command("cut")

    def restore(self) -> None:
        self._command("restore")

    def close(self) -> None:
        if self._thread.is_alive():
            self._command("close")
        self._thread.join(10)

    def _command(self, name: str) -> None:
        done = threading.Event()
        with self._lock:
            self._commands.append((name, done))
        assert done.wait(10), f"the proxy did not {name} within 10 s"

    def _run(self) -> None:
        try:
            while not self._closed:
                with self._lock:
                    commands, self._commands = self._commands, []
                for name, done in commands:
                    self._apply(name)
                    done.set()
                if self._closed:
                    break
                for key, _ in self._selector.select(0.02):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data is None:
                        self._accept(sock)
                    else:
                        self._pump(sock)
        finally:
            self._reset_all()
            if self._listener is not None:
                self._listener.close()
            self._selector.close()

    def _apply(self, name: str) -> None:
        if name == "cut":
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None
            self._reset_all()
        elif name == "restore":
            if self._listener is None:
                self._listener = self._listen(self.port)
                self._selector.register(self._listener, selectors.EVENT_READ, None)
        elif name == "close":
            self._closed = True

    def _accept(self, listener: socket.socket) -> None:
        try:
            client, _ = listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            client.close()
            return
        self.connections_accepted += 1
        for s in (client, upstream):
            s.settimeout(10)  # sendall to a stuck peer must not hang the proxy for ever
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pairs[client] = upstream
        self._pairs[upstream] = client
        self._selector.register(client, selectors.EVENT_READ, "pipe")
        self._selector.register(upstream, selectors.EVENT_READ, "pipe")

    def _pump(self, sock: socket.socket) -> None:
        peer = self._pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(1 << 16)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        self._drop(sock, reset=False)

    def _drop(self, sock: socket.socket, *, reset: bool) -> None:
        peer = self._pairs.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._pairs.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(s)
            if reset:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            s.close()

    def _reset_all(self) -> None:
        while self._pairs:
            sock = next(iter(self._pairs))
            self.connections_reset += 1
            self._drop(sock, reset=True)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

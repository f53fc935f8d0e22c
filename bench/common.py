"""Plumbing shared by the benchmarks in this folder.

* processes: :class:`Server` (a server in its own process group, stopped with SIGTERM then SIGKILL, also at
  exit and on SIGTERM/SIGHUP once :func:`install_cleanup` ran), CPU counters from ``/proc``;
* HTTP: :func:`http`, :func:`wait_ready`, :func:`free_port_block`;
* a gateway of our own: :func:`gateway_env`, :func:`manage`, :func:`create_bench_key`, :func:`serve_argv`;
* Django in the benchmark's own process: :func:`use_database`, :func:`setup_django`, :func:`drop_database`;
* results: :func:`utc_stamp`, :func:`git`, :func:`machine_info`, :func:`write_json`, :func:`fmt` (a table's number);
* the host: :func:`wakeup_probe` (what waking a blocked thread costs here, one cost of a closed loop's turn-around).

Standard library only (psycopg and Django are imported when used), so every script can import it first.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
DJANGO_SETTINGS = "carbonledger.settings"
POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The Triton reference (setup.sh, start_triton.sh, models/): not part of the product, so it is named by a
# setting; the tests read the same variable (tests/support/triton.py).
TRITON_REFERENCE = Path(
    os.environ.get("CARBONLEDGER_TRITON_REFERENCE", REPO.parent / "shared" / "triton-reference")
)

# Environment variables that would make a benchmark's servers run different work or touch shared state.
SCRUBBED_ENV = ("PROBE_SLEEP_MS", "DATABASE_URL", "CELERY_BROKER_URL", "TRITON_URL", "PORT", "LD_PRELOAD")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SetupError(RuntimeError):
    """Something the benchmark needs could not be prepared; the message says what and where to look."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


# -- CPU from /proc ---------------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on), or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def pids_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and int(fields[2]) == pgid:
                pids.append(int(entry))
    return pids


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes in a process group (plus their reaped children)."""
    total = 0
    for pid in pids_in_group(pgid):
        fields = proc_stat(pid)
        if fields is not None:
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / CLK_TCK


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat."""
    # user nice system idle iowait irq softirq steal: busy = all but idle, iowait and steal (time the
    # hypervisor gave to someone else).
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    busy = parts[0] + parts[1] + parts[2] + parts[5] + parts[6]
    return busy, sum(parts)


def machine_busy_cores(window_s: float) -> float:
    """Cores the whole machine kept busy over the next ``window_s`` seconds (it sleeps that long)."""
    busy0, total0 = machine_busy_ticks()
    time.sleep(window_s)
    busy1, total1 = machine_busy_ticks()
    return (os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0)


def children_cpu_seconds() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# -- servers ----------------------------------------------------------------------------------------------


@dataclass
class Server:
    """A server process started in its own session, so that its whole tree can be signalled at once."""

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    version: str = "?"
    stopped_by: str = ""
    restarts: int = 0
    cwd: Path = REPO  # another checkout (a git worktree) runs that checkout's code

    def start(self) -> None:
        log(f"starting {self.name} on 127.0.0.1:{self.port}")
        with self.log_path.open("ab") as out:
            # Own session and process group: the whole tree (Triton's python-backend stubs too) can be
            # signalled at once, and a Ctrl-C in the terminal reaches only the benchmark.
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        LIVE_SERVERS.append(self)

    @property
    def pgid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
                self.stopped_by = "SIGTERM"
            except subprocess.TimeoutExpired:
                self.stopped_by = "SIGKILL"
        else:
            self.stopped_by = f"exited earlier (status {self.proc.returncode})"
        # Whatever is left in the group (a stub that outlived its server, or everything after the grace
        # period) is killed.
        leftovers = pids_in_group(self.pgid)
        if leftovers:
            if self.stopped_by == "SIGTERM":
                self.stopped_by = f"SIGTERM, then SIGKILL for {len(leftovers)} leftover process(es)"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self in LIVE_SERVERS:
            LIVE_SERVERS.remove(self)
        log(f"stopped {self.name}: {self.stopped_by}")


# What cleanup() stops: the servers started and not yet stopped, and client processes (in their own
# process groups) still running.
LIVE_SERVERS: list[Server] = []
LIVE_CLIENTS: list[subprocess.Popen[bytes]] = []


def cleanup() -> None:
    for proc in list(LIVE_CLIENTS):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for server in list(LIVE_SERVERS):
        server.stop(grace_s=8.0)


def on_signal(signum: int, _frame: Any) -> None:
    # Turn SIGTERM/SIGHUP into a normal exit so that finally blocks and atexit stop the servers.
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Stop every live server at exit, and on SIGTERM or SIGHUP (turned into a normal exit)."""
    atexit.register(cleanup)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)


# -- HTTP -------------------------------------------------------------------------------------------------


def run_main(name: str, run: Callable[[Any], int], args: Any, stopped: str = "servers stopped") -> int:
    """A benchmark script's ``main``: ``run(args)`` with its servers stopped however it ends (also on SIGTERM);
    exit 2 when set-up failed, 130 when interrupted."""
    install_cleanup()
    try:
        return run(args)
    except SetupError as exc:
        print(f"{name}: set-up failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {stopped}", file=sys.stderr)
        return 130
    finally:
        cleanup()


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(
    server: Server,
    headers: dict[str, str] | None = None,
    models: Iterable[str] = (),
    timeout_s: float = 90.0,
) -> None:
    """Wait until the server answers ``/v2/health/ready`` and every one of ``models`` is ready; records the
    server's version. SetupError when it exits or is not ready in time, with the end of its log."""
    deadline = time.monotonic() + timeout_s
    base = f"http://127.0.0.1:{server.port}"
    models = list(models)
    while time.monotonic() < deadline:
        if not server.alive():
            raise SetupError(
                f"{server.name} exited during start-up (status {server.proc.returncode if server.proc else '?'}); "
                f"last lines of {server.log_path}:\n{tail(server.log_path)}"
            )
        try:
            status, _ = http("GET", f"{base}/v2/health/ready", timeout=2.0)
            if status == 200 and all(
                http("GET", f"{base}/v2/models/{m}/ready", headers=headers, timeout=2.0)[0] == 200
                for m in models
            ):
                status, body = http("GET", f"{base}/v2", headers=headers)
                if status == 200:
                    server.version = json.loads(body).get("version", "?")
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    raise SetupError(
        f"{server.name} was not ready within {timeout_s:.0f} s; last lines of {server.log_path}:\n"
        f"{tail(server.log_path)}"
    )


def free_port_block(n: int) -> int:
    """A port P such that P .. P+n-1 are all free on 127.0.0.1 right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SetupError("found no free block of loopback ports")


# -- our gateway ------------------------------------------------------------------------------------------


def gateway_env(var: Path, models: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a gateway with its own folder (SQLite database, spool) and model
    repository, without what would make it share state with another (:data:`SCRUBBED_ENV`)."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update(CARBONLEDGER_VAR_DIR=str(var), MODEL_REPOSITORY=str(models), PYTHONUNBUFFERED="1")
    env["CARBONLEDGER_GRPC_PORT"] = (
        "0"  # no gRPC unless asked for (extra): gateways side by side would collide
    )
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, root: Path = REPO) -> str:
    """``manage.py ARGS`` in the repository (or the checkout ``root``) with ``env``; its standard output."""
    proc = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise SetupError(
            f"manage.py {' '.join(args)} failed (status {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def create_bench_key(env: dict[str, str], root: Path = REPO) -> str:
    """Migrate the gateway's database, create the organization ``bench`` and an API key for it (scopes infer
    and read), with the code of the checkout ``root``; returns the key."""
    manage(env, "migrate", "--noinput", root=root)
    manage(env, "create_organization", "bench", root=root)
    key = (
        manage(env, "create_api_key", "bench", "--scopes", "infer,read", root=root)
        .strip()
        .splitlines()[-1]
        .strip()
    )
    if not key or " " in key:
        raise SetupError(f"could not read the API key from create_api_key's output: {key!r}")
    return key


def serve_argv(port: int) -> list[str]:
    """The gateway on 127.0.0.1:``port``, as ``make run`` serves it (the port is the last item)."""
    return [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)]


# -- Django in this process -------------------------------------------------------------------------------


def use_database(db: str, workdir: Path) -> str:
    """Point this process's Django at a fresh database: SQLite in ``workdir``, or a new PostgreSQL database on
    127.0.0.1:5432. Returns its URL (for :func:`drop_database`); call :func:`setup_django` next."""
    os.environ["CARBONLEDGER_VAR_DIR"] = str(workdir)
    if db == "sqlite":
        url = f"sqlite:///{workdir / 'ingest.sqlite3'}"
    else:
        import psycopg

        name = f"cl_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = f"postgres://postgres@127.0.0.1:5432/{name}"
    os.environ["DATABASE_URL"] = url
    return url


def drop_database(url: str) -> None:
    """Drop a PostgreSQL database :func:`use_database` created (a SQLite file goes with its folder)."""
    if url.startswith("postgres"):
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def setup_django(database_url: str | None = None) -> None:
    """Django set up in this process with the project's settings (on ``database_url`` when given)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if database_url is not None:
        os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = DJANGO_SETTINGS
    import django

    django.setup()


# -- results ----------------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 1) -> str:
    """A number for a results table: thousands separated, ``digits`` decimals, ``n/a`` when not measured."""
    return "n/a" if v is None else f"{v:,.{digits}f}"


def utc_stamp() -> str:
    """Now in UTC, as the results' file names carry it: 20261205T131243Z."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def git(*args: str) -> str:
    """``git ARGS`` in the repository; its output, or "" when git is missing or fails."""
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_info() -> dict[str, Any]:
    """What a result depends on besides the code: CPUs and how idle ones wait, load, platform, Python, commit and
    modified files."""
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    dirty = [line for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line]
    # How idle CPUs wait (a virtual machine's halt polling off makes every wake-up a trip through the
    # hypervisor; see wakeup_probe): the cpuidle driver and the kernel command line's haltpoll setting.
    cpuidle: dict[str, str] = {}
    with contextlib.suppress(OSError):
        cpuidle["driver"] = Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    with contextlib.suppress(OSError):
        for word in Path("/proc/cmdline").read_text().split():
            if "halt_poll" in word or word.startswith(("idle=", "cpuidle")):
                cpuidle[word.split("=", 1)[0]] = word.partition("=")[2]
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "cpuidle": cpuidle,
        "loadavg_at_start": os.getloadavg(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "git_commit": git("rev-parse", "HEAD"),
        "git_modified_tracked_files": dirty,
    }


# The echo end of wakeup_probe, run as ``python -c`` (a fresh interpreter: no fork of a process with threads).
# argv: port, "block" or "poll", time limit in seconds. It echoes until the other end closes; polling spins on a
# non-blocking recv, so it never sleeps. Either way it gives up at the time limit.
_ECHO = """
import socket, struct, sys, time
port, poll, limit_s = int(sys.argv[1]), sys.argv[2] == "poll", float(sys.argv[3])
deadline = time.monotonic() + limit_s
c = socket.create_connection(("127.0.0.1", port), timeout=limit_s)
c.settimeout(None)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(limit_s) + 1, 0))
while time.monotonic() < deadline:
    try:
        m = c.recv(4096, socket.MSG_DONTWAIT) if poll else c.recv(4096)
    except BlockingIOError:
        continue
    if not m:
        break
    c.sendall(m)
"""


def _median_round_trip_us(n: int, poll: bool, timeout_s: float) -> float:
    """The median (upper, for an even ``n``) of ``n`` loopback TCP round trips of 300 bytes between this process
    and an echoing child, in µs; ``poll``: both ends spin on a non-blocking ``recv`` instead of blocking in it.
    Raises ``TimeoutError`` when the whole takes over ``timeout_s``, ``ConnectionError`` when the child goes
    away."""
    deadline = time.monotonic() + timeout_s
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-c", _ECHO, str(port), "poll" if poll else "block", str(timeout_s)],
            stdin=subprocess.DEVNULL,
        )
        try:
            conn = _accept(listener, child, deadline)
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if poll:
                    conn.setblocking(False)
                else:
                    # A kernel time-out, not Python's: a Python one would add a poll() to every recv.
                    limit = struct.pack("ll", int(timeout_s) + 1, 0)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
                message = b"x" * 300
                times: list[float] = []
                for _ in range(n):
                    start = time.perf_counter_ns()
                    _send(conn, message, deadline)
                    got = 0
                    while got < len(message):
                        try:
                            chunk = conn.recv(4096)
                        except BlockingIOError:  # polling, or the kernel time-out when blocking
                            _check(deadline)
                            continue
                        if not chunk:
                            raise ConnectionError("the wake-up probe's echo closed the connection")
                        got += len(chunk)
                    times.append((time.perf_counter_ns() - start) / 1000)
                return sorted(times)[n // 2]
        finally:
            # Our end is closed by now, so the echo reads the end of the stream and exits.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=2.0)
            if child.poll() is None:
                child.kill()
                child.wait()


def _accept(listener: socket.socket, child: subprocess.Popen[bytes], deadline: float) -> socket.socket:
    while True:
        try:
            conn, _ = listener.accept()
            return conn
        except TimeoutError:
            if child.poll() is not None:
                raise ConnectionError(f"the wake-up probe's echo exited ({child.returncode})") from None
            _check(deadline)


def _send(conn: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[conn.send(view) :]
        except BlockingIOError:
            _check(deadline)


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError("the wake-up probe's echo did not answer in time")


def wakeup_probe(n: int = 2000, timeout_s: float = 20.0) -> dict[str, Any]:
    """What waking a blocked thread costs on this host, from loopback TCP round trips with a child process.

    Each request of a closed loop pays for wake-ups in its turn-around (the client's thread woken by the
    answer, the server's by the next request). On a virtual machine whose idle CPUs halt without polling,
    each is a trip through the hypervisor, so this is one of the costs that differ between hosts. Medians of
    ``n`` round trips blocking in ``recv`` and, with two or more CPUs, spinning on it; ``wakeup_us`` is half
    their difference. ``{"error": ...}`` when the probe could not run: it only describes the host.

    Only a quiet host gives its real cost: where other work keeps the CPUs from halting, nothing needs waking
    from a halt, and the blocking round trips come out nearly as fast as the spinning ones. So the result also
    says how busy the machine was just before (``machine_busy_cores_before``, over half a second)."""
    before = round(machine_busy_cores(0.5), 2)
    try:
        result: dict[str, Any] = {
            "round_trips": n,
            "machine_busy_cores_before": before,
            "blocking_us": round(_median_round_trip_us(n, poll=False, timeout_s=timeout_s), 1),
        }
        if len(os.sched_getaffinity(0)) >= 2:  # two spinning ends on one CPU would only take turns
            result["polling_us"] = round(_median_round_trip_us(n, poll=True, timeout_s=timeout_s), 1)
            result["wakeup_us"] = round(max(0.0, result["blocking_us"] - result["polling_us"]) / 2, 1)
    except OSError as exc:  # TimeoutError and ConnectionError among them
        return {
            "round_trips": n,
            "machine_busy_cores_before": before,
            "error": f"{type(exc).__name__}: {exc}",
        }
    return result


def write_json(paths: Path | Sequence[Path], doc: Any, indent: int = 2) -> Path:
    """Write ``doc`` as JSON to each path (folders created); returns the first path."""
    targets = [paths] if isinstance(paths, Path) else list(paths)
    text = json.dumps(doc, indent=indent, default=str) + "\n"
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return targets[0]

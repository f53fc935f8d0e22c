"""One meter per device, with real gateway processes on one database (a fresh PostgreSQL database in the suite's
PostgreSQL run, else one SQLite file), both on this host. Only the hardware is faked: a powercap tree in a
temporary folder stands for the RAPL package (METER_RAPL_ROOT), and a stand-in ``pynvml`` module on the
gateways' PYTHONPATH for the GPU.

* Two gateways with the modelled CPU meter each meter a device of their own (host id and process).
* A second gateway on a host whose RAPL package the first meters falls back to its own process's modelled CPU
  meter, labelled as such; the package's energy is booked by one gateway only, and once the first stops, the
  second takes the package at its next start.
* A second gateway finding its GPU metered by a live gateway refuses to start, naming the GPU and the holder,
  while the first keeps serving.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.gateway_process import (
    DEMO_LINEAR,
    GatewayProcess,
    LedgerDatabase,
    gateway_env,
    infer_once,
    manage,
    prepare_gateway,
    wait_until,
)

# Subprocesses on their own database: pytest-django's test database is never touched.
pytestmark = pytest.mark.django_db(False)

HOST = "host-under-test"
UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
FAKE_PYNVML = """\
import os

from tests.inference.fake_pynvml import FakeGpu, FakeNvml

_fake = FakeNvml([FakeGpu(u) for u in os.environ["FAKE_GPU_UUIDS"].split(",")], live=True)
for _name in dir(_fake):
    if _name.startswith(("nvml", "NVML")):
        globals()[_name] = getattr(_fake, _name)
"""


def _ledger_db(database_url: str) -> LedgerDatabase:
    if database_url.startswith("sqlite:///"):
        return LedgerDatabase(sqlite_path=Path(database_url.removeprefix("sqlite:///")))
    return LedgerDatabase(postgres_url=database_url)


def _env(var_dir: Path, database_url: str, **extra: str) -> dict[str, str]:
    return gateway_env(
        var_dir,
        database_url,
        METER_INTERVAL_S="0.25",
        LEDGER_WRITE_INTERVAL_S="0.1",
        CARBONLEDGER_HOST_ID=HOST,
        DEVICE_LEASE_TTL_S="3",
        **extra,
    )


def _second_replica(env: dict[str, str]) -> str:
    """The second gateway's own model repository and an API key of the organization the first one made."""
    models = Path(env["MODEL_REPOSITORY"])
    models.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEMO_LINEAR, models / "linear")
    done = manage(env, "create_api_key", "acme", "--scopes", "infer,read")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _serve(address: tuple[str, int], key: str, n: int) -> None:
    for _ in range(n):
        status, body = infer_once(address, key)
        assert status == 200, body


def _chain_id(var_dir: Path) -> str:
    return (var_dir / "spool" / "chain_id").read_text().strip()


def _intervals(db: LedgerDatabase) -> list[tuple[str, str, int, int, int]]:
    """(chain id, device id, t0, t1, µJ) of every metering interval."""
    return [
        (str(chain), str(device), int(t0), int(t1), int(uj))
        for chain, device, t0, t1, uj in db.query(
            "SELECT c.chain_id, i.device_id, i.t0_ns, i.t1_ns, i.energy_uj FROM ledger_interval i "
            "JOIN carbonledger_ledgerchain c ON c.id = i.chain_id ORDER BY i.t0_ns"
        )
    ]


def _devices(db: LedgerDatabase) -> dict[str, tuple[str, dict[str, str]]]:
    return {
        str(d): (str(method), info if isinstance(info, dict) else orjson.loads(info))
        for d, method, info in db.query("SELECT device_id, method, info FROM carbonledger_device")
    }


def _drained(db: LedgerDatabase, chains: set[str]) -> bool:
    return {c for c, *_ in _intervals(db)} >= chains


@pytest.fixture
def powercap(tmp_path: Path) -> Iterator[Path]:
    """A one-package powercap tree whose counter a thread advances at 40 W (what the package draws)."""
    root = tmp_path / "powercap"
    pkg = root / "intel-rapl:0"
    pkg.mkdir(parents=True)
    (pkg / "name").write_text("package-0\n")
    (pkg / "max_energy_range_uj").write_text("262143328850\n")
    energy = pkg / "energy_uj"
    energy.write_text("1000000\n")
    stop = threading.Event()

    def advance() -> None:
        value = 1_000_000
        while not stop.wait(0.05):
            value += 2_000_000  # 2 J every 50 ms
            tmp = energy.with_suffix(".tmp")
            tmp.write_text(f"{value}\n")
            tmp.replace(energy)

    thread = threading.Thread(target=advance, daemon=True)
    thread.start()
    yield root
    stop.set()
    thread.join(5)


def test_two_gateways_on_one_host_meter_their_own_modelled_cpu(tmp_path: Path, database_url: str) -> None:
    db = _ledger_db(database_url)
    env_a = _env(tmp_path / "a", database_url, METERS="cpu-model")
    env_b = _env(tmp_path / "b", database_url, METERS="cpu-model")
    key_a = prepare_gateway(env_a)
    key_b = _second_replica(env_b)
    with GatewayProcess(env_a, tmp_path / "a.log") as a, GatewayProcess(env_b, tmp_path / "b.log") as b:
        a.start(60)
        b.start(60)
        _serve(a.address, key_a, 5)
        _serve(b.address, key_b, 5)
        chain_a, chain_b = _chain_id(tmp_path / "a"), _chain_id(tmp_path / "b")
        assert wait_until(lambda: _drained(db, {chain_a, chain_b}), 90)
        assert a.terminate(), a.log_tail()
        assert b.terminate(), b.log_tail()
    by_chain: dict[str, set[str]] = {}
    for chain, device, *_ in _intervals(db):
        by_chain.setdefault(chain, set()).add(device)
    # Each gateway meters a device of its own, named by host and process: none is booked by both.
    assert len(by_chain[chain_a]) == 1 and len(by_chain[chain_b]) == 1, by_chain
    (device_a,), (device_b,) = by_chain[chain_a], by_chain[chain_b]
    assert device_a != device_b
    for device in (device_a, device_b):
        assert device.startswith(f"cpu-model:{HOST}:"), device
    devices = _devices(db)
    assert devices[device_a][0] == devices[device_b][0] == "modelled"


def test_a_second_gateway_on_a_host_whose_rapl_package_is_taken_falls_back_to_its_own_modelled_cpu(
    tmp_path: Path, database_url: str, powercap: Path
) -> None:
    db = _ledger_db(database_url)
    env_a = _env(tmp_path / "a", database_url, METERS="auto", METER_RAPL_ROOT=str(powercap))
    env_b = _env(tmp_path / "b", database_url, METERS="auto", METER_RAPL_ROOT=str(powercap))
    key_a = prepare_gateway(env_a)
    key_b = _second_replica(env_b)
    rapl = f"rapl:{HOST}:intel-rapl:0"
    with GatewayProcess(env_a, tmp_path / "a.log") as a, GatewayProcess(env_b, tmp_path / "b.log") as b:
        a.start(60)
        b.start(60)
        _serve(a.address, key_a, 5)
        _serve(b.address, key_b, 5)
        assert "falls back to its own modelled CPU" in b.log_path.read_text(), b.log_tail()
        chain_a, chain_b = _chain_id(tmp_path / "a"), _chain_id(tmp_path / "b")
        assert wait_until(lambda: _drained(db, {chain_a, chain_b}), 90)
        assert a.terminate(), a.log_tail()
        assert b.terminate(), b.log_tail()
    intervals = _intervals(db)
    on_package = [i for i in intervals if i[1] == rapl]
    # The package is booked by the gateway that holds it, and by no other: no instant of it is charged twice.
    assert on_package and {chain for chain, *_ in on_package} == {chain_a}
    for (_, _, _, t1, _), (_, _, t0, _, _) in itertools.pairwise(on_package):
        assert t1 <= t0
    # The second gateway books its own process, modelled, on a device of its own, and says why.
    devices_b = {device for chain, device, *_ in intervals if chain == chain_b}
    assert len(devices_b) == 1, devices_b
    (device_b,) = devices_b
    assert device_b.startswith(f"cpu-model:{HOST}:") and device_b != rapl
    method, info = _devices(db)[device_b]
    assert method == "modelled"
    assert rapl in info["reason"] and "metered by" in info["reason"], info

    # The first gateway is gone (its lease released at shutdown): the second takes the package when it starts.
    with GatewayProcess(env_b, tmp_path / "b2.log") as b:
        b.start(60)
        _serve(b.address, key_b, 3)
        assert wait_until(lambda: any(c == chain_b and d == rapl for c, d, *_ in _intervals(db)), 90)
        assert b.terminate(), b.log_tail()


def test_a_second_gateway_finding_its_gpu_metered_by_a_live_gateway_refuses_to_start(
    tmp_path: Path, database_url: str
) -> None:
    fake = tmp_path / "fake-nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    gpu = {"PYTHONPATH": str(fake), "FAKE_GPU_UUIDS": UUID}
    env_a = _env(tmp_path / "a", database_url, METERS="auto", **gpu)
    env_b = _env(tmp_path / "b", database_url, METERS="auto", **gpu)
    key_a = prepare_gateway(env_a)
    _second_replica(env_b)
    with GatewayProcess(env_a, tmp_path / "a.log") as a:
        a.start(60)
        _serve(a.address, key_a, 3)
        b = GatewayProcess(env_b, tmp_path / "b.log")
        with pytest.raises(RuntimeError, match="exited during start-up"):
            b.start(60)
        log = b.log_path.read_text()
        assert UUID in log and "one gateway per GPU" in log, b.log_tail()
        # The first keeps serving, metering the GPU.
        _serve(a.address, key_a, 3)
        db = _ledger_db(database_url)
        assert wait_until(lambda: any(d == UUID for _c, d, *_ in _intervals(db)), 90)
        assert a.terminate(), a.log_tail()
    assert {c for c, d, *_ in _intervals(db) if d == UUID} == {_chain_id(tmp_path / "a")}

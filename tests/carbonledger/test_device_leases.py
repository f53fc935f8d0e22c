"""Device leases (carbonledger/device_leases.py) on the test database: two owners stand for two gateway
processes. Only the hardware is faked (a powercap tree, tests/inference/fake_pynvml.py)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from django.db import OperationalError

from carbonledger.device_leases import DeviceLeases, LeasedRecorder, claim_meters
from inference.meters import CpuModelMeter, DeviceHeld, FencedMeter, Meter, NvmlMeter, RaplMeter
from inference.meters.claims import FALLBACK
from inference.recorder import RecorderOptions
from inference.spool import Spool, SpoolPosition
from tenancy.leases import lease_holder
from tests.inference.fake_pynvml import FakeGpu, FakeNvml
from tests.inference.test_meters import make_rapl

pytestmark = pytest.mark.django_db(transaction=True)

UUID = "GPU-11111111-2222-3333-4444-555555555555"
RAPL = "rapl:node-1:intel-rapl:0"


def live_gateway(owner: str) -> DeviceLeases:
    """The leases of another gateway that keeps running: renewed every second once started."""
    return DeviceLeases(3.0, owner=owner)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _own_cpu(instance: str) -> Meter:
    return CpuModelMeter(host_id="node-1", instance=instance, cpu_time_s=lambda: 0.0)


def test_a_free_device_is_claimed_and_one_a_live_gateway_holds_is_not() -> None:
    first = DeviceLeases(60.0, owner="node-1:100:aaaa")
    second = DeviceLeases(1.0, owner="node-1:200:bbbb")
    assert first.claim(RAPL) is None
    started = time.monotonic()
    # Its lease runs beyond one lease time of ours: a live holder, not one that stopped.
    assert second.claim(RAPL) == "node-1:100:aaaa"
    assert time.monotonic() - started < 1.0
    assert first.held() == [RAPL] and second.held() == []


def test_a_holder_that_stopped_renewing_is_waited_for_and_taken_over() -> None:
    dead = DeviceLeases(0.5, owner="node-1:100:dead")
    assert dead.claim(RAPL) is None
    token = lease_holder(f"device:{RAPL}").token  # type: ignore[union-attr]
    restarted = DeviceLeases(2.0, owner="node-1:101:new")
    assert restarted.claim(RAPL) is None
    holder = lease_holder(f"device:{RAPL}")
    assert holder is not None and (holder.owner, holder.token) == ("node-1:101:new", token + 1)


def test_a_released_device_is_claimed_at_once() -> None:
    first = DeviceLeases(60.0, owner="node-1:100:aaaa")
    assert first.claim(UUID) is None
    first.stop()
    started = time.monotonic()
    assert DeviceLeases(60.0, owner="node-1:200:bbbb").claim(UUID) is None
    assert time.monotonic() - started < 1.0


def test_a_meter_books_only_while_its_lease_is_surely_held_and_never_again_once_taken_over() -> None:
    clock = Clock()
    mine = DeviceLeases(0.6, owner="node-1:100:aaaa", monotonic=clock)
    assert mine.claim(RAPL) is None
    live = mine.live(RAPL)
    assert live()
    clock.now += 0.7  # no renewal for a lease time (the database unreachable): maybe someone else's by now
    assert not live()
    assert 'carbonledger_device_lease_held{device="rapl:node-1:intel-rapl:0"} 0' in mine.prometheus_lines()
    mine.renew_all()  # it still was ours: nobody claimed it meanwhile
    assert live()
    assert 'carbonledger_device_lease_held{device="rapl:node-1:intel-rapl:0"} 1' in mine.prometheus_lines()
    time.sleep(0.7)  # the lease expires in the database, and another gateway takes the device over
    assert DeviceLeases(5.0, owner="node-1:200:bbbb").claim(RAPL) is None
    mine.renew_all()
    assert not live()
    assert mine.lost[RAPL] == "taken over by node-1:200:bbbb (token 2)"
    clock.now += 100
    mine.renew_all()
    assert not live() and mine.held() == []
    assert 'carbonledger_device_lease_held{device="rapl:node-1:intel-rapl:0"} 0' in mine.prometheus_lines()


def test_the_second_gateway_on_a_host_whose_rapl_package_is_taken_meters_its_own_modelled_cpu(
    tmp_path: Path,
) -> None:
    root = make_rapl(tmp_path)
    first = live_gateway("node-1:100:aaaa")
    second = DeviceLeases(3.0, owner="node-1:200:bbbb")
    mine = claim_meters(first, [(RaplMeter(0, root=root, host_id="node-1"), "rapl")], lambda: _own_cpu("a"))
    first.start()
    theirs = claim_meters(
        second, [(RaplMeter(0, root=root, host_id="node-1"), "rapl")], lambda: _own_cpu("b")
    )
    assert [(m.device_id, m.method) for m, _ in mine] == [(RAPL, "rapl")]
    assert [(m.device_id, m.method) for m, _ in theirs] == [("cpu-model:node-1:b", "modelled")]
    assert theirs[0][1].startswith(FALLBACK) and "metered by node-1:100:aaaa" in theirs[0][1]
    assert all(isinstance(m, FencedMeter) for m, _ in [*mine, *theirs])
    assert first.held() == [RAPL] and second.held() == ["cpu-model:node-1:b"]
    first.stop()


class LockedOnce(DeviceLeases):
    """Leases whose first claim meets a locked database (SQLite's "database table is locked")."""

    def __init__(self, owner: str) -> None:
        super().__init__(3.0, owner=owner)
        self.failures = 0

    def claim(self, device_id: str) -> str | None:
        if self.failures == 0:
            self.failures += 1
            raise OperationalError("database table is locked")
        return super().claim(device_id)


def test_a_claim_the_database_refused_at_start_up_is_retried_and_its_meters_still_start() -> None:
    leases = LockedOnce("node-1:100:aaaa")
    gpu = FakeNvml([FakeGpu(UUID)])
    claimed = claim_meters(
        leases, [(NvmlMeter(0, nvml_module=gpu), "nvml"), (_own_cpu("a"), "cpu")], lambda: _own_cpu("b")
    )
    assert leases.failures == 1
    assert [m.device_id for m, _ in claimed] == [UUID, "cpu-model:node-1:a"]
    for meter, _ in claimed:
        meter.start()  # a retry of the whole policy had closed them: "meter is closed"
        meter.close()
    assert leases.held() == [UUID, "cpu-model:node-1:a"]


def test_a_second_gateway_on_a_gpu_a_live_gateway_meters_refuses_to_start_naming_both() -> None:
    first = live_gateway("node-1:100:aaaa")
    second = DeviceLeases(3.0, owner="node-1:200:bbbb")
    claim_meters(
        first, [(NvmlMeter(0, nvml_module=FakeNvml([FakeGpu(UUID)])), "nvml")], lambda: _own_cpu("a")
    )
    first.start()
    fake = FakeNvml([FakeGpu(UUID)])
    with pytest.raises(DeviceHeld, match=f"GPU {UUID} is metered by the gateway node-1:100:aaaa"):
        claim_meters(second, [(NvmlMeter(0, nvml_module=fake), "nvml")], lambda: _own_cpu("b"))
    assert second.held() == [] and fake.active_inits == 0
    first.stop()


def test_the_recorder_claims_its_meters_when_it_starts_spools_why_and_releases_them_when_it_stops(
    tmp_path: Path,
) -> None:
    root = make_rapl(tmp_path)
    first = live_gateway("node-1:100:aaaa")  # the first gateway on the host
    first.claim(RAPL)
    first.start()
    spool = Spool(tmp_path / "spool")
    leases = DeviceLeases(3.0, owner="node-1:200:bbbb")
    recorder = LeasedRecorder(
        spool,
        [(RaplMeter(0, root=root, host_id="node-1"), "rapl: package-0")],
        RecorderOptions(sample_interval_s=0.05),
        leases=leases,
        fallback=lambda: _own_cpu(spool.chain_id),
    )
    assert [d.device_id for d in recorder.devices] == [RAPL]  # as detected, until it starts
    recorder.start()
    try:
        assert [(d.device_id, d.kind) for d in recorder.devices] == [
            (f"cpu-model:node-1:{spool.chain_id}", "cpu")
        ]
        assert leases.held() == [f"cpu-model:node-1:{spool.chain_id}"]
    finally:
        recorder.stop()
        first.stop()
    assert leases.held() == []
    lines, _ = spool.read(SpoolPosition.start())
    devices = [orjson.loads(line) for line in lines if b'"k":"device"' in line]
    assert [(d["device_id"], d["method"]) for d in devices] == [
        (f"cpu-model:node-1:{spool.chain_id}", "modelled")
    ]
    assert "metered by node-1:100:aaaa" in devices[0]["info"]["reason"]
    spool.close()

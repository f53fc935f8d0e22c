"""Device identity across hosts (inference/meters/host.py) and the one-gateway-per-device policy
(inference/meters/claims.py): no Django, no database; only the hardware is faked (a powercap tree in tmp_path,
tests/inference/fake_pynvml.py for NVML)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference.meters import (
    CpuModelMeter,
    DeviceHeld,
    FencedMeter,
    Meter,
    NvmlMeter,
    RaplMeter,
    claim_devices,
)
from inference.meters.claims import FALLBACK
from inference.meters.host import (
    check_host_id,
    cpu_model_device_id,
    detect_host_id,
    host_id,
    instance_part,
)
from inference.meters.registry import cpu_model_meter, probe_meters
from tests.inference.fake_pynvml import FakeGpu, FakeNvml
from tests.inference.test_meters import FakeClock, make_rapl, set_energy

UUID = "GPU-11111111-2222-3333-4444-555555555555"
MACHINE_ID = "3d1219c7c4c5404aaa1f6d2a48adfda4"


# -- the host id --------------------------------------------------------------------------------


def test_the_host_id_is_the_machine_id_when_the_host_has_one(tmp_path: Path) -> None:
    machine_id = tmp_path / "machine-id"
    machine_id.write_text(f"{MACHINE_ID.upper()}\n")
    assert detect_host_id(machine_id_files=[tmp_path / "missing", machine_id], hostname=lambda: "node-1") == (
        MACHINE_ID,
        str(machine_id),
    )


def test_without_a_machine_id_the_host_id_is_the_host_name(tmp_path: Path) -> None:
    empty = tmp_path / "machine-id"
    empty.write_text("\n")  # an image built without one: systemd fills it in at boot, containers never do
    assert detect_host_id(machine_id_files=[empty], hostname=lambda: "Node-1.example") == (
        "node-1.example",
        "the host name",
    )


def test_a_long_or_odd_host_name_is_digested_into_a_stable_host_id(tmp_path: Path) -> None:
    long_name = "n" * 200
    first = detect_host_id(machine_id_files=[], hostname=lambda: long_name)[0]
    assert first == detect_host_id(machine_id_files=[], hostname=lambda: long_name)[0]
    assert len(first) <= 64 and check_host_id(first) == first
    odd = detect_host_id(machine_id_files=[], hostname=lambda: "node 1/\u00e9")[0]
    assert check_host_id(odd) == odd


@pytest.mark.parametrize("bad", ["", "-node", "node 1", "node/1", "x" * 65, "nœud"])
def test_a_named_host_id_that_cannot_be_part_of_a_device_id_is_refused_saying_why(bad: str) -> None:
    with pytest.raises(ValueError, match="a host id must be 1 to 64 letters, digits"):
        check_host_id(bad)
    with pytest.raises(ValueError):
        host_id(bad or "-")


def test_a_named_host_id_wins_over_the_detected_one() -> None:
    assert host_id("k8s-node-3") == "k8s-node-3"


# -- device ids ---------------------------------------------------------------------------------


def test_a_rapl_package_is_named_by_host_and_package(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, packages=2)
    meters = [RaplMeter(n, root=root, host_id="node-1") for n in (0, 1)]
    other_host = RaplMeter(0, root=root, host_id="node-2")
    assert [m.device_id for m in meters] == ["rapl:node-1:intel-rapl:0", "rapl:node-1:intel-rapl:1"]
    assert other_host.device_id == "rapl:node-2:intel-rapl:0"
    assert meters[0].device_info()["host_id"] == "node-1"


def test_the_modelled_cpu_is_named_by_host_and_process_so_two_gateways_on_one_host_never_share_it() -> None:
    chain_a, chain_b = "5f0e9d3b0c4a4e7f8a1b2c3d4e5f6a7b", "0123456789abcdef0123456789abcdef"
    a = CpuModelMeter(host_id="node-1", instance=chain_a)
    b = CpuModelMeter(host_id="node-1", instance=chain_b)
    assert a.device_id == f"cpu-model:node-1:{chain_a}"
    assert b.device_id == f"cpu-model:node-1:{chain_b}"
    # A restart of gateway a (same chain) keeps its device; a process with no chain is named by its pid.
    assert CpuModelMeter(host_id="node-1", instance=chain_a).device_id == a.device_id
    assert CpuModelMeter(host_id="node-1").device_id == f"cpu-model:node-1:pid{os.getpid()}"
    assert a.device_info()["host_id"] == "node-1"


def test_an_odd_instance_name_still_fits_the_device_id_column() -> None:
    device_id = cpu_model_device_id("h" * 64, "a chain id copied by hand / with spaces " * 3)
    assert len(device_id) <= 128  # ledger and device rows: CharField(max_length=128)
    assert instance_part("x" * 40) == instance_part("x" * 40) != "x" * 32


def test_a_gpu_keeps_its_uuid_as_its_device_id() -> None:
    meter = NvmlMeter(0, nvml_module=FakeNvml([FakeGpu(UUID)]))
    assert meter.device_id == UUID
    meter.close()


def test_detection_names_rapl_and_the_modelled_cpu_by_the_given_host_and_instance(tmp_path: Path) -> None:
    det = probe_meters(sources=("rapl",), rapl_root=make_rapl(tmp_path), host_id="node-9")
    assert [m.device_id for m, _ in det.meters] == ["rapl:node-9:intel-rapl:0"]
    det.close_all()
    det = probe_meters(sources=("cpu-model",), host_id="node-9", instance="chain9")
    assert [m.device_id for m, _ in det.meters] == ["cpu-model:node-9:chain9"]
    det.close_all()


# -- one gateway per device -----------------------------------------------------------------------


class Claims:
    """Leases in a dict: device id -> holder. ``mine`` is this process."""

    def __init__(self, held_by_others: dict[str, str] | None = None) -> None:
        self.holders = dict(held_by_others or {})
        self.released: list[str] = []

    def claim(self, device_id: str) -> str | None:
        holder = self.holders.setdefault(device_id, "mine")
        return None if holder == "mine" else holder

    def release(self, device_id: str) -> None:
        if self.holders.get(device_id) == "mine":
            del self.holders[device_id]
            self.released.append(device_id)

    @property
    def mine(self) -> set[str]:
        return {d for d, h in self.holders.items() if h == "mine"}


def _own_cpu() -> Meter:
    return cpu_model_meter({"cpu_time_s": lambda: 0.0}, "node-1", "chain-b")


def test_free_devices_are_all_claimed_and_kept(tmp_path: Path) -> None:
    gpu = NvmlMeter(0, nvml_module=FakeNvml([FakeGpu(UUID)]))
    rapl = RaplMeter(0, root=make_rapl(tmp_path), host_id="node-1")
    claims = Claims()
    kept = claim_devices([(gpu, "nvml"), (rapl, "rapl")], claims.claim, claims.release, fallback=_own_cpu)
    assert [m.device_id for m, _ in kept] == ["rapl:node-1:intel-rapl:0", UUID]
    assert claims.mine == {UUID, "rapl:node-1:intel-rapl:0"}


def test_a_gpu_another_gateway_meters_stops_the_start_naming_the_gpu_and_the_holder(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(UUID)])
    gpu = NvmlMeter(0, nvml_module=fake)
    rapl = RaplMeter(0, root=make_rapl(tmp_path), host_id="node-1")
    claims = Claims({UUID: "node-1:4242:abcdef"})
    with pytest.raises(DeviceHeld, match="one gateway per GPU") as raised:
        claim_devices([(rapl, "rapl"), (gpu, "nvml")], claims.claim, claims.release, fallback=_own_cpu)
    assert UUID in str(raised.value) and "node-1:4242:abcdef" in str(raised.value)
    assert (raised.value.device_id, raised.value.holder) == (UUID, "node-1:4242:abcdef")
    # Nothing is left claimed or open: the RAPL package claimed before the GPU was refused is given back.
    assert claims.mine == set() and claims.released == ["rapl:node-1:intel-rapl:0"]
    assert fake.active_inits == 0


def test_a_taken_rapl_package_falls_back_to_this_processs_own_modelled_cpu_saying_why(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, packages=2)
    packages = [RaplMeter(n, root=root, host_id="node-1") for n in (0, 1)]
    # The other gateway holds package 1 only (it started first, or package 0's lease expired): the host's
    # packages go together, so package 0, claimed here first, is given back too.
    claims = Claims({"rapl:node-1:intel-rapl:1": "node-1:1001:aaaa"})
    kept = claim_devices([(m, "rapl") for m in packages], claims.claim, claims.release, fallback=_own_cpu)
    assert [(m.device_id, m.method) for m, _ in kept] == [("cpu-model:node-1:chain-b", "modelled")]
    why = kept[0][1]
    assert why.startswith(FALLBACK)
    assert "rapl:node-1:intel-rapl:1 (metered by node-1:1001:aaaa)" in why
    assert claims.mine == {"cpu-model:node-1:chain-b"}
    assert claims.released == ["rapl:node-1:intel-rapl:0"]
    assert all(not m.started for m in packages)


def test_a_gateway_with_its_own_gpu_on_a_host_whose_rapl_is_taken_keeps_the_gpu_and_models_its_cpu(
    tmp_path: Path,
) -> None:
    gpu = NvmlMeter(0, nvml_module=FakeNvml([FakeGpu(UUID)]))
    rapl = RaplMeter(0, root=make_rapl(tmp_path), host_id="node-1")
    claims = Claims({"rapl:node-1:intel-rapl:0": "node-1:1001:aaaa"})
    kept = claim_devices([(gpu, "nvml"), (rapl, "rapl")], claims.claim, claims.release, fallback=_own_cpu)
    assert [(m.device_id, m.method) for m, _ in kept] == [
        (UUID, "nvml-counter"),
        ("cpu-model:node-1:chain-b", "modelled"),
    ]


def test_a_modelled_cpu_device_held_by_another_process_means_a_second_process_started_as_this_one() -> None:
    cpu = _own_cpu()
    claims = Claims({cpu.device_id: "node-1:77:ffff"})
    with pytest.raises(DeviceHeld, match="another live process was started as this one"):
        claim_devices([(cpu, "cpu-model")], claims.claim, claims.release, fallback=_own_cpu)


# -- the fence ----------------------------------------------------------------------------------


def test_a_fenced_meter_books_energy_only_while_its_lease_is_surely_held(tmp_path: Path) -> None:
    root = make_rapl(tmp_path, dram=False)
    pkg = root / "intel-rapl:0"
    live = [True]
    meter = FencedMeter(RaplMeter(0, root=root, host_id="node-1"), lambda: live[0], clock_ns=FakeClock())
    assert (meter.device_id, meter.method) == ("rapl:node-1:intel-rapl:0", "rapl")
    assert meter.device_info()["lease"] == "device:rapl:node-1:intel-rapl:0"
    meter.start()
    set_energy(pkg, 3_000_000)
    assert meter.read().energy_j == 2.0
    live[0] = False  # a renewal overdue (database unreachable): hold what is surely ours
    set_energy(pkg, 5_000_000)
    assert meter.read().energy_j == 2.0
    live[0] = True  # renewed: nobody took the device meanwhile, so the held energy was ours alone
    assert meter.read().energy_j == 4.0
    live[0] = False  # taken over: never again
    set_energy(pkg, 9_000_000)
    assert meter.read().energy_j == 4.0
    meter.close()
    assert not meter.inner.started

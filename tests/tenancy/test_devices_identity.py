"""Device ids now name their host (a RAPL package: ``rapl:<host>:intel-rapl:N``) and, for the modelled CPU, their
gateway (``cpu-model:<host>:<chain>``). A database written before the change keeps every device row as it was
and its chains verify, once migrated forward and written to by gateways that name devices the new way: the
hashed records are never rewritten; new names are new device rows."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from carbonledger.device_leases import DeviceLeases, LeasedRecorder
from inference.meters import CpuModelMeter
from inference.recorder import RecorderOptions
from inference.spool import Spool
from ledger.models import LedgerBatch, LedgerInterval
from ledger.verify import verify_all
from ledger.writer import LedgerWriter, upsert_devices
from tenancy.models import Device, Lease, Organization, Site
from tests.support.ledger import lines_for_batch

# The last migration of tenancy before device leases: the database of a running installation of that release.
BEFORE_LEASES = [("tenancy", "0001_initial")]
LEGACY_IDS = ("cpu-model", "rapl:intel-rapl:0")


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == "tenancy"]


def _drain(spool: Spool) -> None:
    writer = LedgerWriter(spool)
    writer.recover()
    writer.drain_available()
    writer.stop()


@pytest.mark.django_db(transaction=True)
def test_devices_named_before_host_ids_keep_their_rows_and_their_chains_verify_after_the_change(
    tmp_path: Path,
) -> None:
    latest = _latest()
    org = Organization.objects.create(slug="before", name="Before host ids")
    old = Spool(tmp_path / "old")
    device_lines = []
    for device_id in LEGACY_IDS:
        for _ in range(2):
            lines, _ = lines_for_batch(org.pk, device_id=device_id, prefix=f"old-{device_id}")
            old.append(b"".join(lines))
            device_lines += [orjson.loads(line) for line in lines if orjson.loads(line)["k"] == "device"]
    _migrate(BEFORE_LEASES)
    try:
        assert "tenancy_lease" not in connection.introspection.table_names()
        # The devices as the drainer of that release recorded them from the gateway's device lines...
        upsert_devices(device_lines)
        # ...and as the operator then placed them: a site of their own, the package's idle power declared.
        rack = Site.objects.create(name="rack-1", zone="FR")
        Device.objects.filter(device_id__in=LEGACY_IDS).update(site=rack, idle_power_w=12.5)
        before = {d.device_id: (d.site_id, d.idle_power_w, d.info, d.method) for d in Device.objects.all()}
        assert set(before) == set(LEGACY_IDS)
    finally:
        _migrate(latest)
    _drain(old)  # its records, written as that release wrote them: the ids pass through unchanged

    # A gateway of the new release on the same host: its device is named by host and ledger chain.
    new = Spool(tmp_path / "new")
    own_cpu = CpuModelMeter(host_id="node-1", instance=new.chain_id, cpu_time_s=lambda: 0.0)
    recorder = LeasedRecorder(
        new,
        [(own_cpu, "cpu-model: no NVML or RAPL")],
        RecorderOptions(sample_interval_s=0.05),
        leases=DeviceLeases(30.0, owner="node-1:1:new"),
        fallback=lambda: CpuModelMeter(host_id="node-1", instance=new.chain_id),
    )
    recorder.start()
    lines, _ = lines_for_batch(org.pk, device_id=own_cpu.device_id, prefix="new")
    new.append(b"".join(lines))
    recorder.stop()
    _drain(new)

    new_id = f"cpu-model:node-1:{new.chain_id}"
    after = {d.device_id: (d.site_id, d.idle_power_w, d.info, d.method) for d in Device.objects.all()}
    assert {k: v for k, v in after.items() if k in LEGACY_IDS} == before  # untouched
    assert set(after) == {*LEGACY_IDS, new_id}
    assert after[new_id][0] != rack.pk  # a new device: placed in the default site, as any new device
    # The records keep the names they were hashed with, and every chain verifies.
    assert set(LedgerBatch.objects.values_list("device_id", flat=True)) == {*LEGACY_IDS, new_id}
    assert LedgerInterval.objects.filter(device_id=new_id).exists()
    assert [report.broken for report in verify_all()] == [None, None]
    # The new gateway leased its device while it ran, and released it when it stopped.
    lease = Lease.objects.get(name=f"device:{new_id}")
    assert lease.owner == "node-1:1:new"

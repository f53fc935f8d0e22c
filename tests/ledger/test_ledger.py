"""The ledger: spool -> database writer, hash chain, verify_ledger against SQL tampering, adjustments."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from inference.spool import Spool
from ledger.models import (
    LedgerAdjustment,
    LedgerBatch,
    LedgerBatchEnergy,
    LedgerChain,
    LedgerIdle,
    LedgerInterval,
    LedgerRequest,
    LedgerRequestEnergy,
)
from ledger.selectors import request_energy_parts
from ledger.services import ledger_adjust
from ledger.verify import verify_all
from ledger.writer import LedgerWriter, append_records
from tenancy.models import Device
from tenancy.services import ServiceError, api_key_create
from tests.factories import OrganizationFactory
from tests.support.ledger import batch_energy_record, lines_for_batch

pytestmark = pytest.mark.django_db


def drained(spool_dir: Path, chunks: list[list[bytes]]) -> Spool:
    spool = Spool(spool_dir)
    for chunk in chunks:
        spool.append(b"".join(chunk))
    writer = LedgerWriter(spool)
    writer.recover()
    writer.drain_all()
    return spool


def test_writer_moves_spooled_records_into_the_chained_ledger(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, requests=3)
    spool = drained(tmp_path / "spool", [lines])
    assert set(LedgerRequest.objects.values_list("request_id", flat=True)) == set(ids)
    assert (
        LedgerBatch.objects.count() == 1
        and LedgerInterval.objects.count() == 1
        and LedgerIdle.objects.count() == 1
    )
    assert Device.objects.get(device_id="cpu-model").method == "modelled"
    chain = LedgerChain.objects.get(chain_id=spool.chain_id)
    assert chain.head_seq == 1 + 3 + 1 + 1 + 1  # batch, requests, interval, idle, the batch's energy row
    assert [r.broken for r in verify_all()] == [None]
    assert spool.backlog_bytes == 0
    spool.close()


@pytest.mark.parametrize("per_request_energy", [False, True], ids=["batch-rows", "per-request-parts"])
def test_every_interval_conserves_energy_in_the_database(tmp_path: Path, per_request_energy: bool) -> None:
    org = OrganizationFactory()
    chunks = [
        lines_for_batch(
            org.pk,
            requests=n,
            energy_uj=1_234_567 * n,
            idle_uj=1000 * n,
            per_request_energy=per_request_energy,
        )[0]
        for n in (1, 2, 5)
    ]
    drained(tmp_path / "spool", chunks).close()
    by_request = request_energy_parts(dict(LedgerRequest.objects.values_list("request_id", "batch_id")))
    assert len(by_request) == 1 + 2 + 5
    for interval in LedgerInterval.objects.all():
        parts = sum(
            p.energy_uj for ps in by_request.values() for p in ps if p.interval_id == interval.interval_id
        )
        idle = LedgerIdle.objects.get(interval_id=interval.interval_id).energy_uj
        assert parts + idle == interval.energy_uj
    for row in LedgerBatchEnergy.objects.all():
        assert sum(orjson.loads(row.shares_uj)) == row.energy_uj
    assert [r.broken for r in verify_all()] == [None]


def test_restart_replays_only_what_was_not_committed(tmp_path: Path) -> None:
    org = OrganizationFactory()
    first, first_ids = lines_for_batch(org.pk)
    drained(tmp_path / "spool", [first]).close()
    # A new process: more records reach the spool, then it dies before draining them.
    second, second_ids = lines_for_batch(org.pk)
    spool = Spool(tmp_path / "spool")
    spool.append(b"".join(second))
    spool.close()
    # Restart: the writer recovers the checkpoint from the database and replays the rest.
    drained(tmp_path / "spool", []).close()
    ids = list(LedgerRequest.objects.values_list("request_id", flat=True))
    assert sorted(ids) == sorted(first_ids + second_ids)
    assert [r.broken for r in verify_all()] == [None]


def test_a_request_spooled_twice_is_written_once_and_the_chain_stays_intact(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk)
    drained(tmp_path / "spool", [lines]).close()
    drained(tmp_path / "spool", [lines]).close()  # the same records again (a replay gone wrong)
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert LedgerBatchEnergy.objects.count() == 1
    assert [r.broken for r in verify_all()] == [None]


def test_a_per_request_part_spooled_twice_is_written_once(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk, per_request_energy=True)
    drained(tmp_path / "spool", [lines]).close()
    drained(tmp_path / "spool", [lines]).close()
    assert LedgerRequestEnergy.objects.count() == len(ids)
    assert [r.broken for r in verify_all()] == [None]


def _ledger_with_records(tmp_path: Path) -> None:
    org = OrganizationFactory()
    drained(tmp_path / "spool", [lines_for_batch(org.pk)[0], lines_for_batch(org.pk)[0]]).close()
    call_command("verify_ledger", stdout=StringIO())  # intact before tampering


def _broken_message() -> str:
    with pytest.raises(CommandError) as err:
        call_command("verify_ledger", stdout=StringIO())
    return str(err.value)


def test_verify_ledger_detects_a_changed_field(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    target = LedgerRequest.objects.order_by("seq")[1]
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET work_units = work_units + 1 WHERE id = %s", [target.pk])
    message = _broken_message()
    assert f"seq {target.seq}" in message and "do not match its hash" in message


def test_verify_ledger_detects_a_deleted_record(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    target = LedgerRequest.objects.order_by("seq")[2]
    with connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_request WHERE id = %s", [target.pk])
    message = _broken_message()
    assert f"seq {target.seq} is missing" in message


def test_verify_ledger_detects_an_inserted_record(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    source = LedgerRequest.objects.order_by("seq")[1]
    forged_seq = source.seq + 1
    with connection.cursor() as cur:
        # Make room for a forged record by shifting every later record's seq.
        for table in (
            "ledger_batch",
            "ledger_request",
            "ledger_interval",
            "ledger_idle",
            "ledger_batch_energy",
        ):
            cur.execute(f"UPDATE {table} SET seq = seq + 1000000 WHERE seq >= %s", [forged_seq])
            cur.execute(f"UPDATE {table} SET seq = seq - 1000000 + 1 WHERE seq >= 1000000")
    LedgerRequest.objects.create(
        chain=source.chain,
        seq=forged_seq,
        prev_hash=source.hash,
        hash=source.hash,
        request_id="forged",
        model="linear",
        version="1",
        batch_id=source.batch_id,
        device_id="cpu-model",
        received_ns=1,
        started_ns=1,
        finished_ns=1,
        queue_ns=0,
        compute_ns=0,
        work_units=1,
        organization_id=source.organization_id,
    )
    message = _broken_message()
    assert f"seq {forged_seq}" in message


def test_verify_ledger_detects_two_records_swapped(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    a, b = LedgerRequest.objects.order_by("seq")[:2]
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET seq = -1 WHERE id = %s", [a.pk])
        cur.execute("UPDATE ledger_request SET seq = %s WHERE id = %s", [a.seq, b.pk])
        cur.execute("UPDATE ledger_request SET seq = %s WHERE id = %s", [b.seq, a.pk])
    message = _broken_message()
    assert f"seq {a.seq}" in message and "prev_hash" in message


def test_verify_ledger_detects_the_newest_records_deleted(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    last = LedgerBatchEnergy.objects.order_by("-seq").first()
    assert last is not None
    LedgerBatchEnergy.objects.filter(pk=last.pk).delete()
    assert "the newest records were deleted" in _broken_message()


def test_verify_ledger_detects_a_share_moved_between_requests_of_a_batch(tmp_path: Path) -> None:
    _ledger_with_records(tmp_path)
    row = LedgerBatchEnergy.objects.order_by("seq").first()
    assert row is not None
    shares = orjson.loads(row.shares_uj)
    shares[0], shares[1] = shares[0] + 1, shares[1] - 1  # the batch's total is unchanged
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE ledger_batch_energy SET shares_uj = %s WHERE id = %s",
            [orjson.dumps(shares).decode(), row.pk],
        )
    message = _broken_message()
    assert (
        f"seq {row.seq}" in message
        and "batch_energy record" in message
        and "do not match its hash" in message
    )


def test_adjustment_is_an_appended_chained_entry_and_changes_no_record(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, ids = lines_for_batch(org.pk)
    drained(tmp_path / "spool", [lines]).close()
    before = LedgerRequest.objects.get(request_id=ids[0]).hash
    adj = ledger_adjust(
        target_kind="request",
        target_id=ids[0],
        energy_delta_uj=-5,
        reason="meter drift",
        actor="auditor@acme",
    )
    assert LedgerAdjustment.objects.get(pk=adj.pk).reason == "meter drift"
    assert LedgerRequest.objects.get(request_id=ids[0]).hash == before
    assert all(r.broken is None for r in verify_all())
    with pytest.raises(ServiceError, match="needs a reason"):
        ledger_adjust(target_kind="request", target_id=ids[0], energy_delta_uj=1, reason=" ", actor="x")
    with pytest.raises(ServiceError, match="no request 'nope'"):
        ledger_adjust(target_kind="request", target_id="nope", energy_delta_uj=1, reason="r", actor="x")


def test_request_api_returns_final_energy_and_hides_other_organizations(tmp_path: Path) -> None:
    mine, theirs = OrganizationFactory(), OrganizationFactory()
    lines, ids = lines_for_batch(mine.pk, requests=2, energy_uj=2_000_000, idle_uj=0)
    drained(tmp_path / "spool", [lines]).close()
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=mine, scopes='read').raw_key}"
    )
    body = client.get(f"/api/v1/requests/{ids[0]}").json()
    assert body["energy_j"] == 1.0 and body["energy_final"] is True and body["method"] == "modelled"
    other = APIClient()
    other.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=theirs, scopes='read').raw_key}"
    )
    assert other.get(f"/api/v1/requests/{ids[0]}").status_code == 404
    infer_only = APIClient()
    infer_only.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=mine, scopes='infer').raw_key}"
    )
    assert infer_only.get(f"/api/v1/requests/{ids[0]}").status_code == 403


def test_incremental_verification_starts_where_the_last_one_ended(tmp_path: Path) -> None:
    from ledger.services import ledger_verify

    org = OrganizationFactory()
    spool = drained(tmp_path / "spool", [lines_for_batch(org.pk)[0]])
    (first,) = ledger_verify()
    assert (first.from_seq, first.intact, first.full) == (0, True, True)
    lines, _ = lines_for_batch(org.pk)
    spool.append(b"".join(lines))
    writer = LedgerWriter(spool)
    writer.recover()
    writer.drain_all()
    (second,) = ledger_verify()
    assert (second.from_seq, second.seq, second.intact) == (first.seq, first.seq + second.records, True)
    assert second.records == LedgerChain.objects.get().head_seq - first.seq
    spool.close()


def test_incremental_verification_catches_a_changed_new_record_and_full_catches_an_old_one(
    tmp_path: Path,
) -> None:
    from ledger.services import ledger_verify

    org = OrganizationFactory()
    spool = drained(tmp_path / "spool", [lines_for_batch(org.pk)[0]])
    ledger_verify()
    old = LedgerRequest.objects.order_by("seq").first()
    assert old is not None
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET work_units = work_units + 1 WHERE id = %s", [old.pk])
    # The records verified before are not re-hashed by an incremental run...
    (incremental,) = ledger_verify()
    assert incremental.intact and incremental.records == 0
    # ...the daily full run finds the change.
    (full,) = ledger_verify(full=True)
    assert f"seq {old.seq}" in full.problem and "do not match its hash" in full.problem
    spool.close()


def test_the_variant_is_chained_when_set_and_records_without_it_hash_as_before(tmp_path: Path) -> None:
    import hashlib

    import orjson

    org = OrganizationFactory()
    plain, _ = lines_for_batch(org.pk, requests=2)
    served, served_ids = lines_for_batch(org.pk, requests=2)
    with_variant = []
    for line in served:
        record = orjson.loads(line)
        if record["k"] in ("batch", "req"):
            record["variant"] = "int8"
        with_variant.append(orjson.dumps(record) + b"\n")
    spool = drained(tmp_path / "spool", [plain, with_variant])
    assert set(LedgerRequest.objects.filter(variant="int8").values_list("request_id", flat=True)) == set(
        served_ids
    )
    assert LedgerBatch.objects.filter(variant="int8").count() == 1
    assert [r.broken for r in verify_all()] == [None]
    # A request without a variant hashes as the ledger did before the column existed: no value for it.
    first = LedgerRequest.objects.filter(variant="").order_by("seq").first()
    assert first is not None
    old_form = [
        "req",
        first.seq,
        first.request_id,
        first.client_request_id,
        first.organization_id,
        first.api_key_id,
        first.model,
        first.version,
        first.batch_id,
        first.device_id,
        first.received_ns,
        first.started_ns,
        first.finished_ns,
        first.queue_ns,
        first.compute_ns,
        first.work_units,
        first.status,
        first.synthetic,
    ]
    assert first.hash == hashlib.sha256(first.prev_hash.encode() + orjson.dumps(old_form)).hexdigest()
    # Changing the variant that served a request is tampering like any other.
    target = LedgerRequest.objects.get(request_id=served_ids[0])
    with connection.cursor() as cur:
        cur.execute("UPDATE ledger_request SET variant = 'fp32' WHERE id = %s", [target.pk])
    message = _broken_message()
    assert f"seq {target.seq}" in message and "do not match its hash" in message
    spool.close()


def _request(request_id: str, batch_id: str, organization_id: int, units: int) -> dict[str, object]:
    return {
        "k": "req",
        "request_id": request_id,
        "organization_id": organization_id,
        "model": "linear",
        "version": "1",
        "batch_id": batch_id,
        "device_id": "cpu-model",
        "received_ns": 1_800_000_000_000_000_000,
        "started_ns": 1_800_000_000_000_000_000,
        "finished_ns": 1_800_000_000_100_000_000,
        "queue_ns": 0,
        "compute_ns": 100_000_000,
        "work_units": units,
    }


def test_request_energy_adds_its_shares_over_intervals_and_reads_older_per_request_parts() -> None:
    org = OrganizationFactory()
    records: list[dict[str, object]] = [
        _request("new.r1", "new.b1", org.pk, 3),
        _request("new.r2", "new.b1", org.pk, 1),
        _request("old.r1", "old.b1", org.pk, 1),
        # A batch across two metering intervals: a row for each, the second one final.
        batch_energy_record("new.b1", "i1", ["new.r1", "new.r2"], [300, 100], final=False),
        {"k": "energy", "request_id": "old.r1", "interval_id": "i1", "batch_id": "old.b1", "energy_uj": 7},
        batch_energy_record("new.b1", "i2", ["new.r1", "new.r2"], [30, 10]),
        {
            "k": "energy",
            "request_id": "old.r1",
            "interval_id": "i2",
            "batch_id": "old.b1",
            "energy_uj": 5,
            "final": True,
        },
    ]
    append_records("mixed", records)
    assert [r.broken for r in verify_all()] == [None]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read').raw_key}")
    body = client.get("/api/v1/requests/new.r1").json()
    assert body["energy_j"] == 330e-6 and body["energy_final"] is True
    assert [(p["interval_id"], p["energy_j"], p["final"]) for p in body["energy_parts"]] == [
        ("i1", 300e-6, False),
        ("i2", 30e-6, True),
    ]
    old = client.get("/api/v1/requests/old.r1").json()
    assert old["energy_j"] == 12e-6 and old["energy_final"] is True and len(old["energy_parts"]) == 2
    listed = client.get("/api/v1/ledger/requests").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert {r["request_id"]: r["energy_j"] for r in rows} == {
        "new.r1": 330e-6,
        "new.r2": 110e-6,
        "old.r1": 12e-6,
    }


def test_request_energy_is_pending_while_only_an_open_interval_holds_its_batch() -> None:
    org = OrganizationFactory()
    open_part = batch_energy_record("p.b1", "i1", ["p.r1"], [9], final=False)
    append_records("pending", [_request("p.r1", "p.b1", org.pk, 1), open_part])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read').raw_key}")
    body = client.get("/api/v1/requests/p.r1").json()
    assert body["energy_j"] == 9e-6 and body["energy_final"] is False

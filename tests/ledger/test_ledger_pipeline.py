"""The ledger writer's pipelined drain (the next chunk prepared while this one is inserted) and the
compiled record normalizer it relies on. Runs on SQLite and, in the suite's second run, PostgreSQL,
where the chunks go in as binary COPY streams formatted ahead on the helper thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from django.db import connection

from inference.spool import Spool, SpoolPosition
from ledger.models import LedgerBatchEnergy, LedgerChain, LedgerIdle, LedgerRequest
from ledger.records import KINDS, canonical, link_hash, normalize
from ledger.verify import verify_all
from ledger.writer import LedgerWriter, append_records, prepare_chunk
from tests.factories import OrganizationFactory
from tests.support.ledger import batch_energy_record, lines_for_batch

pytestmark = pytest.mark.django_db

SMALL_CHUNK = 1_000  # bytes: a batch of lines_for_batch is over 2 kB, so it spans several chunks


def _spool(path: Path, batches: list[list[bytes]]) -> Spool:
    spool = Spool(path)
    for lines in batches:
        spool.append(b"".join(lines))
    return spool


# On PostgreSQL, with a backlog over ``preparer_min_backlog_bytes`` the chunks ahead are prepared in a
# preparer process (0: always); the thread path is the default below that, and the only one on SQLite.
PREPARERS = [None, 0]


def _uses_preparer(preparer: int | None) -> bool:
    return preparer is not None and connection.vendor == "postgresql"


@pytest.mark.parametrize("preparer", PREPARERS)
def test_pipelined_drain_writes_every_chunk_and_the_chain_verifies(
    tmp_path: Path, preparer: int | None
) -> None:
    org = OrganizationFactory()
    batches = [lines_for_batch(org.pk, requests=4, prefix="p") for _ in range(12)]
    spool = _spool(tmp_path / "spool", [lines for lines, _ in batches])
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=preparer)
    writer.recover()

    consumed = writer.drain_available()

    assert (writer._preparer is not None) == _uses_preparer(preparer)

    assert consumed == sum(len(lines) for lines, _ in batches)
    ids = [rid for _, rids in batches for rid in rids]
    assert sorted(LedgerRequest.objects.values_list("request_id", flat=True)) == sorted(ids)
    assert LedgerBatchEnergy.objects.count() == len(batches)
    chain = LedgerChain.objects.get(chain_id=spool.chain_id)
    assert chain.head_seq == 12 * (1 + 4 + 1 + 1 + 1)
    assert chain.spool_position == writer.position.encode()
    assert [r.broken for r in verify_all()] == [None]  # every hash recomputed from the stored values
    assert spool.backlog_bytes == 0
    writer.stop()
    spool.close()


def test_pipelined_drain_stops_at_its_deadline_and_the_next_call_goes_on(tmp_path: Path) -> None:
    org = OrganizationFactory()
    batches = [lines_for_batch(org.pk, prefix="d")[0] for _ in range(6)]
    spool = _spool(tmp_path / "spool", batches)
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK)
    writer.recover()

    first = writer.drain_available(until=0.0)  # a deadline already past: one chunk, then stop

    assert 0 < first < len(batches[0])
    assert writer.drain_available() == sum(map(len, batches)) - first
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


@pytest.mark.parametrize("preparer", PREPARERS)
def test_a_duplicate_chunk_rechains_the_chunk_prepared_behind_it(
    tmp_path: Path, preparer: int | None
) -> None:
    org = OrganizationFactory()
    old, old_ids = lines_for_batch(org.pk, prefix="dup")
    first = _spool(tmp_path / "first", [old])
    writer = LedgerWriter(first)
    writer.recover()
    writer.drain_all()
    first.close()
    new_batches = [lines_for_batch(org.pk, prefix="after") for _ in range(3)]
    # A second spool replays the old batch first: its commit drops the duplicates, so the chain
    # head is not where the next chunk (prepared meanwhile) was chained from.
    second = _spool(tmp_path / "second", [old, *(lines for lines, _ in new_batches)])
    writer = LedgerWriter(second, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=preparer)
    writer.recover()

    writer.drain_available()

    assert (writer._preparer is not None) == _uses_preparer(preparer)

    new_ids = [rid for _, rids in new_batches for rid in rids]
    assert LedgerRequest.objects.filter(request_id__in=old_ids).count() == len(old_ids)
    assert LedgerRequest.objects.filter(request_id__in=new_ids).count() == len(new_ids)
    chain = LedgerChain.objects.get(chain_id=second.chain_id)
    assert chain.head_seq == 3 * (1 + 3 + 1 + 1 + 1)  # only the new batches were chained
    assert [r.broken for r in verify_all()] == [None, None]
    writer.stop()
    second.close()


def test_a_checkpoint_moved_by_another_writer_stops_the_drain_which_then_goes_on_from_it(
    tmp_path: Path,
) -> None:
    org = OrganizationFactory()
    batches = [lines_for_batch(org.pk, prefix="m") for _ in range(4)]
    spool = _spool(tmp_path / "spool", [lines for lines, _ in batches])
    ours = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK)
    ours.recover()
    other = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK)
    other.recover()
    theirs = other.drain_once()
    assert theirs > 0

    assert ours.drain_available() == 0  # refused: the checkpoint is past where it read
    assert ours.position == other.position
    drained = ours.drain_available()  # from the moved checkpoint, chaining from the real head

    assert drained == sum(len(lines) for lines, _ in batches) - theirs
    ids = [rid for _, rids in batches for rid in rids]
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert [r.broken for r in verify_all()] == [None]
    ours.stop()
    other.stop()
    spool.close()


def test_a_chunk_prepared_ahead_holds_the_rows_and_hashes_of_link_hash(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, _ = lines_for_batch(org.pk, prefix="h")
    copy_cursor = None
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        copy_cursor = connection.connection.cursor()

    chunk = prepare_chunk(lines, SpoolPosition.start(), SpoolPosition(0, 1), (7, 40, "f" * 64), copy_cursor)

    records = [orjson.loads(line) for line in lines]
    assert chunk.devices == [r for r in records if r["k"] == "device"]
    prev, seq = "f" * 64, 40
    assert chunk.rows is not None
    flat = sorted((row for rows in chunk.rows.values() for row in rows), key=lambda row: row[1])
    chained = [r for r in records if r["k"] != "device"]
    for rec, row in zip(chained, flat, strict=True):
        seq += 1
        values = normalize(KINDS[rec["k"]], rec)
        digest = link_hash(prev, rec["k"], seq, values)
        # After the chain columns, the row's period (placement, not hashed): lines_for_batch's are in January 2027.
        assert row == (7, seq, prev, digest, 202701, *values)
        prev = digest
    assert (chunk.end_seq, chunk.end_hash) == (seq, prev)
    if copy_cursor is not None:
        assert chunk.payloads is not None and set(chunk.payloads) == set(chunk.rows)
        assert all(
            p.startswith(b"PGCOPY\n\xff\r\n\x00") and p.endswith(b"\xff\xff") for p in chunk.payloads.values()
        )


def test_normalize_fills_defaults_and_floats_and_names_a_missing_field() -> None:
    req = {
        "k": "req",
        "request_id": "n.1",
        "model": "linear",
        "version": "1",
        "batch_id": "n.b",
        "device_id": "cpu-model",
        "received_ns": 1,
        "started_ns": 2,
        "finished_ns": 3,
        "queue_ns": 1,
        "compute_ns": 1,
        "work_units": 4,
    }
    values = dict(zip(KINDS["req"].fields, normalize(KINDS["req"], req), strict=True))
    # Fields with a default may be absent (older writers): the column's default, None for a key.
    assert values["client_request_id"] == "" and values["status"] == "ok" and values["variant"] == ""
    assert values["organization_id"] is None and values["api_key_id"] is None
    assert values["synthetic"] is False
    interval = {
        "interval_id": "n.i",
        "device_id": "cpu-model",
        "method": "modelled",
        "relative_uncertainty": 0,
        "t0_ns": 0,
        "t1_ns": 1,
        "counter_start_j": 2,
        "counter_end_j": 3,
        "energy_uj": 1,
        "idle_uj": 0,
        "busy_ns": 1,
        "idle_ns": 0,
    }
    got = normalize(KINDS["interval"], interval)
    assert [type(v) for v in got[3:4] + got[6:8]] == [float, float, float]  # JSON 2 is stored as 2.0
    del req["work_units"]
    with pytest.raises(ValueError, match="req record lacks 'work_units'"):
        normalize(KINDS["req"], req)


def test_canonical_leaves_out_only_an_empty_optional_tail() -> None:
    values = normalize(
        KINDS["batch"],
        {
            "batch_id": "c.b",
            "model": "m",
            "version": "1",
            "device_id": "d",
            "instance": 0,
            "start_ns": 1,
            "end_ns": 2,
            "requests": 1,
            "rows": 1,
        },
    )
    assert canonical("batch", 3, values) == b'["batch",3,"c.b","m","1","d",0,1,2,1,1,"ok"]'
    assert canonical("batch", 3, (*values[:-1], "int8")).endswith(b',"ok","int8"]')


_IDLE = {
    "k": "idle",
    "interval_id": "c.i1",
    "device_id": "d",
    "t0_ns": 0,
    "t1_ns": 10,
    "energy_uj": 7,
    "idle_ns": 9,
    "idle_power_w": 0.5,
}


def test_an_idle_line_without_a_carried_balance_hashes_as_idle_lines_did_before_it_existed() -> None:
    values = normalize(KINDS["idle"], _IDLE)
    assert values[-1] == 0
    assert canonical("idle", 4, values) == b'["idle",4,"c.i1","d",0,10,7,9,0.5]'
    carried = normalize(KINDS["idle"], {**_IDLE, "owed_in_uj": -3})
    assert canonical("idle", 4, carried) == b'["idle",4,"c.i1","d",0,10,7,9,0.5,-3]'


def test_an_idle_line_with_a_carried_balance_is_stored_and_verifies() -> None:
    append_records(
        "idle", [{**_IDLE, "owed_in_uj": 2_500}, {**_IDLE, "interval_id": "c.i2", "owed_in_uj": 0}]
    )
    assert sorted(LedgerIdle.objects.values_list("interval_id", "owed_in_uj")) == [
        ("c.i1", 2_500),
        ("c.i2", 0),
    ]
    assert [r.broken for r in verify_all()] == [None]
    LedgerIdle.objects.filter(interval_id="c.i1").update(owed_in_uj=0)  # tampered: the chain says so
    assert [r.broken for r in verify_all()] != [None]


def test_a_preparer_process_that_dies_is_replaced_by_preparing_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the preparer process formats PostgreSQL COPY streams")
    org = OrganizationFactory()
    batches = [lines_for_batch(org.pk, requests=4, prefix="k") for _ in range(8)]
    spool = _spool(tmp_path / "spool", [lines for lines, _ in batches])
    writer = LedgerWriter(spool, max_chunk_bytes=SMALL_CHUNK, preparer_min_backlog_bytes=0)
    writer.recover()
    first = writer.drain_available(until=0.0)  # starts the preparer; one chunk, then stops
    assert writer._preparer is not None
    killed = writer._preparer.pid
    os.kill(killed, signal.SIGKILL)  # as the kernel's OOM killer would

    rest = writer.drain_available()

    assert f"the preparer process {killed} is gone" in caplog.text
    assert first + rest == sum(len(lines) for lines, _ in batches)
    ids = [rid for _, rids in batches for rid in rids]
    assert LedgerRequest.objects.filter(request_id__in=ids).count() == len(ids)
    assert [r.broken for r in verify_all()] == [None]
    writer.stop()
    spool.close()


PARENT = """
import sys, time
from ledger.preparer import PreparerProcess

preparer = PreparerProcess(sys.argv[1], None)
print(preparer.pid, flush=True)
time.sleep(120)
"""


def test_a_preparer_process_leaves_when_its_writer_is_killed(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the preparer process formats PostgreSQL COPY streams")
    connection.ensure_connection()
    script = tmp_path / "writer.py"
    script.write_text(PARENT)
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, str(script), connection.connection.info.dsn],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no chance to stop its pool
    parent.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


_SPLIT = batch_energy_record("s.b1", "s.i1", ["s.r1", "s.r2"], [7, 3])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shares_uj": [7, 4]}, "the shares add up to 11 µJ, not its energy_uj 10"),
        ({"shares_uj": [10]}, "2 request ids but 1 shares"),
        ({"shares_uj": [11, -1]}, "shares_uj must be a list of non-negative integers"),
        ({"shares_uj": [7.5, 2.5]}, "shares_uj must be a list of non-negative integers"),
        ({"request_ids": ["s.r1", ""]}, "request_ids must be a list of request ids"),
        ({"request_ids": "not json"}, "not a JSON array"),
        ({"request_ids": ["s.r1", "s.r1"]}, "a request id appears twice"),
    ],
    ids=["sum", "lengths", "negative", "fractional", "empty-id", "not-json", "twice"],
)
def test_a_batch_energy_record_that_does_not_split_its_energy_exactly_is_refused_by_name(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=r"batch_energy record of batch 's\.b1'") as refused:
        normalize(KINDS["batch_energy"], {**_SPLIT, **change})
    assert message in str(refused.value)
    before = LedgerChain.objects.count()
    with pytest.raises(ValueError, match="batch_energy record of batch"):
        append_records("refused", [{**_SPLIT, **change}])
    assert LedgerBatchEnergy.objects.count() == 0 and LedgerChain.objects.count() == before


def test_a_batch_energy_record_stores_its_arrays_as_compact_json_and_verifies() -> None:
    append_records("split", [_SPLIT])
    row = LedgerBatchEnergy.objects.get()
    assert (row.request_ids, row.shares_uj) == ('["s.r1","s.r2"]', "[7,3]")
    assert [r.broken for r in verify_all()] == [None]


# The writer thread commits on its own connection, outside the test's transaction: without a flush at the end
# its device, chain and requests would stay in the database for the tests after this one.
@pytest.mark.django_db(transaction=True)
def test_stopping_the_writer_leaves_the_callers_database_connection_open(tmp_path: Path) -> None:
    org = OrganizationFactory()
    lines, _ = lines_for_batch(org.pk, requests=2, prefix="s")
    spool = _spool(tmp_path / "spool", [lines])
    writer = LedgerWriter(spool, interval_s=0.05)
    writer.recover()
    connection.ensure_connection()
    callers = connection.connection
    writer.start()
    writer.stop(timeout_s=5)

    # The writer thread closed its own connection on the way out, not this thread's (Django's connections
    # are per thread), so the caller's transaction and queries go on.
    assert connection.connection is callers
    assert LedgerChain.objects.filter(chain_id=spool.chain_id).exists()
    spool.close()

"""The ledger's durability spool, on real files in a temporary directory (no Django, no database).

The drainer's database checkpoint is played by a plain variable holding a SpoolPosition.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inference.spool import Spool, SpoolFull, SpoolLocked, SpoolPosition

REPO = Path(__file__).resolve().parents[2]


def drain(spool: Spool, position: SpoolPosition | None = None, max_bytes: int = 8 << 20):
    """Read until nothing more comes back; returns (records, position reached)."""
    position = SpoolPosition.start() if position is None else position
    records: list[bytes] = []
    while True:
        batch, position = spool.read(position, max_bytes)
        if not batch:
            return records, position
        records.extend(batch)


def numbered(n: int, start: int = 0, width: int = 20) -> list[bytes]:
    return [f"record-{i:06d}".ljust(width, ".").encode() for i in range(start, start + n)]


def test_append_then_read_returns_records_in_order(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append(b"one\n")
        spool.append(b"two\nthree\n")  # several records in one append
        records, position = spool.read(SpoolPosition.start())
        assert records == [b"one", b"two", b"three"]
        assert spool.read(position) == ([], position)
        spool.append(b"four\n")
        assert spool.read(position)[0] == [b"four"]


def test_read_respects_max_bytes_and_resumes_from_returned_position(tmp_path: Path) -> None:
    expected = numbered(100)  # 21 bytes each with the newline
    with Spool(tmp_path) as spool:
        for record in expected:
            spool.append(record + b"\n")
        position = SpoolPosition.start()
        seen: list[bytes] = []
        while True:
            batch, position = spool.read(position, max_bytes=105)
            if not batch:
                break
            assert len(batch) <= 5
            seen.extend(batch)
        assert seen == expected


def test_record_longer_than_max_bytes_is_still_returned_whole(tmp_path: Path) -> None:
    big = b"x" * 10_000
    with Spool(tmp_path) as spool:
        spool.append(big + b"\nsmall\n")
        records, position = spool.read(SpoolPosition.start(), max_bytes=100)
        assert records == [big]
        assert spool.read(position, max_bytes=100)[0] == [b"small"]


def test_positions_encode_decode_and_order() -> None:
    position = SpoolPosition(42, 1234)
    assert position.encode() == "42:1234"
    assert SpoolPosition.decode("42:1234") == position
    assert SpoolPosition.decode(SpoolPosition.start().encode()) == SpoolPosition(0, 0)
    assert SpoolPosition.start() < SpoolPosition(1, 0) < SpoolPosition(1, 5) < SpoolPosition(2, 0)
    assert max(SpoolPosition(3, 9), SpoolPosition(4, 0)) == SpoolPosition(4, 0)


@pytest.mark.parametrize(
    "text", ["", "42", "42:", ":7", "a:b", "1:2:3", "-1:2", " 1:2", "1:2\n", "1.0:2", "\u0661:\u0662"]
)
def test_decode_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        SpoolPosition.decode(text)


@pytest.mark.parametrize("data", [b"no newline", b"", b"one\ntwo"])
def test_append_without_trailing_newline_is_rejected(tmp_path: Path, data: bytes) -> None:
    with Spool(tmp_path) as spool:
        with pytest.raises(ValueError):
            spool.append(data)
        assert spool.backlog_bytes == 0
        assert all(path.stat().st_size == 0 for path in spool.segments())


def test_rotates_at_segment_bytes_and_read_crosses_segments(tmp_path: Path) -> None:
    expected = numbered(10)  # 21 bytes each: three fit in 64
    with Spool(tmp_path, segment_bytes=64) as spool:
        for record in expected:
            spool.append(record + b"\n")
        sizes = [path.stat().st_size for path in spool.segments()]
        assert sizes == [63, 63, 63, 21]
        assert spool.segments()[0].name == "000000000001.spool"
        assert drain(spool)[0] == expected
        assert drain(spool, max_bytes=30)[0] == expected


def test_one_append_is_never_split_across_segments(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64) as spool:
        spool.append(b"a" * 40 + b"\n")
        spool.append(b"b\n" * 50)  # larger than a segment on its own
        spool.append(b"c\n")
        assert [path.stat().st_size for path in spool.segments()] == [41, 100, 2]


def test_acknowledge_deletes_wholly_drained_segments_but_never_the_current_one(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64) as spool:
        for record in numbered(10):
            spool.append(record + b"\n")
        first, second, third, current = spool.segments()
        records, position = spool.read(SpoolPosition.start(), max_bytes=21 * 4)
        assert len(records) == 4  # the whole first segment and one record of the second
        spool.acknowledge(position)
        assert not first.exists()
        assert spool.segments() == [second, third, current]

        records, position = drain(spool, position)
        assert len(records) == 6
        spool.acknowledge(position)
        assert spool.segments() == [current]
        assert current.exists()
        assert spool.backlog_bytes == 0
        # An older position acknowledged late changes nothing.
        spool.acknowledge(SpoolPosition.start())
        assert spool.segments() == [current]
        assert spool.backlog_bytes == 0


def test_backlog_goes_up_with_appends_and_down_with_acknowledge(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64) as spool:
        assert spool.backlog_bytes == 0
        for n, record in enumerate(numbered(7), start=1):
            spool.append(record + b"\n")
            assert spool.backlog_bytes == 21 * n
        _, position = spool.read(SpoolPosition.start(), max_bytes=21 * 2)
        spool.acknowledge(position)
        assert spool.backlog_bytes == 21 * 5
        _, position = drain(spool, position)
        spool.acknowledge(position)
        assert spool.backlog_bytes == 0


def test_spool_full_is_raised_at_the_limit_without_writing(tmp_path: Path) -> None:
    with Spool(tmp_path, max_backlog_bytes=100) as spool:
        spool.append(b"x" * 59 + b"\n")  # 60 bytes
        assert spool.would_accept(40)
        assert not spool.would_accept(41)
        with pytest.raises(SpoolFull, match=r"60 bytes.*\b100 bytes"):
            spool.append(b"y" * 40 + b"\n")  # 41 bytes: one over
        assert spool.backlog_bytes == 60
        assert sum(path.stat().st_size for path in spool.segments()) == 60
        assert drain(spool)[0] == [b"x" * 59]

        spool.append(b"z" * 39 + b"\n")  # exactly at the limit is accepted
        assert spool.backlog_bytes == 100
        assert spool.would_accept(0)
        assert not spool.would_accept(1)
        with pytest.raises(SpoolFull):
            spool.append(b"\n")

        _, position = drain(spool)
        spool.acknowledge(position)
        assert spool.would_accept(100)
        spool.append(b"w" * 99 + b"\n")
        assert spool.backlog_bytes == 100


def test_chain_id_persists_across_instances(tmp_path: Path) -> None:
    with Spool(tmp_path) as first:
        chain_id = first.chain_id
    assert len(chain_id) >= 16
    assert (tmp_path / "chain_id").read_text().strip() == chain_id
    with Spool(tmp_path) as second:
        assert second.chain_id == chain_id
    with Spool(tmp_path / "elsewhere") as other:
        assert other.chain_id != chain_id


def test_second_instance_starts_a_new_segment(tmp_path: Path) -> None:
    with Spool(tmp_path) as first:
        first.append(b"from the first process\n")
        (earlier,) = first.segments()
    with Spool(tmp_path) as second:
        segments = second.segments()
        assert segments[0] == earlier
        assert len(segments) == 2
        second.append(b"from the second\n")
        assert earlier.read_bytes() == b"from the first process\n"
        assert segments[1].read_bytes() == b"from the second\n"
        assert drain(second)[0] == [b"from the first process", b"from the second"]


def test_second_open_of_the_same_directory_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(SpoolLocked):
        Spool(tmp_path)
    Spool(tmp_path).close()  # free again once closed


def test_recover_computes_backlog_from_disk_and_replays_after_the_checkpoint(tmp_path: Path) -> None:
    expected = numbered(10)
    with Spool(tmp_path, segment_bytes=64) as first:
        for record in expected:
            first.append(record + b"\n")
        drained, checkpoint = first.read(SpoolPosition.start(), max_bytes=21 * 5)
        assert drained == expected[:5]
        # The process dies here: the database has the checkpoint, the spool was never acked.

    with Spool(tmp_path, segment_bytes=64) as second:
        assert second.backlog_bytes == 210  # before recover, all of the disk counts
        second.recover(checkpoint)
        assert second.backlog_bytes == 21 * 5
        assert second.segments()[0].name == "000000000002.spool"  # wholly before the checkpoint
        replayed, position = drain(second, checkpoint)
        assert replayed == expected[5:]
        second.acknowledge(position)
        assert second.backlog_bytes == 0
        assert len(second.segments()) == 1  # only the one being written


def test_recover_from_the_start_replays_everything(tmp_path: Path) -> None:
    with Spool(tmp_path) as first:
        first.append(b"a\nb\n")
    with Spool(tmp_path) as second:
        second.recover(SpoolPosition.start())
        assert second.backlog_bytes == 4
        assert drain(second)[0] == [b"a", b"b"]


def test_recover_rejects_a_checkpoint_beyond_the_end_of_the_spool(tmp_path: Path) -> None:
    with Spool(tmp_path) as first:
        first.append(b"a\n")
    with Spool(tmp_path) as second:
        with pytest.raises(ValueError, match="beyond the end"):
            second.recover(SpoolPosition(99, 0))
        with pytest.raises(ValueError, match="beyond the end"):
            second.acknowledge(SpoolPosition(2, 1))


def test_position_in_a_deleted_segment_moves_to_the_next_existing_one(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64) as spool:
        for record in numbered(7):
            spool.append(record + b"\n")
        _, position = spool.read(SpoolPosition.start(), max_bytes=21 * 4)
        spool.acknowledge(position)  # deletes segment 1
        records, _ = drain(spool, SpoolPosition(1, 21))
        assert records == numbered(4, start=3)


def test_torn_tail_of_an_earlier_process_segment_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Spool(tmp_path) as first:
        first.append(b"before\n")
        (torn,) = first.segments()
    with open(torn, "ab") as f:
        f.write(b"half a rec")  # what a kill in the middle of a large write(2) leaves
    with Spool(tmp_path) as second:
        second.append(b"after\n")
        with caplog.at_level(logging.WARNING, logger="inference.spool"):
            records, position = drain(second)
        assert records == [b"before", b"after"]
        assert any(torn.name in r.getMessage() and "10 bytes" in r.getMessage() for r in caplog.records)
        second.acknowledge(position)
        assert not torn.exists()
        assert second.backlog_bytes == 0


def test_segment_of_only_a_torn_tail_is_skipped_and_then_freed(tmp_path: Path) -> None:
    with Spool(tmp_path) as first:
        (torn,) = first.segments()
    torn.write_bytes(b"no newline at all")
    with Spool(tmp_path) as second:
        records, position = second.read(SpoolPosition.start())
        assert records == []
        assert position > SpoolPosition(1, 0)
        second.acknowledge(position)
        assert not torn.exists()


def test_partial_line_in_the_current_segment_waits_until_completed(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.append(b"whole\n")
        (current,) = spool.segments()
        with open(current, "ab") as f:
            f.write(b"in prog")  # a write(2) still being copied looks like this to a reader
        records, position = spool.read(SpoolPosition.start())
        assert records == [b"whole"]
        assert spool.read(position) == ([], position)
        with open(current, "ab") as f:
            f.write(b"ress\n")
        records, position = spool.read(position)
        assert records == [b"in progress"]


def test_concurrent_appends_are_each_read_back_exactly_once(tmp_path: Path) -> None:
    threads, per_thread = 8, 400
    drained: list[bytes] = []
    done = threading.Event()

    def record(t: int, i: int) -> bytes:
        return f"t{t}-{i}-".encode() + bytes([97 + (t + i) % 26]) * (50 + (t * 31 + i * 7) % 300)

    with Spool(tmp_path, segment_bytes=8 << 10) as spool:

        def writer_records(t: int) -> None:
            i = 0
            while i < per_thread:
                if i % 50 == 0:
                    spool.append(b"".join(record(t, j) + b"\n" for j in range(i, i + 5)))
                    i += 5
                else:
                    spool.append(record(t, i) + b"\n")
                    i += 1

        def drainer() -> None:
            # Reads and acknowledges while the writers are still appending and rotating.
            position = SpoolPosition.start()
            while True:
                finished = done.is_set()
                batch, position = spool.read(position, max_bytes=16 << 10)
                drained.extend(batch)
                spool.acknowledge(position)
                if finished and not batch:
                    return

        workers = [threading.Thread(target=writer_records, args=(t,)) for t in range(threads)]
        reader = threading.Thread(target=drainer)
        reader.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        done.set()
        reader.join()
        assert spool.backlog_bytes == 0

    expected = {record(t, i) for t in range(threads) for i in range(per_thread)}
    assert len(drained) == len(expected)
    assert set(drained) == expected
    # Each thread's records stay in its own order.
    for t in range(threads):
        mine = [r for r in drained if r.startswith(f"t{t}-".encode())]
        assert mine == [record(t, i) for i in range(per_thread)]


CHILD = r"""
import sys
from pathlib import Path
from inference.spool import Spool

def payload(i):
    return (b"%d." % i) * (1 + (i * 37) % 4000)

spool = Spool(Path(sys.argv[1]), segment_bytes=256 << 10)
i = 0
while True:
    # Mostly single records, sometimes a batch of 20 in one append (up to ~1.5 MB).
    count = 20 if i % 17 == 0 else 1
    spool.append(b"".join(b"%d %s\n" % (n, payload(n)) for n in range(i, i + count)))
    sys.stdout.write("".join("%d\n" % n for n in range(i, i + count)))
    sys.stdout.flush()
    i += count
"""


def test_every_acknowledged_append_survives_sigkill(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed: list[int] = []
    try:
        while len(printed) < 400:
            line = child.stdout.readline() if child.stdout else b""
            if not line:
                pytest.fail(f"child stopped early: {child.stderr.read().decode() if child.stderr else ''}")
            printed.append(int(line))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    # Lines already in the pipe were also printed after their append returned.
    assert child.stdout is not None
    printed.extend(int(line) for line in child.stdout.read().split())
    child.stdout.close()
    assert child.stderr is not None
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    with Spool(directory) as spool:
        records, _ = drain(spool)
    numbers: list[int] = []
    for record in records:
        head, _, body = record.partition(b" ")
        n = int(head)
        assert body == (b"%d." % n) * (1 + (n * 37) % 4000), f"record {n} is corrupt"
        numbers.append(n)
    assert len(numbers) == len(set(numbers)), "a record came back twice"
    # Appends are sequential, so the spool holds a prefix of the numbers, and every printed one.
    assert numbers == list(range(len(numbers)))
    assert set(printed) <= set(numbers)


def test_closed_spool_refuses_appends(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.close()
    spool.close()
    with pytest.raises(RuntimeError):
        spool.append(b"late\n")

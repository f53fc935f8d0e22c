"""The ledger's local durability spool: an append-only, segmented file store.

The gateway answers an inference request only after its ledger record has been appended
here. A drainer thread reads records in bulk, writes them to the database in one transaction
together with the :class:`SpoolPosition` it reached (the checkpoint lives in the database,
never in the spool), and then calls :meth:`Spool.acknowledge` so that drained segments can
be deleted. At start-up the process reads the checkpoint from the database, calls
:meth:`Spool.recover` and replays with :meth:`Spool.read` from there.

Durability model
----------------
``append`` hands the bytes to the kernel with one ``write(2)`` and returns; the data is then
in the page cache and survives the *process* dying at any moment afterwards, SIGKILL
included. There is no fsync per append by default, so a power loss or kernel crash may lose
the last few seconds of records (or leave a tail of zero bytes): that is out of scope unless
``fsync=True``, which makes every append wait for ``fdatasync`` (milliseconds on most
disks, serialised under the spool's lock).

On-disk layout
--------------
``directory/000000000042.spool`` holds newline-terminated records, in append order. Segment
numbers only grow; each process starts a fresh segment and never appends to one an earlier
process wrote, because a process killed in the middle of a large ``write(2)`` can leave a
partial last line there. Such a torn tail is skipped when read (a warning names the file).
``directory/chain_id`` is a random id created once per directory: a drainer stores it next to
its checkpoint, so a checkpoint from another (or an emptied and recreated) directory is
recognised instead of silently skipping records. ``directory/lock`` carries an exclusive
``flock`` held while a :class:`Spool` is open: two live processes (or two instances in one
process) on one directory would each believe the other's segment is torn or drained.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".spool"
_SEGMENT_NAME = re.compile(r"(\d{12})\.spool", re.ASCII)
_POSITION_TEXT = re.compile(r"(\d+):(\d+)", re.ASCII)


@dataclass(frozen=True, order=True, slots=True)
class SpoolPosition:
    """A point in the spool: everything before it has been read (or skipped as torn).

    Positions compare in spool order. Segment numbers start at 1, so ``start()`` is before
    every record.
    """

    segment: int
    offset: int

    def __post_init__(self) -> None:
        if self.segment < 0 or self.offset < 0:
            raise ValueError(f"negative spool position {self.segment}:{self.offset}")

    @staticmethod
    def start() -> SpoolPosition:
        return SpoolPosition(0, 0)

    def encode(self) -> str:
        return f"{self.segment}:{self.offset}"

    @staticmethod
    def decode(text: str) -> SpoolPosition:
        match = _POSITION_TEXT.fullmatch(text)
        if match is None:
            raise ValueError(f"not a spool position: {text!r}")
        return SpoolPosition(int(match[1]), int(match[2]))


class SpoolFull(Exception):
    """The backlog not yet acknowledged would exceed ``max_backlog_bytes``; nothing was written."""


class SpoolLocked(RuntimeError):
    """Another open :class:`Spool` (in this or another process) holds the directory."""


def segment_name(number: int) -> str:
    return f"{number:012d}{SEGMENT_SUFFIX}"


class Spool:
    """Append-only segmented record store; see the module docstring for the model.

    Thread-safe: any number of threads may ``append``; ``read``/``acknowledge`` are meant for
    one drainer thread but are safe alongside appends. One open instance per directory.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_backlog_bytes: int = 1 << 30,
        segment_bytes: int = 64 << 20,
        fsync: bool = False,
    ) -> None:
        if max_backlog_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_backlog_bytes and segment_bytes must be positive")
        self.directory = Path(directory)
        self.max_backlog_bytes = max_backlog_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._closed = False
        # Sizes of every segment on disk, in bytes. Earlier processes' segments are final, so
        # one stat at start-up is exact; this process's segments grow only through append.
        self._sizes: dict[int, int] = {}
        self._acked = SpoolPosition.start()
        self._warned_torn: set[int] = set()
        self._rotate_next = False

        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SpoolLocked(f"spool directory {self.directory} is already open elsewhere") from None
            self.chain_id = self._load_chain_id()
            for path in self.directory.iterdir():
                match = _SEGMENT_NAME.fullmatch(path.name)
                if match is not None:
                    self._sizes[int(match[1])] = path.stat().st_size
            self._current = max(self._sizes, default=0)
            self._fd = -1
            self._open_new_segment()
        except BaseException:
            os.close(self._lock_fd)
            raise
        # Until recover() says where the database is, everything on disk counts as backlog.
        self._backlog = sum(self._sizes.values())
        # Bytes ever appended, counting what was on disk at start as appended then: minus the backlog, the
        # bytes the database has, on one scale that rotations and deleted segments leave alone (drain_totals).
        self._appended = self._backlog

    # -- set-up -------------------------------------------------------------------------------

    def _load_chain_id(self) -> str:
        path = self.directory / "chain_id"
        try:
            chain_id = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            chain_id = ""
        if chain_id:
            return chain_id
        chain_id = uuid.uuid4().hex
        # Written once per directory, so make it durable and atomic regardless of `fsync`:
        # a torn or vanished chain_id would make every checkpoint look foreign.
        tmp = path.with_name(f"chain_id.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, chain_id.encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._sync_directory()
        return chain_id

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_new_segment(self) -> None:
        """Make a fresh segment current (caller holds the lock, or is __init__)."""
        number = self._current + 1
        fd = os.open(
            self.directory / segment_name(number),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
            0o644,
        )
        if self.fsync:
            # Without this a power loss could lose the file's directory entry, and with it
            # records that were each fdatasync'ed.
            self._sync_directory()
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._current = number
        self._sizes[number] = 0
        self._rotate_next = False

    # -- writing ------------------------------------------------------------------------------

    def append(self, data: bytes) -> None:
        """Append one or more complete records (each ending in ``b"\\n"``) with one write(2).

        Raises :class:`SpoolFull`, having written nothing, when the unacknowledged backlog
        plus ``len(data)`` would exceed ``max_backlog_bytes``.
        """
        if not data.endswith(b"\n"):
            raise ValueError("spool data must be complete records, each ending in a newline")
        size = len(data)
        with self._lock:
            if self._closed:
                raise RuntimeError("spool is closed")
            if self._backlog + size > self.max_backlog_bytes:
                raise SpoolFull(
                    f"spool backlog {self._backlog} bytes + {size} bytes would exceed "
                    f"the limit of {self.max_backlog_bytes} bytes"
                )
            used = self._sizes[self._current]
            if self._rotate_next or (used > 0 and used + size > self.segment_bytes):
                self._open_new_segment()
                used = 0
            written = os.write(self._fd, data)
            if written != size:
                # Regular files only write short on ENOSPC or a fatal signal; finishing the
                # append keeps the segment a sequence of whole records.
                written = self._write_rest(data, written, used)
            if self.fsync:
                os.fdatasync(self._fd)
            self._sizes[self._current] = used + written
            self._backlog += written
            self._appended += written

    def _write_rest(self, data: bytes, written: int, used: int) -> int:
        view = memoryview(data)
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError:
            # Undo the partial record so the next append does not continue it; if even that
            # fails, seal this segment, whose torn tail readers then skip.
            try:
                os.ftruncate(self._fd, used)
            except OSError:
                self._sizes[self._current] = used + written
                self._backlog += written
                self._appended += written
                self._rotate_next = True
            raise
        return written

    def would_accept(self, nbytes: int = 0) -> bool:
        """Whether an append of ``nbytes`` would pass the backlog limit now (advisory, lock-free)."""
        return self._backlog + nbytes <= self.max_backlog_bytes

    @property
    def backlog_bytes(self) -> int:
        """Bytes on disk after the acknowledged position: this process's appends, plus what was
        there at start-up (all of it until :meth:`recover` names the checkpoint)."""
        return self._backlog

    def drain_totals(self) -> tuple[int, int]:
        """(bytes appended so far, backlog), consistent with each other: the bytes acknowledged are their
        difference. The spool's end and its acknowledged position on one scale, for measuring how long the
        oldest record not yet in the database has waited (``inference.metrics.DrainLag``)."""
        with self._lock:
            return self._appended, self._backlog

    # -- reading ------------------------------------------------------------------------------

    def read(self, position: SpoolPosition, max_bytes: int = 8 << 20) -> tuple[list[bytes], SpoolPosition]:
        """Complete records from ``position`` on, across segments, up to about ``max_bytes``.

        Records are returned without their newline. The returned position is where the next
        read continues: just after the last record returned, or past a skipped torn tail, or
        at the start of the next segment once a finished one is exhausted. A single record
        longer than ``max_bytes`` is still returned whole, so a read always makes progress.
        """
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        with self._lock:
            if self._closed:
                raise RuntimeError("spool is closed")
            current = self._current
            numbers = sorted(n for n in self._sizes if n >= position.segment)
        return _read_segments(self.directory, numbers, current, position, max_bytes, self._warned_torn)

    # -- draining -----------------------------------------------------------------------------

    def acknowledge(self, position: SpoolPosition) -> None:
        """Everything before ``position`` is in the database: free what lies wholly before it.

        Deletes every segment before ``position.segment``, and that one too if it is finished
        and fully consumed, but never the segment being written. Positions earlier than one
        already acknowledged change nothing.
        """
        self._advance(position, recovering=False)

    def recover(self, checkpoint: SpoolPosition) -> None:
        """Start-up: the database holds everything before ``checkpoint``.

        Sets the backlog to the bytes on disk after it and deletes segments wholly before it.
        Raises ValueError for a checkpoint beyond the end of the spool (a database from another
        directory, or one emptied since): replaying from it would silently skip records.
        """
        self._advance(checkpoint, recovering=True)

    def _advance(self, position: SpoolPosition, *, recovering: bool) -> None:
        doomed: list[int] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("spool is closed")
            # Counts bytes written to the current segment by hand (tests) or by a failed append.
            self._sizes[self._current] = os.fstat(self._fd).st_size
            if position > SpoolPosition(self._current, self._sizes[self._current]):
                raise ValueError(
                    f"spool position {position.encode()} is beyond the end of the spool in "
                    f"{self.directory} (chain {self.chain_id})"
                )
            if recovering and position.segment in self._sizes:
                size = self._sizes[position.segment]
                if position.offset > size:
                    log.warning(
                        "checkpoint %s points past the end of %s (%d bytes)",
                        position.encode(),
                        segment_name(position.segment),
                        size,
                    )
            if position <= self._acked:
                return
            self._acked = position
            for number, size in sorted(self._sizes.items()):
                if number == self._current or number > position.segment:
                    break
                if number < position.segment or size <= position.offset:
                    doomed.append(number)
            for number in doomed:
                del self._sizes[number]
            self._backlog = sum(
                size if number > position.segment else max(0, size - position.offset)
                for number, size in self._sizes.items()
                if number >= position.segment
            )
        # Unlinking a large file can take milliseconds; appends need not wait for it.
        for number in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / segment_name(number))

    def sync_acknowledged(self) -> None:
        """Apply the position a drainer in another process published (see SpoolReader)."""
        try:
            text = (self.directory / "acknowledged").read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return
        try:
            position = SpoolPosition.decode(text)
            self.acknowledge(position)
        except ValueError as exc:
            log.warning("ignoring the drainer's acknowledged position %r: %s", text, exc)

    # -- inspection and shutdown --------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files on disk, oldest first (the last one is being written)."""
        with self._lock:
            return [self.directory / segment_name(n) for n in sorted(self._sizes)]

    def close(self) -> None:
        """Close the current segment and release the directory; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)
            os.close(self._lock_fd)

    def __enter__(self) -> Spool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _read_segments(
    directory: Path,
    numbers: list[int],
    current: int,
    position: SpoolPosition,
    max_bytes: int,
    warned_torn: set[int],
) -> tuple[list[bytes], SpoolPosition]:
    """The reading shared by the writer's own Spool and a SpoolReader in another process.

    ``current`` is the segment being written: a torn tail there is a write in progress (wait
    for it); anywhere else it is what a killed process left (skip it, once, with a warning).
    """
    records: list[bytes] = []
    taken = 0
    for number in numbers:
        if taken >= max_bytes:
            break
        if number > position.segment:
            # The earlier segment is exhausted (or was deleted once drained).
            position = SpoolPosition(number, 0)
        try:
            with open(directory / segment_name(number), "rb") as f:
                f.seek(position.offset)
                data = f.read(max_bytes - taken)
                if data and not data.endswith(b"\n"):
                    # Finish the record that the budget cut; at EOF this stops at a
                    # torn tail instead.
                    data += f.readline()
        except FileNotFoundError:
            continue  # acknowledged and deleted meanwhile
        cut = data.rfind(b"\n") + 1
        if cut:
            records.extend(data[: cut - 1].split(b"\n"))
            taken += cut
            position = SpoolPosition(number, position.offset + cut)
        if cut < len(data):
            if number == current:
                # A write is in progress (readers can see part of it); it will complete.
                break
            if number not in warned_torn:
                warned_torn.add(number)
                log.warning(
                    "skipping torn tail of %d bytes in spool segment %s",
                    len(data) - cut,
                    directory / segment_name(number),
                )
            position = SpoolPosition(number, position.offset + len(data) - cut)
    return records, position


class SpoolReader:
    """Read-only view of a spool directory, for a drainer in another process than the writer.

    It never takes the writer's lock and never deletes: it reads complete records and
    publishes how far the database has them in the file ``acknowledged``; the writer's Spool
    picks that up (:meth:`Spool.sync_acknowledged`) to free segments and shrink its backlog.
    The highest-numbered segment is taken to be the one being written.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        try:
            self.chain_id = (self.directory / "chain_id").read_text(encoding="ascii").strip()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.directory} is not a spool (no chain_id file)") from None
        self._warned_torn: set[int] = set()
        self._position = SpoolPosition.start()

    def _numbers(self) -> list[int]:
        return sorted(
            int(m[1])
            for m in (_SEGMENT_NAME.fullmatch(p.name) for p in self.directory.iterdir())
            if m is not None
        )

    def read(self, position: SpoolPosition, max_bytes: int = 8 << 20) -> tuple[list[bytes], SpoolPosition]:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        numbers = self._numbers()
        current = numbers[-1] if numbers else 0
        wanted = [n for n in numbers if n >= position.segment]
        return _read_segments(self.directory, wanted, current, position, max_bytes, self._warned_torn)

    def recover(self, checkpoint: SpoolPosition) -> None:
        self._position = checkpoint
        self.acknowledge(checkpoint)

    def acknowledge(self, position: SpoolPosition) -> None:
        """Publish ``position`` atomically (write a temporary file, then rename it)."""
        self._position = position
        tmp = self.directory / f"acknowledged.{os.getpid()}.tmp"
        tmp.write_text(position.encode() + "\n", encoding="ascii")
        os.replace(tmp, self.directory / "acknowledged")

    @property
    def backlog_bytes(self) -> int:
        total = 0
        for number in self._numbers():
            if number < self._position.segment:
                continue
            with contextlib.suppress(FileNotFoundError):
                size = (self.directory / segment_name(number)).stat().st_size
                total += size - self._position.offset if number == self._position.segment else size
        return max(0, total)

    def close(self) -> None:
        pass


__all__ = ["Spool", "SpoolFull", "SpoolLocked", "SpoolPosition", "SpoolReader", "segment_name"]

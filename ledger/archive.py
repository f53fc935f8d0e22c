"""Retention: old ledger records moved out of the database into archive files, with their hashes (issue 24).

A chain's oldest records (a prefix: ``period`` never decreases along a chain) are written to a file, gzip JSON
lines, one record a line in seq order (every kind, with its table and all its columns, ``prev_hash`` and
``hash``), with a manifest beside it: the chain, the seq range, the hash before the first record and the hash of
the last, the count of each kind and the sha256 of the data file. The file is synced and read back (its sha256
checked) before a ``LedgerArchive`` row records it; only then are its rows deleted. The rollups, the chain's head,
the verifications, the chain's organizations and the quarantine's lines stay, so a report of an archived month
is still generated (from the rollups) and the chain still verified: from the newest archive's last hash (its
checkpoint) on, and the archive files offline (``verify_ledger --archive``).

What may be archived is bounded: only what a verification found intact, and only what the limits other apps
name have done with (the rollups: how far they have read each chain; named in ``LEDGER_ARCHIVE_LIMITS``, since
the ledger imports nothing above it).
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.module_loading import import_string

from ledger.models import LedgerArchive, LedgerChain, LedgerVerification, period_of_ns
from ledger.partitions import drop_partition, partitioned, partitions
from ledger.records import GENESIS, KINDS, RecordKind, link_hash
from ledger.services import ledger_verify
from tenancy.leases import LeaseHeld, claim_lease, process_owner, release_lease

ARCHIVE_FORMAT = 1
# One archive run at a time (the daily task and a hand-run command would write the same archive): a lease, long
# enough for a large archive, so that a run killed holding it blocks the next for an hour at most.
ARCHIVE_LEASE = "ledger:archive"
ARCHIVE_LEASE_TTL_S = 3600.0
DELETE_BATCH_SEQ = 50_000  # seq span of one DELETE (short transactions while the drainer writes)

# Other apps' bounds on what may be archived of a chain: the highest seq they are done with. Named in the
# settings (LEDGER_ARCHIVE_LIMITS, dotted paths: the rollups' is carbon.rollups.rolled_up_seq) and loaded by name,
# so that the ledger imports nothing above it; register_archive_limit adds one at run time.
ArchiveLimit = Callable[[LedgerChain], int]
_limits: dict[str, ArchiveLimit] = {}


def _all_limits() -> dict[str, ArchiveLimit]:
    named = {path: import_string(path) for path in getattr(settings, "LEDGER_ARCHIVE_LIMITS", ())}
    return {**named, **_limits}


class ArchiveError(Exception):
    """An archive could not be written or does not verify: nothing was deleted."""


def register_archive_limit(name: str, limit: ArchiveLimit) -> None:
    """Let ``limit(chain)`` (the highest seq its app is done with) bound what the retention archives."""
    _limits[name] = limit


def archive_dir() -> Path:
    return Path(settings.LEDGER_ARCHIVE_DIR)


def checkpoint(chain: LedgerChain) -> tuple[int, str]:
    """Where the chain's records in the database start: the newest archive's (to_seq, last hash), or genesis."""
    last = LedgerArchive.objects.filter(chain=chain).order_by("-to_seq").first()
    return (last.to_seq, last.last_hash) if last is not None else (0, GENESIS)


def period_before(months: int, now: datetime | None = None) -> int:
    """The cutoff (yyyymm) that keeps the current month and the ``months - 1`` before it."""
    now = now or timezone.now()
    index = now.year * 12 + (now.month - 1) - (months - 1)
    return (index // 12) * 100 + index % 12 + 1


def parse_period(text: str) -> int:
    """``YYYY-MM`` as yyyymm."""
    try:
        year, month = (int(part) for part in text.split("-"))
    except ValueError:
        raise ArchiveError(f"a month is YYYY-MM, got {text!r}") from None
    if not (1 <= month <= 12 and 1970 <= year <= 9999):
        raise ArchiveError(f"a month is YYYY-MM, got {text!r}")
    return year * 100 + month


# -- the plan -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainPlan:
    """What the retention archives of one chain: records ``from_seq + 1 .. to_seq`` (nothing when equal), and
    what bounded it."""

    chain: LedgerChain
    from_seq: int
    from_hash: str
    to_seq: int
    before_seq: int  # the last record of a period before the cutoff
    bounds: dict[str, int] = field(default_factory=dict)  # verified, and each registered limit
    reason: str = ""  # why less than the whole prefix, when so


def _last_seq_before(chain: LedgerChain, before_period: int) -> int:
    """The last seq of the chain's records of a period before the cutoff: they are a prefix of the chain."""
    found = 0
    for kind in KINDS.values():
        seq = kind.model._default_manager.filter(chain=chain, period__lt=before_period).aggregate(
            m=Max("seq")
        )["m"]
        found = max(found, seq or 0)
    return found


def _verified_seq(chain: LedgerChain, from_seq: int) -> tuple[int, str]:
    """How far the chain was verified intact; 0 while a problem a verification found stands (no full run from
    genesis or from the checkpoint found it intact since: the incremental runs after it check new records only)."""
    verifications = LedgerVerification.objects.filter(chain=chain).order_by("-finished_at", "-id")
    last_full = verifications.filter(problem="", from_seq__lte=from_seq).first()
    problems = verifications.exclude(problem="")
    if last_full is not None:
        problems = problems.filter(finished_at__gt=last_full.finished_at)
    broken = problems.first()
    if broken is not None:
        return 0, f"its verification found it broken ({broken.problem})"
    newest = verifications.filter(problem="").order_by("-seq").first()
    return (newest.seq, "") if newest is not None else (0, "never verified")


def archive_plan(before_period: int) -> list[ChainPlan]:
    """For each chain, how much of its records of a period before ``before_period`` may be archived now: from its
    checkpoint to the lowest of the prefix's end, its verified seq and every registered limit."""
    plans = []
    for chain in LedgerChain.objects.order_by("pk"):
        from_seq, from_hash = checkpoint(chain)
        before_seq = _last_seq_before(chain, before_period)
        verified, why = _verified_seq(chain, from_seq)
        bounds = {
            "verified": verified,
            **{name: limit(chain) for name, limit in sorted(_all_limits().items())},
        }
        to_seq = max(from_seq, min(before_seq, *bounds.values()))
        reason = ""
        if to_seq < before_seq:
            short = [name for name, seq in bounds.items() if seq < before_seq]
            reason = why or f"held back by {', '.join(short)} (up to seq {min(bounds.values())})"
        plans.append(ChainPlan(chain, from_seq, from_hash, to_seq, before_seq, bounds, reason))
    return plans


# -- the files ----------------------------------------------------------------------------------------------------


def _columns(kind: RecordKind) -> list[str]:
    return [f.attname for f in kind.model._meta.concrete_fields]


def _kind_rows(
    chain: LedgerChain, kind: RecordKind, after: int, upto: int
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    qs = (
        kind.model._default_manager.filter(chain=chain, seq__gt=after, seq__lte=upto)
        .order_by("seq")
        .values(*_columns(kind))
    )
    for row in qs.iterator(chunk_size=20_000):
        yield row["seq"], kind.kind, row


def _records(chain: LedgerChain, after: int, upto: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
    return heapq.merge(*(_kind_rows(chain, k, after, upto) for k in KINDS.values()), key=lambda r: r[0])


class _Links:
    """Checks records in seq order as they stream by: consecutive seqs, each prev_hash, each recomputed hash."""

    def __init__(self, chain_id: str, after_seq: int, after_hash: str) -> None:
        self.chain_id, self.seq, self.hash = chain_id, after_seq, after_hash
        self.counts: dict[str, int] = {}

    def check(self, kind_name: str, row: dict[str, Any]) -> str:
        kind = KINDS[kind_name]
        seq = row["seq"]
        if seq != self.seq + 1:
            return f"chain {self.chain_id}: seq {self.seq + 1} expected, found {seq} ({kind.table})"
        if row["prev_hash"] != self.hash:
            return f"chain {self.chain_id}: seq {seq} ({kind.table}): its prev_hash is not the hash before it"
        if link_hash(self.hash, kind.kind, seq, tuple(row[name] for name in kind.fields)) != row["hash"]:
            return f"chain {self.chain_id}: seq {seq} ({kind.table}): its fields do not match its hash"
        self.seq, self.hash = seq, row["hash"]
        self.counts[kind_name] = self.counts.get(kind_name, 0) + 1
        return ""


class _Hashing:
    """A binary file that hashes what is written through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha = raw, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _names(chain: LedgerChain, from_seq: int, to_seq: int) -> tuple[Path, Path]:
    folder = archive_dir() / chain.chain_id
    stem = f"{chain.chain_id}-{from_seq + 1:012d}-{to_seq:012d}"
    return folder / f"{stem}.jsonl.gz", folder / f"{stem}.manifest.json"


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_archive(plan: ChainPlan, before_period: int) -> dict[str, Any]:
    """Write records ``plan.from_seq + 1 .. plan.to_seq`` of the chain, linked and re-hashed as they are read, to
    a data file and its manifest (both synced, the data read back and its sha256 checked); returns the manifest.
    A broken link raises ``ArchiveError`` and leaves no file."""
    chain = plan.chain
    data_path, manifest_path = _names(chain, plan.from_seq, plan.to_seq)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = data_path.with_name(data_path.name + ".tmp")
    links = _Links(chain.chain_id, plan.from_seq, plan.from_hash)
    first_period = last_period = 0
    try:
        with tmp.open("wb") as raw:
            hashing = _Hashing(raw)
            with gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0) as gz:
                for _seq, kind_name, row in _records(chain, plan.from_seq, plan.to_seq):
                    problem = links.check(kind_name, row)
                    if problem:
                        raise ArchiveError(f"not archived: {problem}")
                    first_period = first_period or row.get("period", 0)
                    last_period = row.get("period", 0)
                    gz.write(orjson.dumps({"table": KINDS[kind_name].table, "kind": kind_name, "row": row}))
                    gz.write(b"\n")
            raw.flush()
            os.fsync(raw.fileno())
        if links.seq != plan.to_seq:
            raise ArchiveError(
                f"not archived: chain {chain.chain_id}: the records end at seq {links.seq}, not {plan.to_seq}"
            )
        written = hashing.sha.hexdigest()
        tmp.replace(data_path)
        _sync_dir(data_path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    if file_sha256(data_path) != written:  # read back: what is on disk is what was written
        data_path.unlink()
        raise ArchiveError(f"not archived: {data_path} reads back with another sha256 than was written")
    manifest = {
        "format": ARCHIVE_FORMAT,
        "chain": chain.chain_id,
        "from_seq": plan.from_seq,
        "to_seq": plan.to_seq,
        "prev_hash": plan.from_hash,
        "last_hash": links.hash,
        "records": sum(links.counts.values()),
        "counts": dict(sorted(links.counts.items())),
        "before_period": before_period,
        "first_period": first_period,
        "last_period": last_period,
        "data_file": data_path.name,
        "sha256": written,
        "created_at": timezone.now().isoformat(),
    }
    _write_synced(manifest_path, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    _sync_dir(manifest_path.parent)
    return manifest


# -- the archive, then the delete ---------------------------------------------------------------------------------


def _delete_rows(archive: LedgerArchive) -> int:
    """Delete the archived records, by chain and seq range in short batches (resumable: a crash leaves the rest
    for the next run, which finds ``rows_deleted_at`` unset)."""
    deleted = 0
    chain = archive.chain
    lo = archive.from_seq
    while lo < archive.to_seq:
        hi = min(archive.to_seq, lo + DELETE_BATCH_SEQ)
        with transaction.atomic():
            for kind in KINDS.values():
                deleted += kind.model._default_manager.filter(chain=chain, seq__gt=lo, seq__lte=hi).delete()[
                    0
                ]
        lo = hi
    archive.rows_deleted_at = timezone.now()
    archive.save(update_fields=["rows_deleted_at"])
    return deleted


@dataclass(frozen=True)
class ArchiveOutcome:
    chain_id: str
    from_seq: int
    to_seq: int
    records: int
    path: str
    deleted: int
    note: str = ""


@dataclass(frozen=True)
class ArchiveRun:
    outcomes: list[ArchiveOutcome]
    dropped_partitions: list[str]


def _drop_archived_partitions(before_period: int) -> list[str]:
    """On PostgreSQL with the ledger partitioned (ledger/partitions.py): drop each monthly partition before the
    cutoff (and before this month) all of whose rows are archived, every chain's (a partition holds every chain's
    records of its month): a DROP instead of deleting its rows one by one. A partition still holding a record
    beyond its chain's archive (a chain held back, by the rollups or a verification) stays; its archived rows
    are deleted by range."""
    if not partitioned():
        return []
    dropped = []
    last = min(before_period, period_of_ns(time.time_ns()))
    for part in partitions():
        if part.period is None or part.period >= last:
            continue
        with connection.cursor() as cur:  # the partition's name comes from the catalog
            cur.execute(
                f"SELECT EXISTS (SELECT 1 FROM {part.name} t WHERE t.seq > COALESCE("
                "(SELECT MAX(a.to_seq) FROM ledger_archive a WHERE a.chain_id = t.chain_id), 0))"
            )
            kept = cur.fetchone()[0]
        if not kept and drop_partition(part.table, part.period):
            dropped.append(part.name)
    return dropped


def ledger_archive(before_period: int, *, dry_run: bool = False) -> ArchiveRun:
    """Archive, chain by chain, the records of a period before ``before_period`` that may go (``archive_plan``),
    then take them out of the database: the monthly partitions wholly archived are dropped (PostgreSQL,
    partitioned), the rest deleted by chain and seq range. The chains are verified first (what is new since the
    last run): only what a verification found intact is archived. Archives whose rows a crash left in the
    database are finished too. A dry run writes nothing and says what would be archived."""
    if dry_run:
        return ArchiveRun([_dry(plan) for plan in archive_plan(before_period)], [])
    try:
        grant = claim_lease(ARCHIVE_LEASE, owner=process_owner(), ttl_s=ARCHIVE_LEASE_TTL_S)
    except LeaseHeld as held:
        raise ArchiveError(f"another archive run is under way ({held})") from None
    try:
        return _archive(before_period)
    finally:
        release_lease(grant)


def _archive(before_period: int) -> ArchiveRun:
    ledger_verify()
    left = set(LedgerArchive.objects.filter(rows_deleted_at=None).values_list("pk", flat=True))
    notes: dict[int, str] = {}
    outcomes = []
    for plan in archive_plan(before_period):
        if plan.to_seq <= plan.from_seq:
            note = plan.reason or "nothing before the cutoff"
            outcomes.append(ArchiveOutcome(plan.chain.chain_id, plan.from_seq, plan.from_seq, 0, "", 0, note))
            continue
        manifest = write_archive(plan, before_period)
        data_path, manifest_path = _names(plan.chain, plan.from_seq, plan.to_seq)
        archive = LedgerArchive.objects.create(
            chain=plan.chain,
            from_seq=plan.from_seq,
            to_seq=plan.to_seq,
            prev_hash=plan.from_hash,
            last_hash=manifest["last_hash"],
            records=manifest["records"],
            counts=manifest["counts"],
            before_period=before_period,
            path=str(data_path),
            manifest_path=str(manifest_path),
            sha256=manifest["sha256"],
            created_at=timezone.now(),
        )
        notes[archive.pk] = plan.reason
    dropped = _drop_archived_partitions(before_period)
    for archive in LedgerArchive.objects.filter(rows_deleted_at=None).order_by("chain", "to_seq"):
        deleted = _delete_rows(archive)
        note = (
            "its rows were left by an earlier run: deleted now" if archive.pk in left else notes[archive.pk]
        )
        outcomes.append(
            ArchiveOutcome(
                archive.chain.chain_id,
                archive.from_seq,
                archive.to_seq,
                archive.records,
                archive.path,
                deleted,
                note,
            )
        )
    return ArchiveRun(outcomes, dropped)


def _dry(plan: ChainPlan) -> ArchiveOutcome:
    if plan.to_seq <= plan.from_seq:
        return ArchiveOutcome(
            plan.chain.chain_id,
            plan.from_seq,
            plan.from_seq,
            0,
            "",
            0,
            plan.reason or "nothing before the cutoff",
        )
    note = "dry run" + (f"; {plan.reason}" if plan.reason else "")
    return ArchiveOutcome(
        plan.chain.chain_id, plan.from_seq, plan.to_seq, plan.to_seq - plan.from_seq, "", 0, note
    )


# -- offline verification of an archive file ----------------------------------------------------------------------


def _manifest_for(path: Path) -> tuple[Path, Path]:
    if path.name.endswith(".manifest.json"):
        return path.with_name(path.name[: -len(".manifest.json")] + ".jsonl.gz"), path
    if path.name.endswith(".jsonl.gz"):
        return path, path.with_name(path.name[: -len(".jsonl.gz")] + ".manifest.json")
    raise ArchiveError(
        f"{path}: not an archive (its data file ends in .jsonl.gz, its manifest in .manifest.json)"
    )


def archive_manifest(path: Path) -> dict[str, Any]:
    """The manifest of an archive, named by its data file or by itself."""
    manifest: dict[str, Any] = orjson.loads(_manifest_for(path)[1].read_bytes())
    return manifest


def verify_archive(path: Path) -> list[str]:
    """Check an archive file offline: its sha256 against its manifest and its ``LedgerArchive`` row, every link
    inside it, its counts, and its two ends: its start links to the previous archive's last hash (or genesis), its
    end to the next archive or to the first record kept in the database (or the chain's head). Returns the
    problems, none when it verifies."""
    data_path, manifest_path = _manifest_for(path)
    if not manifest_path.exists() or not data_path.exists():
        return [f"{data_path if not data_path.exists() else manifest_path}: missing"]
    manifest = orjson.loads(manifest_path.read_bytes())
    problems = []
    sha = file_sha256(data_path)
    if sha != manifest["sha256"]:
        problems.append(f"{data_path.name}: its sha256 {sha} is not the manifest's {manifest['sha256']}")
    chain = LedgerChain.objects.filter(chain_id=manifest["chain"]).first()
    row = (
        None
        if chain is None
        else LedgerArchive.objects.filter(chain=chain, to_seq=manifest["to_seq"]).first()
    )
    if row is None:
        problems.append(
            f"no LedgerArchive row of chain {manifest['chain']} ending at seq {manifest['to_seq']}"
        )
    elif (row.sha256, row.from_seq, row.prev_hash, row.last_hash) != (
        manifest["sha256"],
        manifest["from_seq"],
        manifest["prev_hash"],
        manifest["last_hash"],
    ):
        problems.append("the manifest does not match its LedgerArchive row (sha256, range or hashes)")
    links = _Links(manifest["chain"], manifest["from_seq"], manifest["prev_hash"])
    try:
        with gzip.open(data_path, "rb") as lines:
            for line in lines:
                record = orjson.loads(line)
                problem = links.check(record["kind"], record["row"])
                if problem:
                    problems.append(problem)
                    break
    except (OSError, EOFError, orjson.JSONDecodeError, KeyError) as exc:
        problems.append(f"{data_path.name}: unreadable after seq {links.seq} ({exc})")
    if not problems:
        if links.seq != manifest["to_seq"] or links.hash != manifest["last_hash"]:
            problems.append(
                f"the records end at seq {links.seq}, hash {links.hash}, not as the manifest says"
            )
        if links.counts != manifest["counts"]:
            problems.append(f"counts per kind {links.counts} are not the manifest's {manifest['counts']}")
    if chain is not None:
        problems += _ends(chain, manifest)
    return problems


def _ends(chain: LedgerChain, manifest: dict[str, Any]) -> list[str]:
    problems = []
    from_seq, to_seq = manifest["from_seq"], manifest["to_seq"]
    before = LedgerArchive.objects.filter(chain=chain, to_seq=from_seq).first()
    start = GENESIS if from_seq == 0 else (before.last_hash if before is not None else None)
    if start is None:
        problems.append(f"no archive of chain {chain.chain_id} ends at seq {from_seq}, where this one starts")
    elif start != manifest["prev_hash"]:
        problems.append(f"its first record does not link to the hash before it (seq {from_seq})")
    after = LedgerArchive.objects.filter(chain=chain, from_seq=to_seq).first()
    if after is not None:
        if after.prev_hash != manifest["last_hash"]:
            problems.append(f"the next archive (seq {to_seq + 1}..) does not link to its last hash")
        return problems
    if chain.head_seq == to_seq:
        if chain.head_hash != manifest["last_hash"]:
            problems.append("the chain's head does not match its last hash")
        return problems
    kept = [
        prev
        for kind in KINDS.values()
        for prev in kind.model._default_manager.filter(chain=chain, seq=to_seq + 1).values_list(
            "prev_hash", flat=True
        )
    ]
    if not kept:
        problems.append(f"no record of chain {chain.chain_id} at seq {to_seq + 1}, after it, in the database")
    elif kept != [manifest["last_hash"]]:
        problems.append(f"the first record kept (seq {to_seq + 1}) does not link to its last hash")
    return problems

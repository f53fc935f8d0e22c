"""The ledger: append-only, hash-chained records of requests, batches, metering intervals and idle energy.

The tables keep the names they had in the ``carbonledger`` app (see carbonledger migration 0013)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from django.db import models

from tenancy.models import ApiKey, Organization


class LedgerChain(models.Model):
    """One hash chain per writer (a gateway process's spool). The only mutable ledger row: its head
    and the spool position already written, updated in the same transaction as the records."""

    chain_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    head_seq = models.BigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="0" * 64)
    spool_position = models.CharField(max_length=40, default="0:0")
    # The period (yyyymm) of the head record: the next record is placed at this period or a later one, so that
    # within a chain the period never decreases with seq (docs/ledger-partitioning.md). 0: no record yet.
    head_period = models.IntegerField(default=0)

    class Meta:
        db_table = "carbonledger_ledgerchain"

    def __str__(self) -> str:
        return self.chain_id

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The head's period moves with its seq: a caller saving the head it moved (``update_fields`` naming
        # head_seq) saves the period it moved with it, without having to know about periods.
        fields = kwargs.get("update_fields")
        if fields is not None and "head_seq" in fields and "head_period" not in fields:
            kwargs["update_fields"] = [*fields, "head_period"]
        super().save(*args, **kwargs)


_month: tuple[int, int, int] = (0, 0, 0)  # [start, end) in ns of the month last computed, and its period


def period_of(moment: datetime) -> int:
    """The month of ``moment`` (an aware UTC datetime) as an integer yyyymm (202611)."""
    return moment.year * 100 + moment.month


def period_of_ns(ns: int) -> int:
    """The UTC month of a time in ns since the epoch, as an integer yyyymm (202611)."""
    global _month
    start, end, period = _month
    if start <= ns < end:  # tens of thousands of records a second, nearly all in one month
        return period
    day = datetime.fromtimestamp(ns // 1_000_000_000, UTC)
    _month = month_bounds(period_of(day))
    return _month[2]


def month_bounds(period: int) -> tuple[int, int, int]:
    """[start, end) in ns of the month ``period`` (yyyymm), and the period itself."""
    year, month = divmod(period, 100)
    first = datetime(year, month, 1, tzinfo=UTC)
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return int(first.timestamp()) * 1_000_000_000, int(following.timestamp()) * 1_000_000_000, period


def own_period(value: Any) -> int | None:
    """The period of a record's own time (``period_of_ns``); None when the value is no usable time (the
    database or the normaliser then refuses the record, as they would without periods)."""
    try:
        return period_of_ns(int(value)) if type(value) is int else None
    except (ValueError, OverflowError, OSError):
        return None


class ChainedRecord(models.Model):
    # Unique keys include ``period``: PostgreSQL partitions the big tables by it and requires the partition key in
    # every unique constraint (migration 0004; how exactly-once survives: docs/ledger-partitioning.md).
    # Indexes cost ingest speed (tens of thousands of rows a second): the (chain, seq)
    # unique constraint of each table already serves lookups by chain, so no FK index.
    # No FK constraint either: PostgreSQL would check it row by row during COPY.
    chain = models.ForeignKey(
        LedgerChain, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # Placement, not content (not hashed): the month (yyyymm) this record is stored under, the partition that
    # holds it on PostgreSQL. max(the chain's head period, the month of the record's own time): never less
    # than the period of the record before it in its chain (docs/ledger-partitioning.md).
    period = models.IntegerField()

    # The column holding the record's own time (ns); None for kinds without one (they take the head's period).
    time_field: ClassVar[str | None] = None

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The writer places every record it chains; one saved through the ORM (an adjustment) is placed here,
        # by the same rule, on the chain object the caller holds locked and saves afterwards.
        if self.period is None:
            chain = self.chain
            own = own_period(getattr(self, self.time_field)) if self.time_field else None
            self.period = max(chain.head_period, own or 0)
            chain.head_period = self.period
        super().save(*args, **kwargs)


class LedgerBatch(ChainedRecord):
    batch_id = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    version = models.CharField(max_length=32)
    device_id = models.CharField(max_length=128)
    instance = models.IntegerField(default=0)
    start_ns = models.BigIntegerField()
    end_ns = models.BigIntegerField()
    requests = models.IntegerField()
    rows = models.IntegerField()
    status = models.CharField(max_length=16, default="ok")
    # The model variant that served the batch (e.g. fp32 or int8; empty for a model without variants).
    # Chained only when set, so records written before the column existed still verify.
    variant = models.CharField(max_length=64, default="", blank=True)

    time_field = "start_ns"

    class Meta:
        db_table = "ledger_batch"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq", "period"], name="ledger_batch_chain_seq_period"),
            models.UniqueConstraint(fields=["batch_id", "period"], name="ledger_batch_id_period"),
        ]


class LedgerRequest(ChainedRecord):
    # Unique through Meta.constraints: unique=True would add a second (LIKE) index on PostgreSQL.
    # Collation "C" on PostgreSQL (migration 0010), like the other indexed ledger ids: an AlterField
    # of these columns would reset it, so such a migration must set it again.
    request_id = models.CharField(max_length=64)
    client_request_id = models.CharField(max_length=256, blank=True, default="")
    organization = models.ForeignKey(
        Organization,
        null=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    model = models.CharField(max_length=128)
    version = models.CharField(max_length=32)
    batch_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    received_ns = models.BigIntegerField()
    started_ns = models.BigIntegerField()
    finished_ns = models.BigIntegerField()
    queue_ns = models.BigIntegerField()
    compute_ns = models.BigIntegerField()
    work_units = models.BigIntegerField()
    status = models.CharField(max_length=16, default="ok")
    synthetic = models.BooleanField(default=False)
    # The model variant that served the batch (e.g. fp32 or int8; empty for a model without variants).
    # Chained only when set, so records written before the column existed still verify.
    variant = models.CharField(max_length=64, default="", blank=True)

    time_field = "received_ns"

    class Meta:
        db_table = "ledger_request"
        constraints = [
            models.UniqueConstraint(
                fields=["chain", "seq", "period"], name="ledger_request_chain_seq_period"
            ),
            models.UniqueConstraint(fields=["request_id", "period"], name="ledger_request_id_period"),
        ]
        indexes = [models.Index(fields=["organization", "received_ns"], name="ledger_request_org_time")]


class LedgerInterval(ChainedRecord):
    """Raw counter readings at both ends of one metering interval of one device."""

    interval_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    method = models.CharField(max_length=32)
    relative_uncertainty = models.FloatField()
    t0_ns = models.BigIntegerField()
    t1_ns = models.BigIntegerField()
    counter_start_j = models.FloatField()
    counter_end_j = models.FloatField()
    energy_uj = models.BigIntegerField()
    idle_uj = models.BigIntegerField()
    busy_ns = models.BigIntegerField()
    idle_ns = models.BigIntegerField()

    time_field = "t0_ns"

    class Meta:
        db_table = "ledger_interval"
        constraints = [
            models.UniqueConstraint(
                fields=["chain", "seq", "period"], name="ledger_interval_chain_seq_period"
            ),
            models.UniqueConstraint(fields=["interval_id", "period"], name="ledger_interval_id_period"),
        ]


class LedgerIdle(ChainedRecord):
    """Idle energy of a device in one interval: a ledger line of its own, never dropped."""

    interval_id = models.CharField(max_length=64)
    device_id = models.CharField(max_length=128)
    t0_ns = models.BigIntegerField()
    t1_ns = models.BigIntegerField()
    energy_uj = models.BigIntegerField()
    idle_ns = models.BigIntegerField()
    idle_power_w = models.FloatField()
    owed_in_uj = models.BigIntegerField(
        default=0,
        help_text="idle balance carried in from the device's earlier intervals (negative: charged beyond their "
        "estimates); with batches in the interval, energy_uj = min(interval energy, max(0, "
        "round(idle_power_w x idle_ns / 1000) + owed_in_uj)) in µJ",
    )

    time_field = "t0_ns"

    class Meta:
        db_table = "ledger_idle"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq", "period"], name="ledger_idle_chain_seq_period"),
            models.UniqueConstraint(fields=["interval_id", "period"], name="ledger_idle_interval_id_period"),
        ]


class LedgerRequestEnergy(ChainedRecord):
    """A request's share of one interval's energy (a request spanning intervals has several)."""

    request_id = models.CharField(max_length=64)
    interval_id = models.CharField(max_length=64)
    batch_id = models.CharField(max_length=64)
    energy_uj = models.BigIntegerField()
    final = models.BooleanField(default=False, help_text="the batch is fully allocated with this part")

    class Meta:
        db_table = "ledger_request_energy"
        indexes = [models.Index(fields=["request_id"], name="ledger_energy_request")]
        # No uniqueness on (request, interval, batch): parts reach the database only with the
        # chunk that holds their request's unique id, and that index slowed ingest by a quarter.
        constraints = [
            models.UniqueConstraint(
                fields=["chain", "seq", "period"], name="ledger_request_energy_chain_seq_period"
            )
        ]


class LedgerBatchEnergy(ChainedRecord):
    """A batch's share of one interval's energy and its split over the batch's requests.

    One row per batch and interval rather than one per request (``LedgerRequestEnergy``, which older records
    still use): at the batch sizes the gateway runs under load this writes a sixteenth of the rows
    (bench/ledger_ingest.py). ``request_ids`` and ``shares_uj`` are compact JSON arrays in the batch's order;
    the shares add up to ``energy_uj``. A request's energy is the sum of its shares over the batch's rows.
    """

    batch_id = models.CharField(max_length=64)
    interval_id = models.CharField(max_length=64)
    energy_uj = models.BigIntegerField()
    request_ids = models.TextField()
    shares_uj = models.TextField()
    final = models.BooleanField(default=False, help_text="the batch is fully allocated with this part")

    class Meta:
        db_table = "ledger_batch_energy"
        constraints = [
            models.UniqueConstraint(
                fields=["chain", "seq", "period"], name="ledger_batch_energy_chain_seq_period"
            ),
            models.UniqueConstraint(
                fields=["batch_id", "interval_id", "period"], name="ledger_batch_energy_key_period"
            ),
        ]


class LedgerAdjustment(ChainedRecord):
    """A correction: records are never updated; an adjusting entry says what changes, why and who."""

    target_kind = models.CharField(max_length=32)  # request, interval, idle
    target_id = models.CharField(max_length=64)
    energy_delta_uj = models.BigIntegerField()
    reason = models.TextField()
    actor = models.CharField(max_length=200)
    created_ns = models.BigIntegerField()

    time_field = "created_ns"

    class Meta:
        db_table = "ledger_adjustment"
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="ledger_adjustment_chain_seq")]


class LedgerQuarantineMarker(ChainedRecord):
    """A spool line's place in its chain when the database refused it for its data (``action`` quarantined), and
    what became of it later (retried: the record itself follows this marker in the chain; dismissed: an operator
    gave it up, ``detail`` saying why). Chained like every record, so verification proves no line left the spool
    unaccounted for; the line itself is kept in ``LedgerQuarantine``."""

    QUARANTINED, RETRIED, DISMISSED = "quarantined", "retried", "dismissed"

    action = models.CharField(max_length=16)
    line_sha256 = models.CharField(max_length=64)
    spool_position = models.CharField(max_length=40)
    record_kind = models.CharField(max_length=32, blank=True, default="")  # the line's "k", when it parsed
    record_id = models.CharField(max_length=256, blank=True, default="")  # its id (request_id, batch_id, ...)
    detail = models.TextField(blank=True, default="")
    marker_seq = models.BigIntegerField(
        default=0, help_text="for retried and dismissed: the quarantine marker's seq"
    )
    created_ns = models.BigIntegerField()

    time_field = "created_ns"

    class Meta:
        db_table = "ledger_quarantine_marker"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="ledger_quarantine_marker_chain_seq")
        ]
        indexes = [models.Index(fields=["line_sha256"], name="ledger_quarantine_marker_line")]


class LedgerQuarantine(models.Model):
    """A spool line the database refused for its data, kept whole until an operator retries it (after a fix, e.g.
    a widened column) or dismisses it: ``manage.py ledger_quarantine``. Its marker in the chain is at
    ``marker_seq``; unlike ledger records this row changes (its state)."""

    QUARANTINED, RETRIED, DISMISSED = "quarantined", "retried", "dismissed"
    STATES = (QUARANTINED, RETRIED, DISMISSED)

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="+")
    marker_seq = models.BigIntegerField()
    spool_position = models.CharField(max_length=40)
    line = models.BinaryField()  # the raw spool line, without its newline (it may not even be UTF-8)
    line_sha256 = models.CharField(max_length=64)
    record_kind = models.CharField(max_length=32, blank=True, default="")
    record_id = models.CharField(max_length=256, blank=True, default="")
    error = models.TextField()
    created_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=[(s, s) for s in STATES], default=QUARANTINED)
    attempts = models.IntegerField(default=0, help_text="retries that failed")
    last_error = models.TextField(blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_seq = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the seq of its retried or dismissed marker (a retried record follows it)",
    )
    note = models.TextField(blank=True, default="")

    class Meta:
        db_table = "ledger_quarantine"
        ordering = ["chain", "marker_seq"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "marker_seq"], name="ledger_quarantine_chain_marker")
        ]
        indexes = [models.Index(fields=["state"], name="ledger_quarantine_state")]

    def __str__(self) -> str:
        return f"{self.record_kind or 'line'} {self.record_id} at {self.spool_position} ({self.state})"


class ChainOrganization(models.Model):
    """Which organizations have records in which hash chain (requests they sent, idle lines of sites they
    operate), kept by the rollups as they read the ledger: a report lists and vouches for those chains only."""

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="+")
    # No database constraint, like the ledger's own organization column: the rollups must never fail on it.
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    # The first and last months (yyyymm) of the organization's records in the chain, by the records' own times
    # as the rollups bin them: a report lists the chains holding the records of its period, so its chain list
    # does not grow with every chain the organization ever had. NULL: rolled up before the months were kept
    # (such a chain is listed for every period).
    first_period = models.IntegerField(null=True)
    last_period = models.IntegerField(null=True)

    class Meta:
        db_table = "carbonledger_chainorganization"
        constraints = [
            models.UniqueConstraint(fields=["organization", "chain"], name="chain_organization_unique")
        ]


class LedgerVerification(models.Model):
    """A verification run of one chain: records ``from_seq + 1 .. seq`` re-hashed and linked, starting at the
    hash of an earlier verification (``from_seq`` 0: from genesis, a full verification). ``problem`` names the
    first broken link; empty when intact."""

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="verifications")
    from_seq = models.BigIntegerField()
    seq = models.BigIntegerField()
    hash = models.CharField(max_length=64)
    records = models.BigIntegerField()
    problem = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        db_table = "carbonledger_ledgerverification"
        ordering = ["chain", "-seq", "-id"]

    @property
    def full(self) -> bool:
        return self.from_seq == 0

    @property
    def intact(self) -> bool:
        return not self.problem


class LedgerArchive(models.Model):
    """Records ``from_seq + 1 .. to_seq`` of a chain, moved by the retention policy out of the database into a file
    (gzip JSON lines, every record of every kind in seq order, all columns) with a manifest (``ledger/archive.py``;
    docs/energy-and-ledger.md, "Retention"). Recorded once the file is written, synced and read back; its rows
    are taken out after (``rows_deleted_at``). The chain's verification then starts at the newest archive's
    ``to_seq`` and ``last_hash``, its checkpoint."""

    chain = models.ForeignKey(LedgerChain, on_delete=models.PROTECT, related_name="archives")
    from_seq = models.BigIntegerField()
    to_seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64, help_text="the hash of record from_seq (genesis: 64 zeros)")
    last_hash = models.CharField(max_length=64, help_text="the hash of record to_seq")
    records = models.BigIntegerField()
    counts = models.JSONField(default=dict, help_text="records per kind")
    before_period = models.IntegerField(
        help_text="the cutoff (yyyymm): every record archived is of an earlier period"
    )
    path = models.CharField(max_length=1000, help_text="the data file")
    manifest_path = models.CharField(max_length=1000)
    sha256 = models.CharField(max_length=64, help_text="of the data file")
    created_at = models.DateTimeField()
    rows_deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_archive"
        ordering = ["chain", "to_seq"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "to_seq"], name="ledger_archive_chain_to_seq")
        ]

    def __str__(self) -> str:
        return f"{self.chain_id}: seq {self.from_seq + 1}..{self.to_seq}"

from __future__ import annotations

import factory

from tenancy.models import Organization


class OrganizationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organization

    slug = factory.Sequence(lambda n: f"org-{n}")
    name = factory.LazyAttribute(lambda o: f"Organization {o.slug}")


# -- deferred jobs tests: ledger rows written directly (a chain's hashes are not checked there) ---------


class LedgerChainFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "ledger.LedgerChain"

    chain_id = factory.Sequence(lambda n: f"test-chain-{n}")


class _ChainedRecordFactory(factory.django.DjangoModelFactory):
    """The chain columns every ledger record has (hashes made up: these tests do not verify chains)."""

    class Meta:
        abstract = True

    chain = factory.SubFactory(LedgerChainFactory)
    seq = factory.Sequence(lambda n: n + 1)
    prev_hash = "0" * 64
    hash = factory.Sequence(lambda n: f"{n:064x}")


class LedgerRequestFactory(_ChainedRecordFactory):
    class Meta:
        model = "ledger.LedgerRequest"

    request_id = factory.Sequence(lambda n: f"t.req.{n}")
    model = "linear"
    version = "1"
    batch_id = factory.Sequence(lambda n: f"t.batch.{n}")
    device_id = "cpu-model"
    received_ns = 1_800_000_000_000_000_000
    started_ns = factory.LazyAttribute(lambda o: o.received_ns + 10)
    finished_ns = factory.LazyAttribute(lambda o: o.started_ns + 2_000_000)
    queue_ns = 10
    compute_ns = 2_000_000
    work_units = 256


class LedgerRequestEnergyFactory(_ChainedRecordFactory):
    class Meta:
        model = "ledger.LedgerRequestEnergy"

    request_id = factory.Sequence(lambda n: f"t.req.{n}")
    interval_id = factory.Sequence(lambda n: f"t.interval.{n}")
    batch_id = factory.Sequence(lambda n: f"t.batch.{n}")
    energy_uj = 1_000_000
    final = True


class LedgerBatchEnergyFactory(_ChainedRecordFactory):
    """A batch's row for one interval; ``request_ids`` and ``shares_uj`` are JSON array texts, as stored."""

    class Meta:
        model = "ledger.LedgerBatchEnergy"

    batch_id = factory.Sequence(lambda n: f"t.batch.{n}")
    interval_id = factory.Sequence(lambda n: f"t.interval.{n}")
    request_ids = "[]"
    shares_uj = "[]"
    energy_uj = 0
    final = True

"""Start-up claims that wait for the database: a gateway claims its ledger chain and its devices before it
serves, and a database that is restarting (or, on SQLite, a table locked by another process) is waited for, a
while, instead of failing the start-up at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

T = TypeVar("T")


def call_until_database_answers(call: Callable[[], T], *, what: str, deadline: float) -> T:
    """``call()``, tried again while the database refuses it (:class:`DatabaseError`) until ``deadline`` (of
    ``time.monotonic()``), backing off from 0.5 s to 5 s; the connection is closed before each retry (a broken
    one would fail the next try too). ``what`` completes "cannot ... yet" in the warning of each retry."""
    backoff = 0.5
    while True:
        try:
            return call()
        except DatabaseError as exc:
            if time.monotonic() + backoff > deadline:
                raise
            log.warning("cannot %s yet (%s); retrying in %.1f s", what, exc, backoff)
            connection.close()
            time.sleep(backoff)
            backoff = min(5.0, backoff * 2)

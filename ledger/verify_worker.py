"""The start of a verification worker that is spawned rather than forked (``ledger.verify``): a fresh interpreter
with Django set up on the parent's databases (a test run's test database, not the settings' own).

It imports no model at import time: a spawned process imports this module before Django is set up."""

from __future__ import annotations

import os
from typing import Any

import django
from django.conf import settings


def start(settings_module: str, databases: dict[str, Any]) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    settings.DATABASES = databases
    django.setup()

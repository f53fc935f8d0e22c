"""The OpenAPI schema generator of /api/schema/, the /api/v1/ index and ``manage.py spectacular``: drf-spectacular's
own, building one schema at a time per process.

drf-spectacular keeps generation state in globals: its contrib extensions import their targets on first use
without a lock (a second thread then reads a target another thread has just set to None and fails, logged after
the ModuleNotFoundError of the package this project does not install), a view class's one AutoSchema instance is
pointed at the view being inspected, and the warning counters are a singleton. Django's ASGI handler runs each
request in a thread of its own, so two schema requests at once answered 500 (upstream:
tfranzel/drf-spectacular#1122, #1123, #1368). A build takes a few hundred milliseconds and the schema is fetched
rarely, so waiting for the other build costs little."""

from __future__ import annotations

import threading
from typing import Any

from drf_spectacular import generators
from rest_framework.request import Request

_ONE_BUILD_AT_A_TIME = threading.Lock()


class SchemaGenerator(generators.SchemaGenerator):
    def get_schema(self, request: Request | None = None, public: bool = False) -> dict[str, Any]:
        with _ONE_BUILD_AT_A_TIME:
            return super().get_schema(request=request, public=public)

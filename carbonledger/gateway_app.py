"""Builds the inference gateway from Django settings, with API keys resolved from the database."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from carbonledger import selectors
from inference.gateway import Gateway, Principal
from inference.repository import GatewayOptions


def _principal_for(raw_key: str) -> Principal | None:
    close_old_connections()
    key = selectors.api_key_lookup(raw_key)
    if key is None:
        return None
    return Principal(
        organization_id=key.organization_id,
        organization_slug=key.organization.slug,
        key_id=key.pk,
        scopes=key.scope_set,
    )


# thread_sensitive=False: lookups run in the default thread pool, never on the event loop.
resolve_principal = sync_to_async(_principal_for, thread_sensitive=False)


def gateway_options() -> GatewayOptions:
    return GatewayOptions(
        triton_url=settings.TRITON_URL,
        triton_protocol=settings.TRITON_PROTOCOL,
        remote_timeout_s=settings.TRITON_TIMEOUT_S,
        onnx_threads=settings.GATEWAY_ONNX_THREADS,
        adaptive_delay=settings.GATEWAY_ADAPTIVE_DELAY,
        max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
    )


def build_gateway() -> Gateway:
    return Gateway(
        settings.MODEL_REPOSITORY,
        gateway_options(),
        resolve_principal,
        key_cache_seconds=settings.API_KEY_CACHE_SECONDS,
    )

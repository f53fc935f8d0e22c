"""Who is signing in, and from where: the client address behind trusted proxies, and the login throttle.

django-axes counts failed sign-ins per user name and client address together (AXES_LOCKOUT_PARAMETERS), so
one attacker behind a shared proxy or office address locks only the account attacked, and only from there.
The address is the peer's, unless the peer is one of TRUSTED_PROXIES: then X-Forwarded-For is read from the
right, each hop a trusted proxy added, up to the first address no trusted proxy stands for, which is the
client. What a client writes into the header itself (its left part) is never reached.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]) -> tuple[_Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in trusted)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def client_ip(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or behind TRUSTED_PROXIES the nearest address in X-Forwarded-For
    that no trusted proxy stands for (the farthest proxy's when every hop is one)."""
    remote = request.META.get("REMOTE_ADDR", "")
    trusted = _networks(tuple(settings.TRUSTED_PROXIES))
    current = _address(remote)
    if current is None or not trusted:
        return remote
    hops = [h for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    while any(current in network for network in trusted) and hops:
        previous = _address(hops.pop())
        if previous is None:  # a malformed hop: the chain of trust ends at the proxy before it
            break
        current = previous
    return str(current)


class LoginThrottle(AxesStandaloneBackend):
    """Axes's lock-out check for sign-ins through a form (the login page, the admin). A call with no
    request is code, not a client (the test client's login(), a shell): there is no address to throttle,
    and ModelBackend alone decides."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)

"""The `Host` names a server without an API key answers: an ASGI layer against DNS rebinding.

A web page can point a name it owns at 127.0.0.1 once the visitor's browser has loaded it, and then
send that browser's requests to a server on the visitor's machine; the browser names the page's own
site in `Host`. A server with an API key is safe from this (the page lacks the key). One without
answers only its own names (localhost and *.localhost, the address it is bound to, the machine's
host name) and addresses written as numbers, which no rebinding can send; any other `Host` is 400.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from fastapi.responses import JSONResponse

Scope = dict[str, Any]


class HostCheck:
    """ASGI middleware: a request whose `Host` is a name other than the server's own gets 400 (see the module)."""

    def __init__(self, app: Any, bound: str) -> None:
        self.app = app
        self.names = frozenset({"localhost", host_name(bound), socket.gethostname().lower()})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        header = dict(scope["headers"]).get(b"host") if scope["type"] == "http" else None
        name = host_name(header.decode("latin-1")) if header is not None else None
        if name is None or self.admits(name):
            await self.app(scope, receive, send)
            return
        reason = (
            f"Host {name[:60]!r} is not a name of this server, which has no API key and answers only its own names "
            "(localhost) and IP addresses: use one, or start it with an API key (MTKIT_API_KEY)"
        )
        await JSONResponse({"detail": reason}, status_code=400)(scope, receive, send)

    def admits(self, name: str) -> bool:
        return name in self.names or name.endswith(".localhost") or _is_address(name)


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port, brackets, trailing dot or capitals: `[::1]:8000` -> `::1`."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 address
        return header[1:].partition("]")[0]
    name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True

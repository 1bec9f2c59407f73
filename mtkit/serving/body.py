"""Request bodies refused before they are read: an ASGI layer in front of the application.

A body whose `Content-Length` is over the limit is answered 413 at once, without reading a byte of
it; a body without one (chunked) is counted while it streams in and refused at the chunk that passes
the limit. Until then uvicorn holds at most its read buffer of a body, so many concurrent large
bodies cost the server nothing; read whole (as FastAPI does before validating), each would stay in
the server's memory after its 413 (docs/serving.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyLimit:
    """ASGI middleware: bodies of more than `limit` bytes get 413 before they are read (see the module)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await JSONResponse({"detail": self._reason(f"{int(declared)} bytes")}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # FastAPI answers the exception as it answers any HTTPException
                raise HTTPException(413, self._reason(f"more than {self.limit} bytes"))
            return message

        await self.app(scope, counted, send)

    def _reason(self, size: str) -> str:
        return f"a request body of {size}; the limit is {self.limit} bytes (see --max-chars): send less at once"

"""The waker's door: HTTP/1.1 on a unix stream socket, for nginx's `auth_request` subrequest.

Routes (one request per connection, `Connection: close`; nginx's subrequest has no body):

- `GET /hold`   hold this request until the instance is awake (`hold.Hold`): 204 when nginx may
                pass it to vLLM, 403 when it must refuse it (nginx answers the client 503 +
                Retry-After). Headers: `X-Warmctl-Wake` (awake: it was not asleep; woke, failed,
                timeout, refused) and `X-Warmctl-Held` (seconds held).
- `GET /state`  what the waker sees, as JSON (for a person with `curl --unix-socket`, and tests).

Nothing else: 404. The socket is only in the gate folder, mode 0660 with nginx's group (or 0600
without one, `service.py`): nginx's workers and the service user connect, nobody else. It
proxies nothing, so no vLLM route is reachable through it. Its connections are bounded
(`connections.py`): one that sends no whole head within HEAD_TIMEOUT_S is closed, and past the
bound the oldest idle one makes room.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from warmctl.waker.connections import Conn, Connections
from warmctl.waker.hold import PASS, Hold

HEAD_LIMIT = 16384  # nginx's subrequest head is a few hundred bytes
# nginx writes its head as it connects: a connection silent this long is idle, and closed
HEAD_TIMEOUT_S = 5.0
_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
}


def response(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if status != 204:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Completes when the peer closed the connection (nginx gave up on the client)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(1024):
            pass


def handler(
    hold: Hold, state: Callable[[], dict[str, Any]], connections: Connections
) -> Callable[[Conn], Coroutine[Any, Any, None]]:
    """What the door (`connections.Door`) runs for each connection it admitted."""

    async def serve(conn: Conn) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn.sock, limit=HEAD_LIMIT)
        except OSError:
            return
        conn.writer = writer
        if not conn.evicted:
            await respond(conn, reader, writer)

    async def respond(
        conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ConnectionError,
        ):
            return  # idle, cut or too long: the door closes it
        if not connections.started(conn):
            return  # closed for room meanwhile
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        path = parts[1].split("?", 1)[0] if len(parts) == 3 else ""
        if not path.startswith("/") or not parts[2].startswith("HTTP/1."):
            answer = response(400)
        elif parts[0] not in ("GET", "HEAD"):
            answer = response(405, {"Allow": "GET"})
        elif path == "/hold":
            outcome, held = await hold.hold(gone=lambda: _until_closed(reader))
            headers = {"X-Warmctl-Wake": outcome, "X-Warmctl-Held": f"{held:.3f}"}
            answer = response(204 if outcome in PASS else 403, headers)
        elif path == "/state":
            body = json.dumps(state(), sort_keys=True).encode() + b"\n"
            answer = response(200, {"Content-Type": "application/json"}, body)
        else:
            answer = response(404)
        with contextlib.suppress(ConnectionError):
            writer.write(answer)
            await writer.drain()
        writer.close()

    return serve

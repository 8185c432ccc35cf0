"""HTTP/1.1 over a connected socket, in a few lines of the standard library: one request, the answer's status and
headers, its body (by Content-Length, chunked, or to the end of the connection) and, for a hijacked connection
(the Engine's attach), the socket and what was already read of the stream.

`hostagent run` through the resident agent talks to the agent and to the Docker Engine with it: http.client
costs ~15 ms to import (ssl, email), the docker SDK with requests 60 to 90 ms, on a 2-core machine.
"""

from __future__ import annotations

import io
import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Mapping
    from typing import Any


def quote(text: str, safe: str = "") -> str:
    """Percent-encode for a URL (what urllib.parse.quote does, without its import)."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c in "-_.~" + safe) else "".join(f"%{b:02X}" for b in c.encode())
        for c in text
    )


def target(path: str, params: Mapping[str, Any] | None = None) -> str:
    """The request target: the path, and the query of the parameters that are not None."""
    query = "&".join(f"{quote(k)}={quote(str(v))}" for k, v in (params or {}).items() if v is not None)
    return quote(path, "/:") + ("?" + query if query else "")


class Answer:
    """An answer's status, headers (lower-case names) and the reader its body comes from."""

    def __init__(
        self, sock: socket.socket, reader: io.BufferedReader[Any], status: int, headers: dict[str, str]
    ) -> None:
        self.sock = sock
        self.reader = reader
        self.status = status
        self.headers = headers

    def body(self) -> bytes:
        """The whole body, then the connection closed (a malformed one is a ConnectionError, as a cut one is)."""
        try:
            return self._body()
        except ValueError as err:
            raise ConnectionError(f"a malformed HTTP answer ({err})") from None
        finally:
            self.close()

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.reader.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    break
                parts.append(self.reader.read(size))
                self.reader.readline()
            return b"".join(parts)
        length = self.headers.get("content-length")
        if length is not None:
            return self.reader.read(int(length))
        if self.status in (204, 304):
            return b""
        return self.reader.read()

    def json(self) -> Any:
        raw = self.body()
        return json.loads(raw) if raw.strip() else None

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def exchange(
    sock: socket.socket,
    method: str,
    path: str,
    body: Any = None,
    host: str = "docker",
    headers: Mapping[str, str] | None = None,
    interim: Callable[[int], None] | None = None,
) -> Answer:
    """Send one request on `sock` (JSON `body` when not None) and read the answer's head. The socket belongs to the
    answer from then on (`body()` or `close()` closes it); an OSError closes it here. An interim answer (1xx but
    101, the Engine's upgrade) is passed to `interim` and the final one read after it."""
    try:
        raw = isinstance(body, bytes)  # an archive (an image's import); anything else is sent as JSON
        data = body if raw else b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "User-Agent: gpupin-hostagent"]
        if body is not None:
            kind = "application/x-tar" if raw else "application/json"
            head += [f"Content-Type: {kind}", f"Content-Length: {len(data)}"]
        elif method in ("POST", "PUT"):
            head.append("Content-Length: 0")
        head += [f"{k}: {v}" for k, v in (headers or {"Connection": "close"}).items()]
        cut: OSError | None = None
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        except (BrokenPipeError, ConnectionResetError) as err:
            cut = err  # closed under the request: an answer it sent first (a refusal) is still there to read
        reader = sock.makefile("rb")
        while True:
            try:
                status_line = reader.readline().decode("latin-1").split(None, 2)
            except OSError:
                if cut is None:
                    raise
                status_line = []
            if cut is not None and (len(status_line) < 2 or not status_line[1].isdigit()):
                raise cut
            if len(status_line) < 2 or not status_line[1].isdigit():
                raise ConnectionError(
                    f"not an HTTP answer: {' '.join(status_line)[:80]!r}"
                    if status_line
                    else "the connection was closed before an answer"
                )
            fields: dict[str, str] = {}
            while True:
                line = reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
            status = int(status_line[1])
            if not (100 <= status < 200 and status != 101):
                break
            if interim is not None:
                interim(status)
    except BaseException:
        sock.close()
        raise
    return Answer(sock, reader, status, fields)

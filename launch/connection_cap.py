"""A cap on the embedded server's open connections: past ``limit`` a new one is answered ``503`` and closed before
aiohttp sees it, so stalled clients cannot use up the file descriptors. The cap sits in the listening socket's
``accept()``; a connection counts until asyncio closes it. Refusals count in ``/stats``."""

from __future__ import annotations

import socket
import sys
import time

_BODY = b'{"error": {"message": "too many open connections; try again later", "type": "Service Unavailable"}}'
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY))


def default_limit() -> int:
    """Half the process's open-file limit (the other half for the model's files, threads and logs), at most 4096."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, min(4096, soft // 2)) if soft != resource.RLIM_INFINITY else 4096


class _Connection(socket.socket):
    """An accepted connection that counts itself out of its listener when closed."""

    listener: CappedListener | None = None

    def _release(self) -> None:
        if self.listener is not None:
            self.listener.open_connections -= 1
            self.listener = None

    def close(self) -> None:
        self._release()
        super().close()

    def detach(self) -> int:
        self._release()
        return super().detach()


class CappedListener(socket.socket):
    """A listening TCP socket that hands out at most ``limit`` open connections at once (module doc)."""

    def __init__(self, family: int, limit: int) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self.limit, self.open_connections, self.refused, self._said = limit, 0, 0, -60.0

    def accept(self) -> tuple[socket.socket, object]:
        while True:
            fd, address = self._accept()
            if self.open_connections < self.limit:
                connection = _Connection(self.family, self.type, self.proto, fileno=fd)
                connection.listener = self
                self.open_connections += 1
                return connection, address
            self._refuse(fd)

    def _refuse(self, fd: int) -> None:
        refused = socket.socket(self.family, self.type, self.proto, fileno=fd)
        try:
            refused.setblocking(False)
            refused.send(REFUSAL)
        except OSError:
            pass  # its buffer is full or it is gone: the close below says enough
        finally:
            refused.close()
        self.refused += 1
        now = time.monotonic()
        if now - self._said >= 60:
            self._said = now
            print(f"warning: {self.open_connections} connections are open (--max-connections {self.limit}): "
                  "refusing new ones with 503 (said once a minute at most)", file=sys.stderr, flush=True)


def listen(host: str, port: int, limit: int) -> CappedListener:
    """A :class:`CappedListener` bound to ``host:port`` and listening; ``OSError`` (a busy port, a name that does
    not resolve) as ``bind``/``getaddrinfo`` raise it."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    listener = CappedListener(family, limit)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(1024)
    except OSError:
        listener.close()
        raise
    return listener

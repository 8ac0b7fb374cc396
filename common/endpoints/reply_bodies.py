"""Reading an HTTP reply's (decompressed) body in bounded memory, a limit set by the settings, never by a server."""

from __future__ import annotations

import aiohttp

CHUNK_BYTES = 1 << 16


class BodyTooLarge(Exception):
    """A reply body over the limit; nothing past the limit was read."""

    def __init__(self, limit: int, declared: int | None = None):
        super().__init__(f"the reply body is {declared} bytes, over the {_size(limit)} this run reads" if declared is not None
                         else f"the reply body went past the {_size(limit)} this run reads")
        self.limit = limit


def _size(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"


async def read_body(reply: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes of it; raises :class:`BodyTooLarge` past that."""
    declared = reply.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit, declared)
    chunks, size = [], 0
    async for chunk in reply.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_head(reply: aiohttp.ClientResponse, limit: int = 1 << 16) -> bytes:
    """At most the first ``limit`` bytes of the body (the rest is not read)."""
    chunks, size = [], 0
    while size < limit and (chunk := await reply.content.read(min(CHUNK_BYTES, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)

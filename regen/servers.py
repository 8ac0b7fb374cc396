"""Who provides the chat endpoint(s) for a regen job: the ``server`` config group.

``provide_endpoints(server_cfg)`` is a context manager yielding the base URLs (``http://host:port``) that
are ready to serve; it owns the whole lifecycle for ``vllm`` and ``local`` and none for ``external``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def provide_endpoints(server_cfg: Mapping) -> Iterator[list[str]]:
    """Yield ready base URLs for ``server_cfg`` and release what was started when the block exits."""
    kind = server_cfg.get("kind")
    if kind == "external":
        endpoints = server_cfg.get("endpoints")
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("server.endpoints is empty: give one or more base URLs, e.g. [http://127.0.0.1:8000]")
        yield [str(e).rstrip("/") for e in endpoints]
        return
    raise NotImplementedError(f"server.kind={kind!r} lifecycle is not implemented yet")

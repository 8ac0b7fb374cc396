"""An endpoint URL as the client sends to it; its credentials (``http://user:password@host``) go out as basic auth
and never appear in a name or a message."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from yarl import URL

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class EndpointAddress:
    """Where a server answers: ``base`` (``scheme://host:port[/prefix]``, no credentials) and its credentials."""

    base: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def chat_url(self) -> str:
        return self.base + CHAT_PATH

    def auth_headers(self) -> dict[str, str]:
        """The basic-auth header for the URL's credentials ({} without)."""
        if self.user is None:
            return {}
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}


def parse_endpoint(text: str) -> EndpointAddress:
    """``http://host:port``, ``.../v1`` or ``.../v1/[chat/]completions`` as one :class:`EndpointAddress`."""
    try:
        url = URL(str(text).strip())
    except (TypeError, ValueError) as error:
        raise ValueError(f"not a URL ({error})") from None
    if not url.absolute or url.scheme not in ("http", "https") or not url.host:
        shown = url.with_user(None) if url.absolute else url
        raise ValueError(f"{str(shown)!r} is not an http(s)://host:port URL")
    if url.query_string or url.fragment:
        raise ValueError(f"{url.with_user(None).with_query(None).with_fragment(None)!s} must not carry "
                         "a query or fragment")
    path = url.path.rstrip("/")
    for suffix in (CHAT_PATH, COMPLETIONS_PATH, "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    base = url.with_user(None).with_password(None).with_path(path or "/")
    return EndpointAddress(str(base).rstrip("/"), url.user, url.password)

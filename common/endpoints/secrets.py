"""The run's credentials, kept out of every message a server's text reaches: the API key (``api_key_env``) and each
endpoint URL's password, as given, percent-encoded, as ``user:password`` and as its HTTP basic-auth token."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote

from common.endpoints.address import EndpointAddress

REDACTED = "[redacted]"


class Secrets:
    """``redact(text)``: ``text`` with every credential of the run replaced by ``[redacted]``."""

    def __init__(self, api_key: str | None, addresses: Iterable[EndpointAddress]) -> None:
        found = {api_key} if api_key else set()
        for address in addresses:
            if address.user is None:
                continue
            pair = f"{address.user}:{address.password or ''}"
            found |= {pair, base64.b64encode(pair.encode()).decode("ascii")}
            if address.password:
                found |= {address.password, quote(address.password, safe="")}
        self.values = sorted(found, key=len, reverse=True)  # the longest first: a password inside its pair too

    def redact(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, REDACTED)
        return text

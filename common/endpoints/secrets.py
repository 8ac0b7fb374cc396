"""The run's credentials, kept out of every message a server's text reaches: the API key (``api_key_env``) and each
endpoint URL's password, as ``user:password`` and as its HTTP basic-auth token, each also as a server might echo it
reshaped: in any letter case, percent-encoded (``quote`` and ``quote_plus``), and base64-encoded at any alignment
inside a longer encoded text (standard and URL-safe alphabets)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

from common.endpoints.address import EndpointAddress

REDACTED = "[redacted]"
MIN_BASE64_CORE = 8  # shorter encoded fragments are too common in other text to redact


def base64_cores(value: str) -> set[str]:
    """The characters that encode ``value`` wherever it sits in a base64 text: for each of the 3 alignments, those
    whose 6 bits all come from ``value`` (standard and URL-safe alphabets)."""
    raw, cores = value.encode(), set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        core = encoded[-(-8 * offset // 6):8 * (offset + len(raw)) // 6]
        if len(core) >= MIN_BASE64_CORE:
            cores |= {core, core.translate(str.maketrans("+/", "-_"))}
    return cores


def _shapes(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value, safe=""), *base64_cores(value)}


class Secrets:
    """``redact(text)``: ``text`` with every credential of the run, in each shape, replaced by ``[redacted]``."""

    def __init__(self, api_key: str | None, addresses: Iterable[EndpointAddress]) -> None:
        found = {api_key} if api_key else set()
        for address in addresses:
            if address.user is None:
                continue
            pair = f"{address.user}:{address.password or ''}"
            found |= {pair, base64.b64encode(pair.encode()).decode("ascii")}
            if address.password:
                found.add(address.password)
        shapes = {shape for value in found for shape in _shapes(value)}
        self.values = sorted(shapes, key=len, reverse=True)  # the longest first: a password inside its pair too
        self._pattern = re.compile("|".join(map(re.escape, self.values)), re.IGNORECASE) if self.values else None

    def redact(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text

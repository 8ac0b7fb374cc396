"""Credentials echoed back by a server are redacted in every shape issue 67 found leaking: upper-cased,
percent-encoded and base64-encoded (alone or inside a longer encoded text), as well as plain."""

from __future__ import annotations

import base64
from urllib.parse import quote

from common.endpoints.address import parse_endpoint
from common.endpoints.secrets import REDACTED, Secrets

KEY = "sk-Secret/Key+42=x"


def test_every_echoed_shape_of_the_key_is_redacted():
    secrets = Secrets(KEY, [])
    for shape in (KEY, KEY.upper(), KEY.lower(), quote(KEY, safe=""), quote(KEY, safe="").lower(),
                  base64.b64encode(KEY.encode()).decode(), base64.urlsafe_b64encode(KEY.encode()).decode()):
        redacted = secrets.redact(f"bad key: {shape}!")
        assert REDACTED in redacted and shape not in redacted, shape
    for prefix in ("Bearer ", "xBearer ", "xyBearer "):  # the key inside a longer text, at each base64 alignment
        echoed = base64.b64encode((prefix + KEY).encode()).decode()
        assert REDACTED in secrets.redact(echoed), prefix
    assert secrets.redact("nothing secret here, QUJDREVGR0g=") == "nothing secret here, QUJDREVGR0g="


def test_a_urls_password_is_redacted_in_its_shapes_too():
    secrets = Secrets(None, [parse_endpoint("http://ann:p%40ss-w0rd!@127.0.0.1:9/v1")])
    text = f"denied ann:p@ss-w0rd! {base64.b64encode(b'ann:p@ss-w0rd!').decode()} P@SS-W0RD!"
    assert secrets.redact(text) == f"denied {REDACTED} {REDACTED} {REDACTED}"


def test_no_credentials_leave_text_alone():
    assert Secrets(None, [parse_endpoint("http://127.0.0.1:9/v1")]).redact("a [b] (c)") == "a [b] (c)"

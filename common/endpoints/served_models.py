"""Which model the endpoints serve (``/v1/models``) and the model the requests name; none answering, or none serving
the asked model, stops the run (:class:`EndpointsUnusableError`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp

from common.endpoints.api_client import OutOfFileDescriptorsError, client_session, out_of_descriptors
from common.endpoints.endpoint_pool import EndpointPool
from common.endpoints.reply_bodies import read_body, read_head
from common.endpoints.secrets import Secrets
from common.user_errors import UserError

MODELS_PAGE_BYTES = 16 << 20  # /v1/models: a list of model cards
SHOWN_MODELS = 10  # model ids an error names at most (a server may list thousands)


class EndpointsUnusableError(UserError):
    """No endpoint answers, or none serves the asked model."""


@dataclass(frozen=True)
class SettingNames:
    """The keys a person sets for the endpoints, named in the hints (regen's by default)."""

    endpoints: str = "server.endpoints"
    model: str = "server.model"
    api_key_env: str = "api_key_env"


async def served_models(api_key_env: str | None, pool: EndpointPool, secrets: Secrets,
                        names: SettingNames = SettingNames()) -> dict[str, int | None]:
    """Model id -> the smallest ``max_model_len`` reported (or None); endpoints that do not answer are taken out."""
    served: dict[str, int | None] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with client_session(api_key_env) as session:
        for endpoint in pool.endpoints:
            try:
                async with session.get(endpoint.address.base + "/v1/models", headers=endpoint.headers,
                                       timeout=timeout) as reply:
                    if reply.status != 200:
                        hint = f" (the server wants an API key: set {names.api_key_env}=)" if reply.status == 401 else ""
                        message = (await read_head(reply)).decode("utf-8", "replace")[:300]
                        raise RuntimeError(f"HTTP {reply.status}{hint}: {message}")
                    data = json.loads(await read_body(reply, MODELS_PAGE_BYTES))
                # a model id names the output file and appears in messages: no credential of the run in it
                cards = [(secrets.redact(str(card["id"])), card.get("max_model_len")) for card in data["data"]]
            except Exception as error:  # noqa: BLE001 - reported per endpoint, the run goes on with the others
                if out_of_descriptors(error):
                    raise OutOfFileDescriptorsError(f"asking {endpoint.url} for its models") from None
                endpoint.live, endpoint.taken_out = False, 1
                endpoint.last_error = secrets.redact(f"/v1/models: {type(error).__name__}: {error}")
                continue
            for model, length in cards:
                known = served.get(model)
                if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                    served[model] = length if known is None else min(known, length)
                else:
                    served.setdefault(model, known)
    if not any(endpoint.live for endpoint in pool.endpoints):
        raise EndpointsUnusableError("no endpoint answers /v1/models: " + "; ".join(
            f"{e.url} ({e.last_error})" for e in pool.endpoints),
            f"start the server, or check {names.endpoints} (and {names.api_key_env})")
    return served


def pick_model(served: dict[str, int | None], wanted: str | None, must_serve_wanted: bool,
               names: SettingNames = SettingNames()) -> str:
    """The model the requests name: ``wanted`` when served, else the first listed; with ``must_serve_wanted`` an
    unserved ``wanted`` stops the run."""
    if wanted and wanted in served:
        return wanted
    if wanted and must_serve_wanted:
        listed = ", ".join(repr(name) for name in list(served)[:SHOWN_MODELS])
        more = f" and {len(served) - SHOWN_MODELS} more" if len(served) > SHOWN_MODELS else ""
        raise EndpointsUnusableError(f"{names.model}={wanted!r} is not served by the endpoints (they serve {listed}{more})",
                                     f"drop {names.model} to use what they serve, or point {names.endpoints} elsewhere")
    if not served:
        raise EndpointsUnusableError("the endpoints' /v1/models lists no model")
    return next(iter(served))

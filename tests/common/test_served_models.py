"""Which model a run's requests name, from what the endpoints' ``/v1/models`` list (``pick_model``); asking the
endpoints themselves is tested through ``run`` (``tests/regen/test_job.py``)."""

from __future__ import annotations

import pytest

from common.endpoints.served_models import EndpointsUnusableError, pick_model

SERVED = {"first/model": 4096, "asked/model": None}


def test_the_asked_model_when_served_else_the_first_listed():
    assert pick_model(SERVED, "asked/model", must_serve_wanted=True) == "asked/model"
    assert pick_model(SERVED, None, must_serve_wanted=True) == "first/model"
    # a server regen started (not external endpoints): what it lists
    assert pick_model(SERVED, "other/model", must_serve_wanted=False) == "first/model"


def test_an_asked_model_the_endpoints_do_not_serve_or_no_model_at_all_stops_the_run():
    with pytest.raises(EndpointsUnusableError, match=r"server.model='other' is not served by the endpoints \(they serve "
                                                r"'first/model', 'asked/model'\)$"):
        pick_model(SERVED, "other", must_serve_wanted=True)
    with pytest.raises(EndpointsUnusableError, match="lists no model"):
        pick_model({}, None, must_serve_wanted=False)


def test_a_server_listing_thousands_of_models_gets_ten_named():
    served = {f"m{i}": None for i in range(5000)}
    with pytest.raises(EndpointsUnusableError) as refused:
        pick_model(served, "other", must_serve_wanted=True)
    assert refused.value.message.endswith("(they serve 'm0', 'm1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7', 'm8', 'm9' "
                                          "and 4990 more)")

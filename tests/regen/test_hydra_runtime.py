"""What regen writes back into Hydra's record of a job: URLs without their credentials."""

from __future__ import annotations

from regen.outputs.hydra_runtime import strip_credentials


def test_credentials_are_stripped_from_every_url_and_nothing_else():
    text = ("server:\n  endpoints:\n  - http://alice:pw-1@10.0.0.1:8000/v1\n  - https://bob@gw.example/x\n"
            "- server.endpoints=[http://u:p@h:1,http://h:2]\nnote: mail me at a@b.c\n")
    assert strip_credentials(text) == ("server:\n  endpoints:\n  - http://10.0.0.1:8000/v1\n  - https://gw.example/x\n"
                                       "- server.endpoints=[http://h:1,http://h:2]\nnote: mail me at a@b.c\n")

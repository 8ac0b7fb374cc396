"""The one resume signature both jobs keep (``common.resume_signature``): flat dotted keys, their differences."""

from __future__ import annotations

from dataclasses import dataclass

from common.resume_signature import described, differences, flat_settings


@dataclass
class Block:
    a: int
    b: tuple


@dataclass
class WithOwnSettings:
    on: bool
    beta: float

    def resume_settings(self) -> dict:
        return {"beta": self.beta} if self.on else {}


def test_mappings_and_dataclasses_open_into_dotted_keys_and_a_block_may_leave_its_off_settings_out():
    flat = flat_settings({"seed": 1, "block": Block(2, (3, 4)), "params": {"z": 1, "a": {"x": None}}, "empty": {},
                          "off": WithOwnSettings(False, 0.5), "on": WithOwnSettings(True, 0.5)})
    assert flat == {"seed": 1, "block.a": 2, "block.b": (3, 4), "params.a.x": None, "params.z": 1, "empty": {},
                    "on.beta": 0.5}
    assert list(flat_settings({"p": {"z": 1, "a": 2}})) == ["p.a", "p.z"]  # a mapping's keys sorted


def test_differences_name_every_key_either_side_has():
    changed = differences({"a": 1, "b": 2, "gone": 0}, {"a": 1, "b": 3, "new": 4})
    assert changed == {"b": (2, 3), "gone": (0, None), "new": (None, 4)}
    assert described(changed) == "b: saved 2, now 3\n  gone: saved 0, now None\n  new: saved None, now 4"

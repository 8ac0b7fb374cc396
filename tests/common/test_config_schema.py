"""The config toolkit: a config as typed dataclasses, each refusal one ConfigError naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

from common.config_schema import (
    ConfigError,
    check_choice,
    check_integer,
    check_name,
    check_number,
    check_positive,
    check_text,
    flattened,
    parse_config,
    parsed_by,
)
from common.user_errors import UserError


def _ports(key, value):
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of ports, got {value!r}")
    return tuple(int(port) for port in value)


@dataclass
class Limits:
    steps: int
    rate: float | None
    tags: list[str]

    def __post_init__(self) -> None:
        check_integer("limits.steps", self.steps, 1)


@dataclass
class Weights:
    checkpoint: str
    layers: int | None = None


@dataclass
class Remote:
    kind: ClassVar[str] = "remote"
    MISSING_HINTS: ClassVar[dict[str, str]] = {"url": "add server.url=http://host:8000"}
    url: str


@dataclass
class Local:
    kind: ClassVar[str] = "local"
    weights: Weights = flattened()
    ports: tuple[int, ...] = parsed_by(_ports)


@dataclass
class Job:
    name: str
    limits: Limits
    server: Remote | Local
    runs: dict[str, Limits]


def job(**changes):
    cfg = {"name": "a", "limits": {"steps": 2, "rate": None, "tags": ["x"]},
           "server": {"kind": "remote", "url": "http://h:1"}, "runs": {"r": {"steps": 1, "rate": 0.5, "tags": []}}}
    cfg.update(changes)
    return parse_config(Job, OmegaConf.create(cfg))


def test_a_config_becomes_the_dataclasses_with_the_kind_it_names():
    built = job()
    assert isinstance(built.limits, Limits) and isinstance(built.server, Remote) and built.runs["r"].rate == 0.5
    local = job(server={"kind": "local", "checkpoint": "m.pth", "layers": 2, "ports": [8000, "8001"]}).server
    assert local.weights == Weights("m.pth", 2) and local.ports == (8000, 8001)


@pytest.mark.parametrize("changes,message,hint", [
    ({"limits": {"steps": 0, "rate": None, "tags": []}}, "limits.steps must be an integer >= 1, got 0", None),
    ({"limits": {"steps": "many", "rate": None, "tags": []}}, "limits.steps must be an integer, got 'many'", None),
    ({"limits": {"steps": 1, "rate": "fast", "tags": []}}, "limits.rate must be a number or null, got 'fast'", None),
    ({"limits": {"steps": 1, "rate": None, "tags": "x"}}, "limits.tags must be a list, as in limits.tags=[a,b]", None),
    ({"runs": {"r": {"steps": "x", "rate": None, "tags": []}}}, "runs.r.steps must be an integer, got 'x'", None),
    ({"limits": {"steps": 1, "rate": None, "tags": [], "speed": 2}}, "unknown setting limits.speed",
     "limits has no such key; --help lists the keys"),
    ({"extra": 1}, "unknown setting extra", "this entry has no such key; --help lists the keys"),
    ({"name": "???"}, "name is required", "add name=<value>"),
    ({"server": {"kind": "remote", "url": "???"}}, "server.url is required", "add server.url=http://host:8000"),
    ({"server": {"kind": "cloud"}}, "server.kind must be one of remote, local, got 'cloud'", None),
    ({"server": {"kind": "local", "checkpoint": "m.pth", "ports": 8}}, "server.ports must be a list of ports, got 8",
     None),
    ({"server": {"kind": "local", "checkpoint": "m.pth", "ports": [], "layers": "two"}},
     "server.layers must be an integer or null, got 'two'", None),
    ({"server": {"kind": "local", "checkpoint": "m.pth", "ports": [], "gpus": 1}}, "unknown setting server.gpus", None),
])
def test_each_refusal_names_its_key(changes, message, hint):
    with pytest.raises(ConfigError) as refused:
        job(**changes)
    assert refused.value.message == message and isinstance(refused.value, UserError)
    assert hint is None or refused.value.hint == hint


def test_hydras_own_node_is_left_out():
    cfg = OmegaConf.create({"hydra": {"job": {"num": "???"}}, "steps": 1, "rate": None, "tags": []})
    assert parse_config(Limits, cfg).steps == 1


@pytest.mark.parametrize("check,message", [
    (lambda: check_integer("n", 1.5), "n must be an integer, got 1.5"),
    (lambda: check_integer("n", True, 0), "n must be an integer >= 0, got True"),
    (lambda: check_integer("n", -1, 0, optional=True), "n must be an integer >= 0 or null, got -1"),
    (lambda: check_number("x", float("nan"), 0, exclusive=True), "x must be a finite number > 0, got nan"),
    (lambda: check_number("x", 2, 0, maximum=1), "x must be a finite number >= 0 and <= 1, got 2"),
    (lambda: check_positive("lr", -1.0), "lr must be a positive number, got -1.0"),
    (lambda: check_text("s", " "), "s must be a non-empty string, got ' '"),
    (lambda: check_choice("c", "z", ("a", "b")), "c must be one of a, b, got 'z'"),
    (lambda: check_name("p", "a/b", "files"), "p must be named with letters, digits, '_', '-' and '.' only (it names "
                                              "files), got 'a/b'"),
])
def test_the_shared_checks_say_what_the_value_must_be(check, message):
    with pytest.raises(ConfigError) as refused:
        check()
    assert refused.value.message == message


def test_values_within_range_pass():
    check_integer("n", None, 1, optional=True)
    check_number("x", 1, 0, maximum=1)
    check_text("s", None, optional=True)
    check_name("p", "run-1.a_b", "files")

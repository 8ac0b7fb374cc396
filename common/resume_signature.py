"""The resume signature of regen's manifest and opd's resume file: a run's settings as flat ``dotted.key: value``
pairs, compared key by key with the saved ones; differing keys refuse the continuation (:class:`ResumeRefusedError`)
or, where a job allows it, are recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from common.user_errors import UserError


class ResumeRefusedError(UserError):
    """A saved run cannot be continued: other settings, or its record is damaged or of another version."""


def flat_settings(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``settings`` as dotted keys: non-empty mappings opened (sorted), dataclasses by field or by their
    ``resume_settings()`` (a setting that is off leaves its keys out, so older runs still resume)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if hasattr(value, "resume_settings"):
            flat.update(flat_settings(value.resume_settings(), f"{name}."))
        elif is_dataclass(value) and not isinstance(value, type):
            flat.update(flat_settings({field.name: getattr(value, field.name) for field in fields(value)}, f"{name}."))
        elif isinstance(value, Mapping) and value:
            flat.update(flat_settings({k: value[k] for k in sorted(value, key=str)}, f"{name}."))
        else:
            flat[name] = value
    return flat


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every key whose value differs between the two (one side missing counts as None), sorted: (saved, current)."""
    return {key: (saved.get(key), current.get(key)) for key in sorted(set(saved) | set(current))
            if saved.get(key) != current.get(key)}


def described(changed: Mapping[str, tuple[Any, Any]]) -> str:
    """``differences`` as lines: ``key: saved OLD, now NEW``."""
    return "\n  ".join(f"{key}: saved {old!r}, now {new!r}" for key, (old, new) in changed.items())

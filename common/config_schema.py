"""Settings checked once at start: ``parse_config(schema, cfg)`` builds a composed config as typed dataclasses (their
``__post_init__`` checks with the helpers here). Fields OmegaConf cannot build are built here once: ``parsed_by``, a
union of dataclasses picked by the block's ``kind``, and ``flattened()`` (keys in the enclosing block). Every refusal
is one :class:`ConfigError` naming the key; a schema's ``MISSING_HINTS`` says what to type for a required key.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, field, fields, is_dataclass, make_dataclass
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from common.user_errors import UserError

Schema = TypeVar("Schema")
PARSER = "parse_config.parser"  # field metadata: parse(key, value) -> the field's value
FLATTENED = "parse_config.flattened"  # field metadata: the dataclass's keys sit in the enclosing block
# What a key of each type must be, in a refusal ("resume must be true or false, got 'maybe'").
WANTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "a mapping"}


class ConfigError(UserError):
    """A setting that is missing, unknown, of the wrong type or out of range; the message names the key."""


def parsed_by(parse: Callable[[str, Any], Any]) -> Any:
    """A field whose raw value ``parse(key, value)`` turns into the field's type (raising ``ConfigError``)."""
    return field(metadata={PARSER: parse})


def flattened() -> Any:
    """A dataclass field whose keys sit in the enclosing block, beside the block's own keys."""
    return field(metadata={FLATTENED: True})


def parse_config(schema: type[Schema], cfg: DictConfig | Mapping, prefix: str = "") -> Schema:
    """``cfg`` (the composed config, or one block of plain values whose keys ``prefix`` names) as ``schema``'s
    dataclasses (or, for a union of kinds, its ``kind``'s), every value checked; raises :class:`ConfigError`."""
    keys = [key for key in cfg if key != "hydra"]  # Hydra's own node (compose(return_hydra_config) keeps it)
    if isinstance(cfg, DictConfig):
        try:  # a missing value stays "???", refused below naming its key
            block = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{error.full_key}: {str(error).splitlines()[0]}") from None
    else:
        block = {key: cfg[key] for key in keys}
    kinds = _kinds(schema)  # a union of kinds: the block's ``kind`` picks one
    return _build_kind(kinds, block, prefix.rstrip(".")) if kinds else _build(schema, block, prefix)


def _build(schema: type[Schema], block: Mapping, prefix: str) -> Schema:
    hints = typing.get_type_hints(schema)
    rest, built = dict(block), {}
    for item in fields(schema):
        if not item.init or not _built_here(item, hints[item.name]):
            continue
        key = prefix + item.name
        if item.metadata.get(FLATTENED):
            names = {inner.name for inner in fields(hints[item.name])}
            built[item.name] = _build(hints[item.name], {k: rest.pop(k) for k in list(rest) if k in names}, prefix)
            continue
        if item.name not in rest:
            if item.default is MISSING and item.default_factory is MISSING:
                _refuse_missing(schema, item.name, prefix)
            continue
        value = rest.pop(item.name)
        if value == "???":
            _refuse_missing(schema, item.name, prefix)
        if PARSER in item.metadata:
            built[item.name] = item.metadata[PARSER](key, value)
        elif _kinds(hints[item.name]):
            built[item.name] = _build_kind(_kinds(hints[item.name]), value, key)
        else:
            require(isinstance(value, Mapping), key, "a block of settings", value)
            built[item.name] = _build(hints[item.name], value, key + ".")
    if not built:
        return _merge(schema, schema, rest, prefix)
    shadow = make_dataclass(schema.__name__, [(item.name, hints[item.name], _copy(item)) for item in fields(schema)
                                              if item.init and item.name not in built], kw_only=True)
    plain = _merge(shadow, schema, rest, prefix)
    return schema(**vars(plain), **built)


def _built_here(item: Field, hint: Any) -> bool:
    """Whether ``parse_config`` builds the field itself (OmegaConf cannot): a parsed, flattened or kind-picked field,
    or a block holding one."""
    if PARSER in item.metadata or item.metadata.get(FLATTENED) or _kinds(hint):
        return True
    return is_dataclass(hint) and any(_built_here(inner, typing.get_type_hints(hint)[inner.name])
                                      for inner in fields(hint) if inner.init)


def _kinds(hint: Any) -> dict[str, type]:
    """``kind`` -> dataclass, for a union of dataclasses that each name their ``kind``; else empty."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return {}
    options = typing.get_args(hint)
    if not all(is_dataclass(option) and isinstance(getattr(option, "kind", None), str) for option in options):
        return {}
    return {option.kind: option for option in options}


def _build_kind(kinds: dict[str, type], block: Any, key: str) -> Any:
    require(isinstance(block, Mapping), key, f"a block of settings with a kind ({', '.join(kinds)})", block)
    block = dict(block)
    kind = block.pop("kind", None)
    require(kind in kinds, f"{key}.kind", "one of " + ", ".join(kinds), kind)
    return _build(kinds[kind], block, key + ".")


def _copy(item: Field) -> Field:
    return field(default=item.default, default_factory=item.default_factory)


def _merge(shadow: type, schema: type, block: Mapping, prefix: str) -> Any:
    """``block`` as ``shadow`` (``schema`` or its fields that OmegaConf builds), each refusal naming its key."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(shadow), block))
    except MissingMandatoryValue as error:
        owner, name = _owner(schema, str(error.full_key))
        _refuse_missing(owner, name, prefix + str(error.full_key).removesuffix(name))
    except ConfigKeyError as error:
        key = f"{prefix}{error.full_key}"
        block = key.rpartition(".")[0] or "this entry"
        raise ConfigError(f"unknown setting {key}", f"{block} has no such key; --help lists the keys"
                          ) from None
    except ValidationError as error:
        key = f"{prefix}{error.full_key}"
        wanted = _wanted(schema, str(error.full_key))
        if wanted == WANTED[list]:  # the form to type it in, rather than the value a shell or Hydra made of it
            raise ConfigError(f"{key} must be a list, as in {key}=[a,b]") from None
        raise ConfigError(f"{key} must be {wanted}, got {error.value!r}") from None
    except OmegaConfBaseException as error:
        raise ConfigError(f"{prefix}{error.full_key}: {str(error).splitlines()[0]}") from None


def _refuse_missing(schema: type, name: str, prefix: str) -> typing.NoReturn:
    key = prefix + name
    hint = getattr(schema, "MISSING_HINTS", {}).get(name, f"add {key}=<value>")
    raise ConfigError(f"{key} is required", hint)


def _field_type(schema: type, key: str) -> Any:
    """The annotation of the dotted ``key`` under ``schema`` (a mapping's own keys skipped), or None."""
    annotation: Any = schema
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        annotation = _value_type(annotation)
        if typing.get_origin(annotation) in (dict, list):  # ``part`` is one of its own keys or positions
            annotation = typing.get_args(annotation)[-1]
            continue
        annotation = typing.get_type_hints(annotation).get(part) if is_dataclass(annotation) else None
    return annotation


def _value_type(annotation: Any) -> Any:
    options = [option for option in typing.get_args(annotation) if option is not type(None)]
    return options[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and options else annotation


def _owner(schema: type, key: str) -> tuple[type, str]:
    """The dataclass that holds the dotted ``key``'s last part, and that part."""
    *parents, name = key.split(".")
    owner = _value_type(_field_type(schema, ".".join(parents))) if parents else schema
    return (owner if is_dataclass(owner) else schema), name


def _wanted(schema: type, key: str) -> str:
    """What the field ``key`` (dotted, from ``schema``) must be, from its annotation."""
    annotation = _field_type(schema, key)
    base = _value_type(annotation)
    nullable = type(None) in typing.get_args(annotation)
    return WANTED.get(typing.get_origin(base) or base, "a valid value") + (" or null" if nullable else "")


# The checks schemas share; each refusal reads "<key> must be <what>, got <value>".

def refuse(key: str, wanted: str, value: Any, example: str | None = None) -> typing.NoReturn:
    """Refuse ``value`` of ``key``, saying what it must be (and, with ``example``, how to set it)."""
    raise ConfigError(f"{key} must be {wanted}, got {value!r}", None if example is None else f"set it like {key}={example}")


def require(condition: bool, key: str, wanted: str, value: Any) -> None:
    """Refuse ``value`` of ``key`` unless ``condition`` holds."""
    if not condition:
        refuse(key, wanted, value)


def auto_or_count(key: str, value: Any, auto_means: str, example: int) -> int | str:
    """A setting that is ``auto`` or an integer >= 1 (a ``parsed_by`` parser's body), refused with both forms shown."""
    if value != "auto" and not (is_int(value) and value >= 1):
        raise ConfigError(f"{key} must be auto or an integer >= 1, got {value!r}",
                          f"set it like {key}=auto ({auto_means}) or {key}={example}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_integer(key: str, value: Any, minimum: int | None = None, *, optional: bool = False,
                  example: str | None = None) -> None:
    """An integer, at least ``minimum``; ``optional``: or null."""
    if optional and value is None:
        return
    if not is_int(value) or (minimum is not None and value < minimum):
        refuse(key, "an integer" + ("" if minimum is None else f" >= {minimum}") + (" or null" if optional else ""),
               value, example)


def check_integers(prefix: str, settings: Any, keys: tuple[str, ...], minimum: int = 1) -> None:
    """Each of ``keys`` of ``settings`` (a block whose keys ``prefix`` names) an integer, at least ``minimum``."""
    for key in keys:
        check_integer(prefix + key, getattr(settings, key), minimum)


def check_number(key: str, value: Any, minimum: float | None = None, *, exclusive: bool = False,
                 maximum: float | None = None, optional: bool = False, example: str | None = None) -> None:
    """A finite number, at least (``exclusive``: above) ``minimum`` and at most ``maximum``; ``optional``: or null."""
    if optional and value is None:
        return
    low_ok = minimum is None or (value > minimum if exclusive else value >= minimum) if is_finite(value) else False
    if not is_finite(value) or not low_ok or (maximum is not None and value > maximum):
        span = "" if minimum is None else f" {'>' if exclusive else '>='} {minimum:g}"
        span += "" if maximum is None else f" and <= {maximum:g}"
        refuse(key, f"a finite number{span}" + (" or null" if optional else ""), value, example)


def check_positive(key: str, value: float) -> None:
    """A finite number above 0 (a learning rate)."""
    require(math.isfinite(value) and value > 0, key, "a positive number", value)


def check_text(key: str, value: Any, *, optional: bool = False, example: str | None = None) -> None:
    """A non-empty string; ``optional``: or null."""
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        refuse(key, "a non-empty string" + (" or null" if optional else ""), value, example)


def check_choice(key: str, value: Any, options: tuple) -> None:
    """One of ``options``."""
    require(value in options, key, "one of " + ", ".join(str(option) for option in options), value)


def check_name(key: str, value: str, names: str) -> None:
    """A name that becomes part of a file or folder name (``names`` says which): no path separator."""
    require(bool(value) and all(c.isalnum() or c in "_.-" for c in value), key,
            f"named with letters, digits, '_', '-' and '.' only (it names {names})", value)

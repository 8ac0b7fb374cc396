"""Every regen setting, checked once at start: typed dataclasses filled from the config, as opd's are.

``RegenSettings.from_config(cfg)`` fills the schema the way ``opd.config.parse_config`` does: OmegaConf merges the
composed config into ``OmegaConf.structured(schema)``, refusing an unknown key, a missing (``???``) value or one of
the wrong type, and builds the dataclasses, whose ``__post_init__`` checks ranges and choices (and normalizes);
every refusal is a :class:`SettingsError` naming the key, before any server starts or any file is touched, and the
rest of regen takes these values as given. Blocks: :class:`DatasetSettings`, the ``server`` block as its kind's
dataclass (:class:`ExternalServer` / :class:`VllmServer` / :class:`LocalServer`; OmegaConf has no unions of
dataclasses, so the ``kind`` key picks one), and :class:`RegenSettings`.

Every default lives once, in the YAML under ``configs/`` (``regen.yaml`` and the groups), with the key's meaning
in its comment; the dataclasses hold none, except :class:`DatasetSettings`' optional ``name``/``subset``/``split``
(null = not set, so code can describe a local file by its path alone). A few keys are typed ``Any`` and checked
by hand, where OmegaConf would convert rather than refuse (``language_filter=1`` would become ``"1"``) or where a
value takes several shapes (``concurrency``: ``auto`` or a number; ``server.endpoints``, ``server.gpus``: a list or
one string; the request mappings, which a wrong shape would make OmegaConf report without their key).
"""

from __future__ import annotations

import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from common.minimind.tokenizer import looks_like_local_path
from common.user_errors import UserError
from regen.endpoints.endpoint_pool import EndpointAddress, parse_endpoint
from regen.rows.formats import FORMATS, REFUSED_FORMATS

LOCAL_SUFFIXES = (".json", ".jsonl")
# Request keys regen sets itself; extra_request_params may not touch them.
OWN_REQUEST_KEYS = frozenset({"model", "messages", "max_tokens", "return_token_ids", "tools", "tool_choice"})
# Request settings that would break one-row-per-generation with exact token ids: (is it refused?, why).
REFUSED_REQUEST_PARAMS = {
    "n": (lambda v: v not in (None, 1), "regen writes one row per generation and reads choices[0] only; "
          "for several samples per prompt run a multirun over sampling.seed"),
    "stream": (bool, "regen reads whole replies, and a streamed reply carries no prompt_token_ids"),
    "include_reasoning": (lambda v: v is False, "vLLM then leaves token_ids out of the reply; reasoning is "
                          "already kept out of later turns (carry_reasoning=false)"),
    "echo": (bool, "vLLM then puts the last message in front of the reply's content, which would go back "
             "into the conversation as the model's answer"),
    "max_completion_tokens": (lambda v: True, "vLLM prefers it over max_tokens; set max_tokens=N instead"),
}
# Sampling keys with vLLM's ranges: (integer?, lowest, lowest excluded?, highest).
SAMPLING_RANGES = {
    "temperature": (False, 0.0, False, None), "top_p": (False, 0.0, True, 1.0), "top_k": (True, -1, False, None),
    "min_p": (False, 0.0, False, 1.0), "repetition_penalty": (False, 0.0, True, None),
    "presence_penalty": (False, -2.0, False, 2.0), "frequency_penalty": (False, -2.0, False, 2.0),
    "seed": (True, None, False, None),
}


class SettingsError(UserError):
    """A setting that is missing, unknown, of the wrong type or out of range; the message names the key."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def check_max_tokens_fit(max_tokens: int, max_model_len: int, source: str) -> None:
    """vLLM refuses every request whose ``max_tokens`` is above the model's ``max_model_len`` (HTTP 400)."""
    if max_tokens > max_model_len:
        raise SettingsError(
            f"max_tokens={max_tokens} is more than the model's max_model_len={max_model_len} ({source}): "
            "the server would refuse every request",
            f"set max_tokens={max_model_len} or lower (vLLM caps each reply at max_model_len minus its prompt), "
            f"or serve the model with --max-model-len {max_tokens} or more")


def _refuse(key: str, wanted: str, value: Any, example: str | None = None) -> None:
    hint = None if example is None else f"set it like {key}={example}"
    raise SettingsError(f"{key} must be {wanted}, got {value!r}", hint)


def check_integer(key: str, value: Any, minimum: int | None = None, *, optional: bool = False,
                  example: str | None = None) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or (minimum is not None and value < minimum):
        _refuse(key, "an integer" + ("" if minimum is None else f" >= {minimum}") + (" or null" if optional else ""),
                value, example)


def check_number(key: str, value: Any, minimum: float | None = None, *, exclusive: bool = False,
                 maximum: float | None = None, optional: bool = False, example: str | None = None) -> None:
    if optional and value is None:
        return
    low_ok = minimum is None or (value > minimum if exclusive else value >= minimum) if _is_number(value) else False
    if not _is_number(value) or not low_ok or (maximum is not None and value > maximum):
        span = "" if minimum is None else f" {'>' if exclusive else '>='} {minimum:g}"
        span += "" if maximum is None else f" and <= {maximum:g}"
        _refuse(key, f"a finite number{span}" + (" or null" if optional else ""), value, example)


def check_text(key: str, value: Any, *, optional: bool = False, example: str | None = None) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        _refuse(key, "a non-empty string" + (" or null" if optional else ""), value, example)


def check_choice(key: str, value: Any, options: tuple) -> None:
    if value not in options:
        _refuse(key, "one of " + ", ".join(str(o) for o in options), value)


def check_finite_values(key: str, value: Any) -> None:
    """Every number inside ``value`` (nested mappings/lists) is finite (NaN would be sent as null)."""
    stack = [(key, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise SettingsError(f"{where} is {item}: only finite numbers can be sent in a request")
        if isinstance(item, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))


def string_keys(key: str, value: Any) -> Any:
    """``value`` with every mapping's integer keys as strings, as JSON (and OpenAI's API: ``logit_bias: {"21":
    100}``) has them; ``{21: 100}`` from the command line or YAML is that. Other non-string keys, and two keys
    that become one, are refused naming where."""
    if isinstance(value, Mapping):
        converted: dict[str, Any] = {}
        for name, item in value.items():
            if isinstance(name, bool) or not isinstance(name, int | str):
                raise SettingsError(f"{key} has the key {name!r} ({type(name).__name__}): request keys are strings "
                                    "(integers become strings)")
            if str(name) in converted:
                raise SettingsError(f"{key} has the key {str(name)!r} twice (as a string and as a number)")
            converted[str(name)] = string_keys(f"{key}.{name}", item)
        return converted
    if isinstance(value, list | tuple):
        return [string_keys(f"{key}[{index}]", item) for index, item in enumerate(value)]
    return value


# What a key of each type must be, in a refusal ("resume must be true or false, got 'maybe'").
WANTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def _wanted(schema: type, key: str) -> str:
    """What the field ``key`` (dotted, from ``schema``) must be, from its annotation."""
    annotation: Any = schema
    for part in key.split("."):
        annotation = typing.get_type_hints(annotation).get(part) if isinstance(annotation, type) else None
    options = [option for option in typing.get_args(annotation) if option is not type(None)] or [annotation]
    base = typing.get_origin(options[0]) or options[0]
    nullable = type(None) in typing.get_args(annotation)
    return WANTED.get(base, "a valid value") + (" or null" if nullable else "")


def parse_block(schema: type, block: Mapping, prefix: str = ""):
    """``block`` (plain values) as ``schema``, filled as ``opd.config.parse_config`` fills opd's: OmegaConf refuses
    an unknown key, a missing value or one of the wrong type, each a :class:`SettingsError` naming the key
    (``prefix`` + its own); the dataclasses' ``__post_init__`` then check the rest."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), block))
    except MissingMandatoryValue as error:
        raise SettingsError(f"{prefix}{error.full_key} is required", f"add {prefix}{error.full_key}=<value>") from None
    except ConfigKeyError as error:
        raise SettingsError(f"unknown setting {prefix}{error.full_key}",
                            f"{prefix.rstrip('.') or 'regen'} has no such key; see configs/ for the keys it takes"
                            ) from None
    except ValidationError as error:
        key = str(error.full_key)
        raise SettingsError(f"{prefix}{key} must be {_wanted(schema, key)}, got {error.value!r}") from None
    except OmegaConfBaseException as error:
        raise SettingsError(f"{prefix}{error.full_key}: {str(error).splitlines()[0]}") from None


@dataclass(frozen=True)
class WeightedChoice:
    """A per-conversation draw: ``options`` with their ``weights``."""

    options: tuple
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, key: str, value: Any, parse_option) -> WeightedChoice | None:
        if value is None:
            return None
        if not isinstance(value, Mapping) or not value:
            _refuse(key, "a mapping of value -> weight", value, "{low: 0.3, high: 0.7}")
        options, weights = [], []
        for option, weight in value.items():
            try:
                options.append(parse_option(option))
            except ValueError:
                raise SettingsError(f"{key}: {option!r} is not a valid value") from None
            check_number(f"{key}.{option}", weight, 0.0)
            weights.append(float(weight))
        if sum(weights) <= 0:
            raise SettingsError(f"{key}: the weights must not all be 0")
        return cls(tuple(options), tuple(weights))


def _temperature(option: Any) -> float:
    value = float(option)
    if not math.isfinite(value) or value < 0:
        raise ValueError(option)
    return value


@dataclass
class DatasetSettings:
    """Where rows come from (``dataset`` group): a hub dataset or a local ``.json``/``.jsonl`` file."""

    source: str
    path: str
    format: str
    name: str | None = None
    subset: str | None = None
    split: str | None = None

    def __post_init__(self) -> None:
        check_choice("dataset.source", self.source, ("hf", "local"))
        check_text("dataset.path", self.path, example="prompts.jsonl")
        check_text("dataset.name", self.name, optional=True)
        check_text("dataset.subset", self.subset, optional=True)
        check_text("dataset.split", self.split, optional=True)
        label = self.name or self.path
        if self.format in REFUSED_FORMATS:
            raise SettingsError(f"dataset {label} {REFUSED_FORMATS[self.format]}")
        if self.format not in FORMATS:
            raise SettingsError(f"dataset.format={self.format!r} is unknown",
                                f"choose one of {', '.join(sorted(FORMATS))}")
        if self.source == "hf" and not self.split:
            raise SettingsError(f"dataset.split is required for the hub dataset {self.path}",
                                "add dataset.split=train (or the split you want)")
        if self.source == "local":
            self._check_local_file()

    def _check_local_file(self) -> None:
        path = Path(self.path)
        if path.suffix.lower() not in LOCAL_SUFFIXES:
            raise SettingsError(f"dataset.path={self.path}: a local dataset must be a .json (top-level array) "
                                "or .jsonl file", "convert it, or point dataset.path at a .jsonl file")
        if not path.is_file():
            raise SettingsError(f"dataset file not found: {path}", "check dataset.path= (relative paths start "
                                "at the folder you run regen from)")
        if not os.access(path, os.R_OK):
            raise SettingsError(f"dataset file {path} is not readable (permission denied)",
                                "fix its permissions or copy it somewhere you can read")

    @property
    def label(self) -> str:
        return self.name or self.path


@dataclass
class _ManagedServer:
    """What the ``vllm`` and ``local`` kinds share: where the server listens and how it is stopped."""

    host: str
    port: int
    max_model_len: int | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    keep_server: bool
    ready_timeout_s: float
    stop_grace_s: float
    log_file: str | None

    def _check_common(self) -> None:
        check_text("server.host", self.host)
        check_integer("server.port", self.port, 1, example="8000")
        if self.port > 65535:
            _refuse("server.port", "a TCP port (1..65535)", self.port, "8000")
        check_integer("server.max_model_len", self.max_model_len, 1, optional=True)
        check_text("server.reasoning_parser", self.reasoning_parser, optional=True, example="qwen3")
        check_text("server.tool_call_parser", self.tool_call_parser, optional=True, example="hermes")
        check_number("server.ready_timeout_s", self.ready_timeout_s, 0, exclusive=True)
        check_number("server.stop_grace_s", self.stop_grace_s, 0)
        check_text("server.log_file", self.log_file, optional=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def endpoints(self) -> tuple[EndpointAddress, ...]:
        return (parse_endpoint(self.base_url),)

    @property
    def log_path(self) -> Path:
        """``server.log_file``, else ``out/servers/<kind>-<port>.log``."""
        return Path(self.log_file or f"out/servers/{self.kind}-{self.port}.log")


@dataclass
class ExternalServer:
    """``server=external``: endpoints that already run; regen starts and stops nothing."""

    kind: ClassVar[str] = "external"
    endpoints: Any  # a list of URLs (or one); becomes a tuple of EndpointAddress
    model: str | None

    def __post_init__(self) -> None:
        given = self.endpoints
        if isinstance(given, str):
            given = [given]
        if not isinstance(given, (list, tuple)) or not given:
            raise SettingsError("server.endpoints is empty",
                                "give one or more base URLs, e.g. 'server.endpoints=[http://127.0.0.1:8000]'")
        addresses = []
        for position, text in enumerate(given):
            if isinstance(text, EndpointAddress):
                addresses.append(text)
                continue
            try:
                addresses.append(parse_endpoint(text))
            except ValueError as error:
                raise SettingsError(f"server.endpoints[{position}]: {error}",
                                    "write it like http://host:8000 (or .../v1, .../v1/chat/completions)") from None
        urls = [a.chat_url for a in addresses]
        if len(set(urls)) != len(urls):
            duplicate = next(u for u in urls if urls.count(u) > 1)
            raise SettingsError(f"server.endpoints names {duplicate} twice", "list each server once")
        self.endpoints = tuple(addresses)
        check_text("server.model", self.model, optional=True)

    @property
    def served_model(self) -> str | None:
        return self.model


@dataclass
class VllmServer(_ManagedServer):
    """``server=vllm``: ``launch/vllm.sh`` starts ``vllm serve`` (single node, or the head of a multi-node DP run)."""

    kind: ClassVar[str] = "vllm"
    model: str
    dp: int
    tp: int
    dp_local: int | None
    dp_address: str | None
    dp_rpc_port: int | None
    gpus: Any  # GPU indices: a list, one index, or "0,1,2"; becomes a tuple of ints (or None)
    extra_args: list[str]

    def __post_init__(self) -> None:
        check_text("server.model", self.model, example="Qwen/Qwen3-8B")
        self._check_common()
        check_integer("server.dp", self.dp, 1, example="4")
        check_integer("server.tp", self.tp, 1, example="2")
        check_integer("server.dp_local", self.dp_local, 0, optional=True)
        if self.dp_local is not None and self.dp_local > self.dp:
            raise SettingsError(f"server.dp_local={self.dp_local} is more than server.dp={self.dp}",
                                "dp_local is how many of the dp ranks run on this (the head) node")
        check_text("server.dp_address", self.dp_address, optional=True, example="10.0.0.1")
        check_integer("server.dp_rpc_port", self.dp_rpc_port, 1, optional=True, example="13345")
        if self.dp_local is not None and self.dp_local < self.dp and not (self.dp_address and self.dp_rpc_port):
            raise SettingsError("a multi-node head (server.dp_local < server.dp) needs server.dp_address and "
                                "server.dp_rpc_port", "add server.dp_address=<this node's IP> server.dp_rpc_port=13345")
        self.gpus = self._gpu_list(self.gpus)
        self.extra_args = tuple(self.extra_args)

    @staticmethod
    def _gpu_list(gpus: Any) -> tuple[int, ...] | None:
        if gpus is None:
            return None
        items = gpus.split(",") if isinstance(gpus, str) else [gpus] if _is_int(gpus) else gpus
        try:
            ids = tuple(int(str(g).strip()) for g in items)
        except (TypeError, ValueError):
            ids = ()
        if not ids or min(ids) < 0:
            _refuse("server.gpus", "GPU indices (a list, or 0,1,2)", gpus, "[0,1,2,3]")
        return ids

    @property
    def served_model(self) -> str:
        return self.model


# Architecture flags a teacher preset brings to server=local (passed to the embedded server's CLI).
LOCAL_ARCH_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "num_experts", "num_experts_per_tok", "vocab_size")


@dataclass
class LocalServer(_ManagedServer):
    """``server=local``: the embedded CPU server (``launch/chat_server.py``) on a model preset or HF model."""

    kind: ClassVar[str] = "local"
    IGNORED_KEYS: ClassVar[frozenset] = frozenset({"name"})  # the model preset's own label
    checkpoint: str
    tokenizer: str | None
    use_moe: bool
    model: str | None
    max_batch_size: int
    max_prefill_tokens: int
    threads: int | None
    hidden_size: int | None
    num_hidden_layers: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    num_experts: int | None
    num_experts_per_tok: int | None
    vocab_size: int | None

    def __post_init__(self) -> None:
        check_text("server.checkpoint", self.checkpoint, example="out/tiny/tiny_teacher.pth")
        self._check_checkpoint()
        check_text("server.tokenizer", self.tokenizer, optional=True)
        check_text("server.model", self.model, optional=True)
        self._check_common()
        check_integer("server.max_batch_size", self.max_batch_size, 1)
        check_integer("server.max_prefill_tokens", self.max_prefill_tokens, 1)
        check_integer("server.threads", self.threads, 1, optional=True)
        for key in LOCAL_ARCH_KEYS:
            check_integer(f"server.{key}", getattr(self, key), 1, optional=True)

    def _check_checkpoint(self) -> None:
        """A native ``.pth`` (``.pt``) must be a file, a local HF model folder a folder; a hub id is downloaded by
        the server. Checked here, before any file is opened or the server started (which would die on it)."""
        path, key = Path(self.checkpoint).expanduser(), f"server.checkpoint={self.checkpoint}"
        hint = ("point server.checkpoint at a MiniMind .pth file, an HF model folder or a hub id "
                "(`make tiny` writes the tiny presets' files)")
        if self.checkpoint.endswith((".pth", ".pt")):
            if path.is_dir():
                raise SettingsError(f"{key} is a folder, not a MiniMind .pth file", hint)
            if not path.is_file():
                raise SettingsError(f"{key}: no such file", hint)
            if not os.access(path, os.R_OK):
                raise SettingsError(f"{key} is not readable (permission denied)", hint)
        elif looks_like_local_path(self.checkpoint) and not path.is_dir():
            raise SettingsError(f"{key}: no such model folder", hint)

    @property
    def served_model(self) -> str:
        """The id /v1/models lists: ``model``, else the checkpoint path (as vLLM names a model by its path)."""
        return self.model or self.checkpoint


ServerSettings = ExternalServer | VllmServer | LocalServer
SERVER_KINDS = {cls.kind: cls for cls in (ExternalServer, VllmServer, LocalServer)}


def server_settings(block: Mapping) -> ServerSettings:
    """The ``server`` block (plain values, every key given) as its kind's dataclass."""
    block = dict(block)
    kind = block.pop("kind", None)
    if kind not in SERVER_KINDS:
        _refuse("server.kind", "one of " + ", ".join(SERVER_KINDS), kind)
    schema = SERVER_KINDS[kind]
    for key in getattr(schema, "IGNORED_KEYS", ()):
        block.pop(key, None)
    return parse_block(schema, block, "server.")


@dataclass
class RegenSettings:
    """One regen run's settings (``configs/regen.yaml``), checked and normalized."""

    dataset: DatasetSettings
    server: Any  # the server block; becomes its kind's dataclass (ServerSettings)
    sampling: Any  # a mapping of sampling parameters (null ones are not sent)
    tokenizer: str | None
    output: str | None
    output_dir: str
    resume: bool
    resume_accept_changes: bool
    limit: int | None
    language_filter: Any  # a string or null
    max_tokens: int
    concurrency: Any  # auto, or an integer
    concurrency_start: int
    concurrency_max: int
    concurrency_interval_s: float
    request_timeout_s: float
    max_reply_mib: float | None
    max_retries: int
    retry_backoff_s: float
    max_backoff_s: float
    endpoint_max_failures: int
    endpoint_reprobe_s: float
    all_endpoints_down_wait_s: float
    carry_reasoning: bool
    api_key_env: str | None
    extra_request_params: Any  # a mapping or null; becomes a dict
    reasoning_effort_weights: Any  # a mapping option -> weight or null; becomes a WeightedChoice
    temperature_weights: Any  # the same
    mix_seed: int
    progress_log_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.server, Mapping):
            _refuse("server", "a server block (server=vllm, external or local)", self.server)
        self.server = server_settings(self.server)
        check_text("tokenizer", self.tokenizer, optional=True)
        check_text("output", self.output, optional=True, example="out/regen/my_run.jsonl")
        check_text("output_dir", self.output_dir)
        check_integer("limit", self.limit, 0, optional=True, example="1000")
        if self.language_filter is not None and not isinstance(self.language_filter, str):
            _refuse("language_filter", "a string (the row's language column, e.g. EN) or null",
                    self.language_filter, "EN")
        check_integer("max_tokens", self.max_tokens, 1, example="8192")
        if getattr(self.server, "max_model_len", None) is not None:
            check_max_tokens_fit(self.max_tokens, self.server.max_model_len, "server.max_model_len")
        if self.concurrency != "auto" and not (_is_int(self.concurrency) and self.concurrency >= 1):
            raise SettingsError(f"concurrency must be auto or an integer >= 1, got {self.concurrency!r}",
                                "set it like concurrency=auto (adapts to each endpoint) or concurrency=64")
        check_integer("concurrency_start", self.concurrency_start, 1, example="64")
        check_integer("concurrency_max", self.concurrency_max, 1, example="1024")
        if self.concurrency_start > self.concurrency_max:
            raise SettingsError(f"concurrency_start={self.concurrency_start} is more than "
                                f"concurrency_max={self.concurrency_max}", "lower concurrency_start or raise concurrency_max")
        check_number("concurrency_interval_s", self.concurrency_interval_s, 0, exclusive=True, example="2")
        check_number("request_timeout_s", self.request_timeout_s, 0, exclusive=True, example="1800")
        check_number("max_reply_mib", self.max_reply_mib, 0, exclusive=True, optional=True, example="64")
        check_integer("max_retries", self.max_retries, 0, example="6")
        check_number("retry_backoff_s", self.retry_backoff_s, 0)
        check_number("max_backoff_s", self.max_backoff_s, 0)
        check_integer("endpoint_max_failures", self.endpoint_max_failures, 1)
        check_number("endpoint_reprobe_s", self.endpoint_reprobe_s, 0, exclusive=True)
        check_number("all_endpoints_down_wait_s", self.all_endpoints_down_wait_s, 0)
        check_number("progress_log_s", self.progress_log_s, 0, exclusive=True)
        self._check_sampling()
        self._check_extra_request_params()
        self.reasoning_effort_weights = WeightedChoice.parse("reasoning_effort_weights",
                                                             self.reasoning_effort_weights, str)
        self.temperature_weights = WeightedChoice.parse("temperature_weights", self.temperature_weights, _temperature)
        if self.api_key_env is not None:
            check_text("api_key_env", self.api_key_env, example="VLLM_API_KEY")
            if not os.environ.get(self.api_key_env):
                raise SettingsError(f"api_key_env={self.api_key_env}: that environment variable is not set",
                                    f"export {self.api_key_env}=<your key> first, or drop api_key_env")

    def _check_sampling(self) -> None:
        if not isinstance(self.sampling, Mapping):
            _refuse("sampling", "a mapping of sampling parameters", self.sampling)
        for key, value in self.sampling.items():
            integer, low, exclusive, high = SAMPLING_RANGES.get(key, (False, None, False, None))
            if integer:
                check_integer(f"sampling.{key}", value, low, optional=True)
            else:
                check_number(f"sampling.{key}", value, low, exclusive=exclusive, maximum=high, optional=True)

    def _check_extra_request_params(self) -> None:
        extra = self.extra_request_params
        if extra is None:
            self.extra_request_params = {}
            return
        if not isinstance(extra, Mapping):
            _refuse("extra_request_params", "a mapping merged into every request", extra,
                    "'{chat_template_kwargs: {enable_thinking: false}}'")
        clash = sorted(OWN_REQUEST_KEYS & set(extra))
        if clash:
            raise SettingsError(f"extra_request_params may not set {clash}: regen owns those request keys",
                                "use max_tokens=, server.model= and the dataset's own tools instead")
        for key, (refused, reason) in REFUSED_REQUEST_PARAMS.items():
            if key in extra and refused(extra[key]):
                raise SettingsError(f"extra_request_params.{key}={extra[key]!r} is refused: {reason}")
        check_finite_values("extra_request_params", extra)
        self.extra_request_params = string_keys("extra_request_params", extra)
        try:
            orjson.dumps(self.extra_request_params)
        except TypeError as error:
            raise SettingsError(f"extra_request_params cannot be sent as JSON: {error}") from None

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping) -> RegenSettings:
        """Check the composed config (``configs/regen.yaml``) and return its settings."""
        plain = _plain_config(cfg)
        if not isinstance(plain.get("dataset"), Mapping):
            raise SettingsError("no dataset chosen", "add dataset=<preset> (e.g. dataset=magpie) or "
                                "dataset=local dataset.path=FILE.jsonl")
        return parse_block(cls, plain)

    @property
    def served_model(self) -> str | None:
        """The model id requests use, when the settings alone tell it (else the endpoints' /v1/models does)."""
        return self.server.served_model

    @property
    def max_reply_bytes(self) -> int:
        """The largest reply body a request may get: ``max_reply_mib``, else 8 MiB (the prompt's ids, the JSON
        around them) + 512 bytes per ``max_tokens`` (a generated token's id, text, reasoning and tool-call share)."""
        if self.max_reply_mib is not None:
            return int(self.max_reply_mib * (1 << 20))
        return (8 << 20) + 512 * self.max_tokens

    @property
    def fixed_concurrency(self) -> int | None:
        """``concurrency`` as a number, or ``None`` for ``auto`` (each endpoint's in-flight count adapts)."""
        return None if self.concurrency == "auto" else self.concurrency


def _plain_config(cfg: DictConfig | Mapping) -> dict:
    """The config as plain values; a missing required value (``???``) or a broken interpolation is refused."""
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    plain: dict = {}
    for key in cfg:
        if key == "hydra":
            continue
        try:
            value = cfg[key]
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        except MissingMandatoryValue as error:
            full_key = str(error.full_key or key)
            raise SettingsError(f"{full_key} is required", _missing_hint(full_key, cfg)) from None
        except OmegaConfBaseException as error:
            raise SettingsError(f"{error.full_key or key}: {str(error).splitlines()[0]}") from None
        plain[key] = value
    return plain


def _missing_hint(key: str, cfg: DictConfig) -> str:
    if key == "server.model":
        return ("add server.model=<hub id or model folder> (e.g. server.model=Qwen/Qwen3-8B) for "
                f"server={cfg.server.get('kind', 'vllm')}, or use server=external 'server.endpoints=[URL]'")
    if key == "dataset.path":
        return "add dataset.path=FILE.jsonl"
    if key == "server.endpoints":
        return "add 'server.endpoints=[http://127.0.0.1:8000]'"
    return f"add {key}=<value>"

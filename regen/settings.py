"""Every regen setting as typed dataclasses, checked once at start (``RegenSettings.from_config(cfg)``).

Any bad key or value is a ``ConfigError`` naming the key, raised before a server starts or a file is touched; the
rest of regen takes the values as given. Defaults live only in the YAML under ``configs/``. The schema imports no
regen runtime module (``rows.formats`` imports the format names from here).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
from omegaconf import DictConfig

from common.config_schema import (
    ConfigError,
    auto_or_count,
    check_choice,
    check_integer,
    check_number,
    check_text,
    flattened,
    is_int,
    parse_config,
    parsed_by,
    refuse,
)
from common.endpoints.address import EndpointAddress, parse_endpoint
from common.minimind.spec import ModelSpec
from common.minimind.tokenizer import looks_like_local_path

LOCAL_SUFFIXES = (".json", ".jsonl")
# The row formats ``regen.rows.formats`` reads (``dataset.format``), and those refused with the reason.
FORMAT_NAMES = ("auto", "messages", "sharegpt", "hermes_fc", "gsm8k", "nemotron")
REFUSED_FORMATS = {
    "sharegpt4v": (
        "is multimodal (COCO images in user turns) and regen sends text-only chat requests, so the target "
        "would answer without seeing the images. Regenerate it with a vision-language pipeline of your own "
        "and prepare that output off-policy (speculators prepare-data), or pick a text dataset preset."
    ),
}

# Request keys regen sets itself; extra_request_params may not touch them.
OWN_REQUEST_KEYS = frozenset({"model", "messages", "max_tokens", "return_token_ids", "tools", "tool_choice", "logprobs",
                              "top_logprobs", "return_tokens_as_token_ids"})
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


def check_max_tokens_fit(max_tokens: int, max_model_len: int, source: str) -> None:
    """vLLM refuses every request whose ``max_tokens`` is above the model's ``max_model_len`` (HTTP 400)."""
    if max_tokens > max_model_len:
        raise ConfigError(
            f"max_tokens={max_tokens} is more than the model's max_model_len={max_model_len} ({source}): "
            "the server would refuse every request",
            f"set max_tokens={max_model_len} or lower (vLLM caps each reply at max_model_len minus its prompt), "
            f"or serve the model with --max-model-len {max_tokens} or more")


def check_finite_values(key: str, value: Any) -> None:
    """Every number inside ``value`` (nested mappings/lists) is finite (NaN would be sent as null)."""
    stack = [(key, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(f"{where} is {item}: only finite numbers can be sent in a request")
        if isinstance(item, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))


def string_keys(key: str, value: Any) -> Any:
    """``value`` with every mapping's integer keys as strings (``logit_bias: {21: 100}`` from YAML); other
    non-string keys, and two keys that become one, are refused."""
    if isinstance(value, Mapping):
        converted: dict[str, Any] = {}
        for name, item in value.items():
            if isinstance(name, bool) or not isinstance(name, int | str):
                raise ConfigError(f"{key} has the key {name!r} ({type(name).__name__}): request keys are strings "
                                    "(integers become strings)")
            if str(name) in converted:
                raise ConfigError(f"{key} has the key {str(name)!r} twice (as a string and as a number)")
            converted[str(name)] = string_keys(f"{key}.{name}", item)
        return converted
    if isinstance(value, list | tuple):
        return [string_keys(f"{key}[{index}]", item) for index, item in enumerate(value)]
    return value


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
            refuse(key, "a mapping of value -> weight", value, "{low: 0.3, high: 0.7}")
        options, weights = [], []
        for option, weight in value.items():
            try:
                options.append(parse_option(option))
            except ValueError:
                raise ConfigError(f"{key}: {option!r} is not a valid value") from None
            check_number(f"{key}.{option}", weight, 0.0)
            weights.append(float(weight))
        if sum(weights) <= 0:
            raise ConfigError(f"{key}: the weights must not all be 0")
        return cls(tuple(options), tuple(weights))


def _temperature(option: Any) -> float:
    value = float(option)
    if not math.isfinite(value) or value < 0:
        raise ValueError(option)
    return value


def _effort_weights(key: str, value: Any) -> WeightedChoice | None:
    return WeightedChoice.parse(key, value, str)


def _temperature_weights(key: str, value: Any) -> WeightedChoice | None:
    return WeightedChoice.parse(key, value, _temperature)


def _endpoints(key: str, value: Any) -> tuple[EndpointAddress, ...]:
    """``server.endpoints``: a list of URLs (or one), each an :class:`EndpointAddress`, none twice."""
    given = [value] if isinstance(value, str) else value
    if not isinstance(given, list | tuple) or not given:
        raise ConfigError(f"{key} is empty", "give one or more base URLs, e.g. 'server.endpoints=[http://127.0.0.1:8000]'")
    addresses = []
    for position, text in enumerate(given):
        try:
            addresses.append(parse_endpoint(text))
        except ValueError as error:
            raise ConfigError(f"{key}[{position}]: {error}",
                              "write it like http://host:8000 (or .../v1, .../v1/chat/completions)") from None
    urls = [address.chat_url for address in addresses]
    if len(set(urls)) != len(urls):
        duplicate = next(url for url in urls if urls.count(url) > 1)
        raise ConfigError(f"{key} names {duplicate} twice", "list each server once")
    return tuple(addresses)


def _gpus(key: str, value: Any) -> tuple[int, ...] | None:
    """``server.gpus``: GPU indices as a list, one index or "0,1,2"; null: not set."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [value] if is_int(value) else value
    try:
        ids = tuple(int(str(g).strip()) for g in items)
    except (TypeError, ValueError):
        ids = ()
    if not ids or min(ids) < 0:
        refuse(key, "GPU indices (a list, or 0,1,2)", value, "[0,1,2,3]")
    return ids


def _language(key: str, value: Any) -> str | None:
    """``language_filter``: a string or null (refused rather than converted, as OmegaConf would turn 1 into "1")."""
    if value is not None and not isinstance(value, str):
        refuse(key, "a string (the row's language column, e.g. EN) or null", value, "EN")
    return value


def _concurrency(key: str, value: Any) -> int | str:
    """``concurrency``: ``auto`` or an integer >= 1."""
    return auto_or_count(key, value, "adapts to each endpoint", 64)


def _request_params(key: str, value: Any) -> dict[str, Any]:
    """``extra_request_params``: a mapping merged into every request (null: none), refused where it would set what
    regen owns or break one row per generation."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        refuse(key, "a mapping merged into every request", value, "'{chat_template_kwargs: {enable_thinking: false}}'")
    clash = sorted(OWN_REQUEST_KEYS & set(value))
    if clash:
        raise ConfigError(f"{key} may not set {clash}: regen owns those request keys",
                          "use max_tokens=, top_logprobs=, server.model= and the dataset's own tools instead")
    for name, (refused, reason) in REFUSED_REQUEST_PARAMS.items():
        if name in value and refused(value[name]):
            raise ConfigError(f"{key}.{name}={value[name]!r} is refused: {reason}")
    check_finite_values(key, value)
    params = string_keys(key, value)
    try:
        orjson.dumps(params)
    except TypeError as error:
        raise ConfigError(f"{key} cannot be sent as JSON: {error}") from None
    return params


@dataclass
class DatasetSettings:
    """Where rows come from (``dataset`` group): a hub dataset or a local ``.json``/``.jsonl`` file."""

    MISSING_HINTS: ClassVar[dict[str, str]] = {"path": "add dataset.path=FILE.jsonl"}
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
        if self.format in REFUSED_FORMATS:
            raise ConfigError(f"dataset {self.label} {REFUSED_FORMATS[self.format]}")
        if self.format not in FORMAT_NAMES:
            raise ConfigError(f"dataset.format={self.format!r} is unknown",
                              f"choose one of {', '.join(sorted(FORMAT_NAMES))}")
        if self.source == "hf" and not self.split:
            raise ConfigError(f"dataset.split is required for the hub dataset {self.path}",
                              "add dataset.split=train (or the split you want)")
        if self.source == "local":
            self._check_local_file()

    def _check_local_file(self) -> None:
        path = Path(self.path)
        if path.suffix.lower() not in LOCAL_SUFFIXES:
            raise ConfigError(f"dataset.path={self.path}: a local dataset must be a .json (top-level array) "
                              "or .jsonl file", "convert it, or point dataset.path at a .jsonl file")
        if not path.is_file():
            raise ConfigError(f"dataset file not found: {path}", "check dataset.path= (relative paths start "
                              "at the folder you run regen from)")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"dataset file {path} is not readable (permission denied)",
                              "fix its permissions or copy it somewhere you can read")

    @property
    def label(self) -> str:
        return self.name or self.path


@dataclass
class ExternalServer:
    """``server=external``: endpoints that already run; regen starts and stops nothing."""

    kind: ClassVar[str] = "external"
    MISSING_HINTS: ClassVar[dict[str, str]] = {"endpoints": "add 'server.endpoints=[http://127.0.0.1:8000]'"}
    endpoints: tuple[EndpointAddress, ...] = parsed_by(_endpoints)
    model: str | None

    def __post_init__(self) -> None:
        check_text("server.model", self.model, optional=True)

    @property
    def served_model(self) -> str | None:
        return self.model


@dataclass
class _ManagedServer:
    """What the ``vllm`` and ``local`` kinds share: where the server listens and how it is stopped."""

    kind: ClassVar[str]
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
            refuse("server.port", "a TCP port (1..65535)", self.port, "8000")
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


@dataclass
class VllmServer(_ManagedServer):
    """``server=vllm``: ``launch/vllm.sh`` starts ``vllm serve`` (single node, or the head of a multi-node DP run)."""

    kind: ClassVar[str] = "vllm"
    MISSING_HINTS: ClassVar[dict[str, str]] = {
        "model": "add server.model=<hub id or model folder> (e.g. server.model=Qwen/Qwen3-8B) for server=vllm, "
                 "or use server=external 'server.endpoints=[URL]'"}
    model: str
    dp: int
    tp: int
    dp_local: int | None
    dp_address: str | None
    dp_rpc_port: int | None
    gpus: tuple[int, ...] | None = parsed_by(_gpus)  # CUDA_VISIBLE_DEVICES for the server
    extra_args: list[str]

    def __post_init__(self) -> None:
        check_text("server.model", self.model, example="Qwen/Qwen3-8B")
        self._check_common()
        check_integer("server.dp", self.dp, 1, example="4")
        check_integer("server.tp", self.tp, 1, example="2")
        check_integer("server.dp_local", self.dp_local, 0, optional=True)
        if self.dp_local is not None and self.dp_local > self.dp:
            raise ConfigError(f"server.dp_local={self.dp_local} is more than server.dp={self.dp}",
                              "dp_local is how many of the dp ranks run on this (the head) node")
        check_text("server.dp_address", self.dp_address, optional=True, example="10.0.0.1")
        check_integer("server.dp_rpc_port", self.dp_rpc_port, 1, optional=True, example="13345")
        if self.dp_local is not None and self.dp_local < self.dp and not (self.dp_address and self.dp_rpc_port):
            raise ConfigError("a multi-node head (server.dp_local < server.dp) needs server.dp_address and "
                              "server.dp_rpc_port", "add server.dp_address=<this node's IP> server.dp_rpc_port=13345")

    @property
    def served_model(self) -> str:
        return self.model


# Architecture flags of the model spec that server=local passes to the embedded server's CLI (besides use_moe).
LOCAL_ARCH_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "num_experts", "num_experts_per_tok", "vocab_size")


@dataclass
class LocalServer(_ManagedServer):
    """``server=local``: the embedded CPU server (``launch/chat_server.py``); the model preset's keys sit flat in the
    ``server`` block (``server.checkpoint``, ``server.hidden_size`` ...)."""

    kind: ClassVar[str] = "local"
    model_spec: ModelSpec = flattened()
    model: str | None  # the served model name; null: the checkpoint path
    max_batch_size: int
    max_prefill_tokens: int
    threads: int | None

    def __post_init__(self) -> None:
        spec = self.model_spec
        check_text("server.checkpoint", spec.checkpoint, example="out/tiny/tiny_teacher.pth")
        self._check_checkpoint()
        check_text("server.tokenizer", spec.tokenizer, optional=True)
        check_text("server.model", self.model, optional=True)
        self._check_common()
        check_integer("server.max_batch_size", self.max_batch_size, 1)
        check_integer("server.max_prefill_tokens", self.max_prefill_tokens, 1)
        check_integer("server.threads", self.threads, 1, optional=True)
        for key in LOCAL_ARCH_KEYS:
            check_integer(f"server.{key}", getattr(spec, key), 1, optional=True)

    def _check_checkpoint(self) -> None:
        """A ``.pth``/``.pt`` must be a readable file, a local HF model a folder; a hub id is left to the server."""
        checkpoint = self.model_spec.checkpoint
        path, key = Path(checkpoint).expanduser(), f"server.checkpoint={checkpoint}"
        hint = ("point server.checkpoint at a MiniMind .pth file, an HF model folder or a hub id "
                "(`onpolicy-tiny` writes the tiny presets' files)")
        if checkpoint.endswith((".pth", ".pt")):
            if path.is_dir():
                raise ConfigError(f"{key} is a folder, not a MiniMind .pth file", hint)
            if not path.is_file():
                raise ConfigError(f"{key}: no such file", hint)
            if not os.access(path, os.R_OK):
                raise ConfigError(f"{key} is not readable (permission denied)", hint)
        elif looks_like_local_path(checkpoint) and not path.is_dir():
            raise ConfigError(f"{key}: no such model folder", hint)

    @property
    def served_model(self) -> str:
        """The id /v1/models lists: ``model``, else the checkpoint path (as vLLM names a model by its path)."""
        return self.model or self.model_spec.checkpoint

    @property
    def tokenizer(self) -> str | None:
        """The preset's tokenizer, used for the row text unless ``tokenizer=`` names one."""
        return self.model_spec.tokenizer


ServerSettings = ExternalServer | VllmServer | LocalServer


@dataclass
class RegenSettings:
    """One regen run's settings (``configs/regen.yaml``), checked and normalized."""

    dataset: DatasetSettings
    server: ExternalServer | VllmServer | LocalServer  # picked by server.kind
    sampling: dict[str, Any]  # sampling parameters (null ones are not sent)
    tokenizer: str | None
    output: str | None
    output_dir: str
    resume: bool
    resume_accept_changes: bool
    limit: int | None
    language_filter: str | None = parsed_by(_language)
    max_tokens: int
    concurrency: int | str = parsed_by(_concurrency)  # auto, or an integer
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
    top_logprobs: int | None  # k: each generated token's top-k log-probabilities stored in its row
    api_key_env: str | None
    extra_request_params: dict[str, Any] = parsed_by(_request_params)
    reasoning_effort_weights: WeightedChoice | None = parsed_by(_effort_weights)
    temperature_weights: WeightedChoice | None = parsed_by(_temperature_weights)
    mix_seed: int
    progress_log_s: float

    def __post_init__(self) -> None:
        check_text("tokenizer", self.tokenizer, optional=True)
        check_text("output", self.output, optional=True, example="out/regen/my_run.jsonl")
        check_text("output_dir", self.output_dir)
        check_integer("limit", self.limit, 0, optional=True, example="1000")
        check_integer("max_tokens", self.max_tokens, 1, example="8192")
        check_integer("top_logprobs", self.top_logprobs, 1, optional=True, example="20")
        if getattr(self.server, "max_model_len", None) is not None:
            check_max_tokens_fit(self.max_tokens, self.server.max_model_len, "server.max_model_len")
        check_integer("concurrency_start", self.concurrency_start, 1, example="64")
        check_integer("concurrency_max", self.concurrency_max, 1, example="1024")
        if self.concurrency_start > self.concurrency_max:
            raise ConfigError(f"concurrency_start={self.concurrency_start} is more than "
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
        for key, value in self.sampling.items():
            integer, low, exclusive, high = SAMPLING_RANGES.get(key, (False, None, False, None))
            if integer:
                check_integer(f"sampling.{key}", value, low, optional=True)
            else:
                check_number(f"sampling.{key}", value, low, exclusive=exclusive, maximum=high, optional=True)
        if self.api_key_env is not None:
            check_text("api_key_env", self.api_key_env, example="VLLM_API_KEY")
            if not os.environ.get(self.api_key_env):
                raise ConfigError(f"api_key_env={self.api_key_env}: that environment variable is not set",
                                  f"export {self.api_key_env}=<your key> first, or drop api_key_env")

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping) -> RegenSettings:
        """Check the composed config (``configs/regen.yaml``) and return its settings."""
        if not isinstance(cfg.get("dataset"), Mapping):
            raise ConfigError("no dataset chosen", "add dataset=<preset> (e.g. dataset=magpie) or "
                              "dataset=local dataset.path=FILE.jsonl")
        return parse_config(cls, cfg)

    @property
    def served_model(self) -> str | None:
        """The model id requests use, when the settings alone tell it (else the endpoints' /v1/models does)."""
        return self.server.served_model

    @property
    def max_reply_bytes(self) -> int:
        """The largest reply body a request may get: ``max_reply_mib``, else 8 MiB + 512 bytes per ``max_tokens``
        (and 160 more per stored log-probability with ``top_logprobs``)."""
        if self.max_reply_mib is not None:
            return int(self.max_reply_mib * (1 << 20))
        per_token = 512 + (160 * (self.top_logprobs + 1) if self.top_logprobs else 0)
        return (8 << 20) + per_token * self.max_tokens

    @property
    def fixed_concurrency(self) -> int | None:
        """``concurrency`` as a number, or ``None`` for ``auto`` (each endpoint's in-flight count adapts)."""
        return None if self.concurrency == "auto" else self.concurrency

"""The settings schema: every value checked once at start, with a message naming the key and what to type."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

import regen.settings
from common.config_schema import ConfigError
from regen.job import run
from regen.settings import RegenSettings, WeightedChoice, string_keys
from tests.helpers.configs import compose_config
from tests.helpers.regen_support import regen_config, write_jsonl


@pytest.fixture
def settings_of(tmp_path, tokenizer_path):
    """``RegenSettings`` of a local-file, external-endpoint config with these overrides."""
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Hi"}])

    def make(*overrides: str) -> RegenSettings:
        return RegenSettings.from_config(regen_config(tmp_path, ["http://127.0.0.1:9"], data, tokenizer_path, *overrides))

    return make


def test_a_composed_config_becomes_typed_settings(settings_of):
    settings = settings_of("sampling=qwen3_thinking", "reasoning_effort_weights={low: 1, high: 3}",
                           "temperature_weights={0.6: 1}", "extra_request_params={n: 1, top_k: 5}")
    assert settings.sampling["temperature"] == 0.6 and settings.concurrency == 4
    assert settings.reasoning_effort_weights == WeightedChoice(("low", "high"), (1.0, 3.0))
    assert settings.temperature_weights == WeightedChoice((0.6,), (1.0,))
    assert settings.server.endpoints[0].chat_url == "http://127.0.0.1:9/v1/chat/completions"
    assert settings.request_timeout_s == 1800 and settings.resume_accept_changes is False


@pytest.mark.parametrize("override,message,hint", [
    ("concurrency=0", "concurrency must be auto or an integer >= 1, got 0",
     "set it like concurrency=auto (adapts to each endpoint) or concurrency=64"),
    ("concurrency=2.5", "concurrency must be auto or an integer >= 1, got 2.5", None),
    ("concurrency=many", "concurrency must be auto or an integer >= 1, got 'many'", None),
    ("concurrency_max=0", "concurrency_max must be an integer >= 1, got 0", "set it like concurrency_max=1024"),
    ("concurrency_start=2000", "concurrency_start=2000 is more than concurrency_max=1024",
     "lower concurrency_start or raise concurrency_max"),
    ("concurrency_interval_s=0", "concurrency_interval_s must be a finite number > 0, got 0",
     "set it like concurrency_interval_s=2"),
    ("max_retries=-1", "max_retries must be an integer >= 0", None),
    ("request_timeout_s=0", "request_timeout_s must be a finite number > 0", None),
    ("request_timeout_s=nan", "request_timeout_s must be a finite number > 0, got nan", None),
    ("limit=-3", "limit must be an integer >= 0 or null", None),
    ("resume=maybe", "resume must be true or false, got 'maybe'", None),
    ("language_filter=1", "language_filter must be a string (the row's language column, e.g. EN) or null, got 1",
     "set it like language_filter=EN"),
    ("extra_request_params=[1]", "extra_request_params must be a mapping merged into every request", None),
    ("sampling.temperature=hot", "sampling.temperature must be a finite number >= 0 or null, got 'hot'", None),
    ("sampling.top_p=1.5", "sampling.top_p must be a finite number > 0 and <= 1 or null", None),
    ("sampling.seed=0.5", "sampling.seed must be an integer or null", None),
    ("temperature_weights={hot: 1}", "temperature_weights: 'hot' is not a valid value", None),
    ("reasoning_effort_weights={low: -1}", "reasoning_effort_weights.low must be a finite number >= 0", None),
    ("reasoning_effort_weights={low: 0}", "reasoning_effort_weights: the weights must not all be 0", None),
    ("dataset.format=csv", "dataset.format='csv' is unknown", "choose one of auto, gsm8k, hermes_fc, messages, "
     "nemotron, sharegpt"),
    ("+no_such_key=1", "unknown setting no_such_key", None),
    ("server.endpoints=[ftp://x]", "server.endpoints[0]: 'ftp://x' is not an http(s)://host:port URL", None),
    ("server.endpoints=[http://h:1,http://h:1/v1]", "server.endpoints names http://h:1/v1/chat/completions twice",
     None),
])
def test_bad_values_are_refused_naming_the_key(settings_of, override, message, hint):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        settings_of(override)
    assert hint is None or refused.value.hint == hint


@pytest.mark.parametrize("extra,reason", [
    ("{n: 2}", "extra_request_params.n=2 is refused: regen writes one row per generation and reads choices[0] only"),
    ("{include_reasoning: false}", "extra_request_params.include_reasoning=False is refused: vLLM then leaves "
                                   "token_ids out of the reply"),
    ("{stream: true}", "extra_request_params.stream=True is refused: regen reads whole replies"),
    ("{echo: true}", "extra_request_params.echo=True is refused"),
    ("{max_completion_tokens: 10}", "set max_tokens=N instead"),
    ("{model: other, max_tokens: 1}", "extra_request_params may not set ['max_tokens', 'model']: regen owns those"),
    ("{chat_template_kwargs: {x: nan}}", "extra_request_params.chat_template_kwargs.x is nan: only finite numbers"),
])
def test_request_settings_that_would_break_rows_are_refused_with_the_reason(settings_of, extra, reason):
    with pytest.raises(ConfigError, match=re.escape(reason)):
        settings_of(f"extra_request_params={extra}")


def test_missing_required_values_say_what_to_add():
    with pytest.raises(ConfigError, match=r"^server.model is required$") as refused:
        RegenSettings.from_config(compose_config("regen", ["dataset=magpie", "server.dp=4"], hydra_config=True))
    assert refused.value.hint.startswith("add server.model=<hub id or model folder> (e.g. server.model=Qwen/Qwen3-8B)")
    with pytest.raises(ConfigError, match="dataset.path is required"):
        RegenSettings.from_config(compose_config("regen", ["dataset=local", "server=external",
                                                           "server.endpoints=[http://h:1]"], hydra_config=True))


def test_server_blocks_are_checked_for_their_kind(tmp_path):
    def vllm(*overrides):
        return RegenSettings.from_config(compose_config("regen", ["dataset=sample", "server.model=m", *overrides], hydra_config=True))

    assert vllm("server.gpus=[0,1]").server.gpus == (0, 1)
    assert vllm("server.dp=4", "server.dp_local=2", "server.dp_address=10.0.0.1", "server.dp_rpc_port=13345"
                ).server.dp_local == 2
    with pytest.raises(ConfigError, match="server.dp_local=5 is more than server.dp=4"):
        vllm("server.dp=4", "server.dp_local=5")
    with pytest.raises(ConfigError, match="needs server.dp_address and server.dp_rpc_port"):
        vllm("server.dp=4", "server.dp_local=2")
    with pytest.raises(ConfigError, match=r"server.port must be a TCP port \(1..65535\), got 70000"):
        vllm("server.port=70000")
    with pytest.raises(ConfigError, match="server.gpus must be GPU indices"):
        vllm("server.gpus=[a]")
    checkpoint = tmp_path / "tiny_teacher.pth"
    checkpoint.write_bytes(b"weights")

    def local(*overrides):
        return RegenSettings.from_config(compose_config("regen", ["dataset=sample", "server=local", *overrides],
                                                        hydra_config=True)).server

    served = local(f"server.checkpoint={checkpoint}")
    assert (served.served_model, served.model_spec.hidden_size, served.port) == (str(checkpoint), 128, 8011)
    with pytest.raises(ConfigError, match="server.max_batch_size must be an integer >= 1"):
        local(f"server.checkpoint={checkpoint}", "server.max_batch_size=0")


@pytest.mark.parametrize("checkpoint,refusal", [
    ("missing.pth", "server.checkpoint={tmp}/missing.pth: no such file"),
    ("folder.pth", "server.checkpoint={tmp}/folder.pth is a folder, not a MiniMind .pth file"),
    ("no_model", "server.checkpoint={tmp}/no_model: no such model folder"),
    ("org/hub-model", None),  # a hub id: the server downloads it
])
def test_the_local_servers_checkpoint_is_checked_with_the_settings(tmp_path, checkpoint, refusal):
    """Before any file or server: a missing checkpoint used to start the server, which died with a traceback."""
    (tmp_path / "folder.pth").mkdir()
    path = checkpoint if checkpoint.startswith("org/") else tmp_path / checkpoint
    cfg = compose_config("regen", ["dataset=sample", "server=local", f"server.checkpoint={path}"], hydra_config=True)
    if refusal is None:
        assert RegenSettings.from_config(cfg).server.model_spec.checkpoint == checkpoint
        return
    with pytest.raises(ConfigError) as refused:
        RegenSettings.from_config(cfg)
    assert str(refused.value) == refusal.format(tmp=tmp_path)
    assert refused.value.hint.startswith("point server.checkpoint at")


def test_dataset_files_are_checked_before_anything_starts(tmp_path, tokenizer_path):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Hi"}])
    with pytest.raises(ConfigError, match=f"dataset file not found: {re.escape(str(tmp_path / 'gone.jsonl'))}"):
        run(regen_config(tmp_path, ["http://127.0.0.1:9"], data, tokenizer_path, f"dataset.path={tmp_path / 'gone.jsonl'}"))
    with pytest.raises(ConfigError, match=r"a local dataset must be a .json \(top-level array\) or .jsonl file"):
        run(regen_config(tmp_path, ["http://127.0.0.1:9"], data, tokenizer_path, f"dataset.path={tmp_path / 'x.csv'}"))
    assert not (tmp_path / "out.jsonl").exists()


def test_multimodal_preset_is_refused_with_the_reason():
    cfg = compose_config("regen", ["dataset=sharegpt4v-coco", "server=external", "server.endpoints=[http://127.0.0.1:9]"], hydra_config=True)
    with pytest.raises(ConfigError, match="dataset sharegpt4v-coco is multimodal .* text-only"):
        RegenSettings.from_config(cfg)


def test_integer_request_keys_become_strings_as_openai_wants(settings_of):
    """``'extra_request_params={logit_bias: {21: 100}}'`` from the command line (Hydra gives the key as an int;
    before, orjson's 'Dict key must be str' traceback came at the first request, after the files were made)."""
    settings = settings_of("extra_request_params={logit_bias: {21: 100, 22: -5}, stop_token_ids: [2]}")
    assert settings.extra_request_params == {"logit_bias": {"21": 100, "22": -5}, "stop_token_ids": [2]}


@pytest.mark.parametrize("extra,reason", [
    ("{logit_bias: {1.5: 3}}", "extra_request_params.logit_bias has the key 1.5 (float): request keys are strings"),
    ("{logit_bias: {true: 3}}", "extra_request_params.logit_bias has the key True (bool)"),
])
def test_request_keys_that_cannot_be_sent_are_refused(settings_of, extra, reason):
    with pytest.raises(ConfigError, match=re.escape(reason)):
        settings_of(f"extra_request_params={extra}")
    with pytest.raises(ConfigError, match=re.escape("extra_request_params.logit_bias has the key '21' twice")):
        string_keys("extra_request_params", {"logit_bias": {21: 1, "21": 2}})  # a YAML file can say both


def test_the_schema_imports_no_runtime_module():
    """regen's runtime imports the schema (the endpoint address, the format names), never the other way round; and
    checking settings loads no torch (``server=local``'s model spec is ``common.minimind.spec``'s)."""
    tree = ast.parse(open(regen.settings.__file__).read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not [name for name in imported if name.split(".")[0] in ("regen", "opd", "launch")]
    loaded = subprocess.run([sys.executable, "-c", "import sys, regen.settings; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"

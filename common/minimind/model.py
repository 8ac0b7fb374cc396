"""MiniMind-3 checkpoints as transformers Qwen3 / Qwen3-MoE models, loaded strictly. Native ``.pth`` files are fp16
with MiniMind's key names (per-expert weights, both tied keys); keys convert both ways."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import (
    DynamicCache,
    PreTrainedModel,
    Qwen3ForCausalLM,
    Qwen3MoeForCausalLM,
)

from common.atomic_write import atomic_write
from common.minimind.spec import MiniMindArch, ModelSpec, is_native_checkpoint
from common.user_errors import UserError

_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
TIED_METADATA = "tied"  # a native .safetensors file's metadata key naming the tied key left out (lm_head.weight)


class CheckpointMismatchError(UserError):
    """A checkpoint whose keys or shapes do not match the configured architecture."""


def build_model(arch: MiniMindArch) -> PreTrainedModel:
    """A randomly initialised transformers model of this architecture (fp32, CPU)."""
    config = arch.hf_config()
    model_class = Qwen3MoeForCausalLM if arch.use_moe else Qwen3ForCausalLM
    return model_class(config)


def to_native_state_dict(hf_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers key layout -> MiniMind key layout (fused experts split per expert, tied keys kept)."""
    native: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        match = _FUSED_KEY.match(key)
        if not match:
            native[key] = tensor
            continue
        prefix, kind = match.groups()
        for expert, weight in enumerate(tensor):
            if kind == "down_proj":
                native[f"{prefix}.{expert}.down_proj.weight"] = weight
            else:
                gate, up = weight.chunk(2, dim=0)
                native[f"{prefix}.{expert}.gate_proj.weight"] = gate
                native[f"{prefix}.{expert}.up_proj.weight"] = up
    if "lm_head.weight" not in native and "model.embed_tokens.weight" in native:
        native["lm_head.weight"] = native["model.embed_tokens.weight"]
    return native


def to_hf_state_dict(native: Mapping[str, torch.Tensor], expected_keys: set[str]) -> dict[str, torch.Tensor]:
    """MiniMind key layout -> the layout of a transformers model whose keys are ``expected_keys``."""
    fused = any(_FUSED_KEY.match(k) for k in expected_keys)
    if not fused:
        return dict(native)
    hf: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for key, tensor in native.items():
        match = _EXPERT_KEY.match(key)
        if match:
            prefix, expert, kind = match.groups()
            experts.setdefault(prefix, {}).setdefault(int(expert), {})[kind] = tensor
        else:
            hf[key] = tensor
    for prefix, by_expert in experts.items():
        order = sorted(by_expert)
        complete = all({"gate_proj", "up_proj", "down_proj"} <= by_expert[e].keys() for e in order)
        if order != list(range(len(order))) or not complete:
            for e in order:  # leave them unconverted so validation reports them precisely
                for kind, tensor in by_expert[e].items():
                    hf[f"{prefix}.{e}.{kind}.weight"] = tensor
            continue
        hf[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]], dim=0) for e in order]
        )
        hf[f"{prefix}.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in order])
    return hf


def _describe_file(state: Mapping[str, torch.Tensor]) -> dict:
    """Architecture flags that a native state dict implies, for mismatch hints."""
    found: dict = {}
    embed = state.get("model.embed_tokens.weight")
    if embed is not None and embed.ndim == 2:
        found["vocab_size"], found["hidden_size"] = int(embed.shape[0]), int(embed.shape[1])
    layers = {int(m.group(1)) for k in state if (m := _LAYER_KEY.match(k))}
    if layers:
        found["num_hidden_layers"] = max(layers) + 1
    found["use_moe"] = any(".mlp.experts." in k or k.endswith(".mlp.gate.weight") for k in state)
    if found["use_moe"]:
        found["num_experts"] = len({m.group(2) for k in state if (m := _EXPERT_KEY.match(k))}) or None
    q_norm, q_proj, k_proj = (state.get(f"model.layers.0.self_attn.{n}.weight") for n in ("q_norm", "q_proj", "k_proj"))
    if q_norm is not None and q_proj is not None and k_proj is not None:
        head_dim = int(q_norm.shape[0])
        found["num_attention_heads"] = int(q_proj.shape[0]) // head_dim
        found["num_key_value_heads"] = int(k_proj.shape[0]) // head_dim
    return found


def check_native_state_dict(state: Mapping[str, torch.Tensor], arch: MiniMindArch, source: str) -> None:
    """Strict key and shape check of a native state dict against ``arch``, with hints on wrong flags."""
    expected = {k: tuple(v.shape) for k, v in to_native_state_dict(_meta_state(arch)).items()}
    actual = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    non_tensors = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    missing = sorted(expected.keys() - actual.keys())
    unexpected = sorted(actual.keys() - expected.keys())
    wrong_shape = sorted(k for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    if not (missing or unexpected or wrong_shape or non_tensors):
        return
    implied = _describe_file(state)
    hints = [
        f"{name}={implied[name]!r} (configured {getattr(arch, name)!r})"
        for name in ("use_moe", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "num_experts", "vocab_size")
        if implied.get(name) is not None and implied[name] != getattr(arch, name)
    ]
    found = [f"{len(keys)} {label} key(s), e.g. {keys[:2]}" for label, keys in
             (("missing", missing), ("unexpected", unexpected), ("not tensors", non_tensors)) if keys]
    if wrong_shape:
        found.append(f"{len(wrong_shape)} shape mismatch(es), e.g. "
                     + ", ".join(f"{k}: file {actual[k]} vs model {expected[k]}" for k in wrong_shape[:2]))
    # one line of what differs, one of what to do: the flags the file implies, when it implies any
    hint = ("the file looks like " + ", ".join(hints) + ": fix those flags in the model config") if hints else None
    raise CheckpointMismatchError(f"checkpoint {source} does not match the configured architecture {arch}: "
                                  + "; ".join(found), hint)


def _meta_state(arch: MiniMindArch) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return build_model(arch).state_dict()


def load_failure(error: Exception) -> str:
    """Why ``torch.load`` refused a file, in one line (the safe loader's reason, else the first sentence)."""
    text = str(error)
    if reason := re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, re.DOTALL):
        return " ".join(reason.group(1).split())
    first = text.strip().splitlines()[0].split(". ")[0].rstrip(".") if text.strip() else ""
    return first or f"{type(error).__name__}: the file is empty or cut short"


def read_native_state_dict(path: str | Path, *, role: str = "model") -> dict[str, torch.Tensor]:
    """Read a native MiniMind ``.pth`` (plain state dict, or a dict holding one under ``model``), or the same tensors
    as one ``.safetensors`` file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"{role} checkpoint not found: {path} (MiniMind writes inference weights as "
            "{save_dir}/{prefix}_{hidden}{_moe}.pth, e.g. out/agent_768.pth)"
        )
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as stream:
                state = {key: stream.get_tensor(key) for key in stream.keys()}
                tied = (stream.metadata() or {}).get(TIED_METADATA)
        except (SafetensorError, OSError) as error:
            raise UserError(f"{role} checkpoint {path} is not a readable safetensors file ({error})") from None
        if tied == "lm_head.weight" and "model.embed_tokens.weight" in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return state
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt / non-torch files
        raise UserError(f"{role} checkpoint {path} is not a readable torch state dict "
                        f"({load_failure(error)})") from error
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):
        state = state["model"]
    if not isinstance(state, Mapping):
        raise UserError(f"{role} checkpoint {path} holds a {type(state).__name__}, not a state dict")
    return dict(state)


def save_native_safetensors(state: Mapping[str, torch.Tensor], path: str | Path) -> Path:
    """Write a native state dict as one ``.safetensors`` file, atomically, in its own dtypes; a ``lm_head.weight``
    equal to the embedding is stored once (``read_native_state_dict`` restores it, as MiniMind ties them)."""
    from safetensors.torch import save

    tensors = {key: tensor.detach().to("cpu").clone() for key, tensor in state.items()}  # no storage shared
    metadata = {}
    embed, head = tensors.get("model.embed_tokens.weight"), tensors.get("lm_head.weight")
    if embed is not None and head is not None and head.dtype == embed.dtype and torch.equal(head, embed):
        del tensors["lm_head.weight"]
        metadata[TIED_METADATA] = "lm_head.weight"
    payload = save(tensors, metadata=metadata)
    return atomic_write(path, lambda stream: stream.write(payload))


def load_native(path: str | Path, arch: MiniMindArch, *, role: str = "model") -> PreTrainedModel:
    """Build the transformers model for ``arch`` and load a native ``.pth`` into it strictly (fp32)."""
    state = read_native_state_dict(path, role=role)
    check_native_state_dict(state, arch, f"{path} ({role})")
    model = build_model(arch)
    hf_state = to_hf_state_dict(state, set(model.state_dict()))
    model.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=True)
    return model


def native_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """``model``'s weights as a MiniMind inference state dict: MiniMind key names, fp16, on the CPU."""
    return {k: v.detach().to("cpu", torch.float16).contiguous()
            for k, v in to_native_state_dict(model.state_dict()).items()}


def save_native(model: PreTrainedModel, path: str | Path) -> Path:
    """Write ``model`` as a MiniMind inference checkpoint (fp16 plain state dict), atomically."""
    native = native_state_dict(model)
    return atomic_write(path, lambda stream: torch.save(native, stream))


def load_hf(name_or_path: str, *, role: str = "model") -> PreTrainedModel:
    """Load an HF model folder or hub id (fp32) with transformers' own loader."""
    from transformers import AutoModelForCausalLM

    from common.minimind.tokenizer import looks_like_local_path

    text = str(name_or_path)
    local = Path(text).expanduser()
    if looks_like_local_path(text) and not local.exists():
        raise FileNotFoundError(f"{role} model folder not found: {text}")
    if local.is_dir() and not (local / "config.json").is_file():
        raise FileNotFoundError(f"{role} model folder {text} has no config.json (not an HF model folder)")
    if local.exists() and not local.is_dir():
        raise UserError(f"{role}.checkpoint {text} is not a checkpoint: a MiniMind checkpoint is a .pth (or .pt) "
                        "state dict, an HF model a folder with config.json or a hub id")
    try:
        return AutoModelForCausalLM.from_pretrained(str(local) if local.exists() else text, torch_dtype=torch.float32)
    except (OSError, ValueError) as error:  # no weights in the folder, an unknown model type, a hub id not cached
        raise UserError(f"{role}.checkpoint {text}: transformers cannot load it as a model: "
                        f"{str(error).strip().splitlines()[0]}") from None


def check_tokenizer_fits(tokenizer, model: PreTrainedModel, *, role: str = "model", exact: bool = True) -> None:
    """Refuse a tokenizer whose vocabulary size differs from the model's (or exceeds it, for padded HF vocabs)."""
    model_vocab = model.get_input_embeddings().weight.shape[0]
    size = len(tokenizer)
    if size > model_vocab or (exact and size != model_vocab):
        raise UserError(
            f"{role}: tokenizer has {size} tokens but the model's vocabulary is {model_vocab}; "
            "use the tokenizer the checkpoint was trained with"
        )


def load_model(spec: ModelSpec, *, role: str = "model"):
    """A model block's model (fp32, CPU) and tokenizer, checked against each other."""
    from common.minimind.tokenizer import load_tokenizer

    checkpoint, tokenizer_source = spec.checkpoint, spec.tokenizer
    if not checkpoint:
        raise UserError(f"{role}.checkpoint is not set")
    if is_native_checkpoint(checkpoint):
        model = load_native(checkpoint, spec.arch, role=role)
        tokenizer = load_tokenizer(tokenizer_source, role=f"{role}.tokenizer")
        check_tokenizer_fits(tokenizer, model, role=role, exact=True)
    else:
        model = load_hf(checkpoint, role=role)
        tokenizer = load_tokenizer(tokenizer_source or checkpoint, role=f"{role}.tokenizer")
        check_tokenizer_fits(tokenizer, model, role=role, exact=False)
    return model, tokenizer


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward() keyword that takes a KV cache (``cache`` or ``past_key_values``), from the first class in the
    MRO that names one (a ``**kwargs`` wrapper resolves to its base's)."""
    for cls in type(model).__mro__:
        forward = vars(cls).get("forward")
        if forward is None:
            continue
        parameters = inspect.signature(forward).parameters
        for name in ("cache", "past_key_values"):
            if name in parameters:
                return name
    raise TypeError(f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values`")


def prefill_shared_prefix(model: torch.nn.Module, prefix_ids: list[int], rows: int,
                          cache: DynamicCache | None = None) -> DynamicCache:
    """A KV cache (``cache``, else a new ``DynamicCache``) holding ``prefix_ids`` for ``rows`` identical rows, from
    one single-row forward; later forwards compute what full sequences would (gradients too)."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    device = next(model.parameters()).device
    model(input_ids=torch.tensor([prefix_ids], device=device), use_cache=True, logits_to_keep=1,
          **{cache_keyword(model): cache})
    cache.batch_repeat_interleave(rows)
    return cache


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant checkpoints, DDP-safe)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

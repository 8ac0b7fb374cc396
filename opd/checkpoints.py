"""OPD checkpoints: MiniMind inference weights plus a full resume file, both written atomically.

In ``out_dir``: ``agent_opd_{hidden}{_moe}.pth`` (native MiniMind fp16 state dict, ``save_native``) and
``agent_opd_{hidden}{_moe}_resume.pth`` holding the fp32 student weights, optimizer / scheduler / grad-scaler
state, the step, the next data cursor, every RNG state the run consumes, and the run signature: the
settings a continuation must share (teacher, data, architecture, optimizer, sampling, rollout, loss).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from opd.atomic_write import atomic_write
from opd.minimind.model import save_native

RESUME_FORMAT = "opd-resume/1"
RESUME_KEYS = ("format", "model", "optimizer", "scheduler", "scaler", "step", "cursor", "rng", "signature")


class ResumeRefusedError(ValueError):
    """The resume file was written by a run with different settings."""


def checkpoint_stem(model: torch.nn.Module, prefix: str = "agent_opd") -> str:
    """``{prefix}_{hidden}`` plus ``_moe`` for a MoE model (MiniMind's naming, e.g. ``agent_opd_768``)."""
    config = model.config
    return f"{prefix}_{config.hidden_size}{'_moe' if getattr(config, 'num_experts', None) else ''}"


def architecture_of(model: torch.nn.Module) -> dict:
    """The shape-defining fields of a transformers model's config."""
    config = model.config
    names = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok")
    return {name: getattr(config, name, None) for name in names}


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a file's bytes; for an HF folder or hub id, the name itself (``hf:NAME``)."""
    path_obj = Path(str(path)).expanduser()
    if not path_obj.is_file():
        return f"hf:{path}"
    digest = hashlib.sha256()
    with path_obj.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def vocabulary_fingerprint(tokenizer) -> str:
    """sha256 of a tokenizer's sorted vocabulary (token -> id)."""
    return hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()


def save_checkpoint(out_dir: str | Path, student: torch.nn.Module, state: Mapping,
                    prefix: str = "agent_opd") -> tuple[Path, Path]:
    """Write the inference weights and the resume file (``state`` without ``model``/``format``); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = checkpoint_stem(student, prefix)
    weights = save_native(student, out / f"{stem}.pth")
    resume = out / f"{stem}_resume.pth"
    model_state = {k: v.detach().to("cpu", copy=True) for k, v in student.state_dict().items()}
    resume_state = {"format": RESUME_FORMAT, "model": model_state, **state}
    atomic_write(resume, lambda stream: torch.save(resume_state, stream))
    return weights, resume


def load_resume(path: str | Path) -> dict:
    """Read a resume file written by ``save_checkpoint``; refuses anything else with a clear message."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"resume file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt / non-torch files
        raise ValueError(f"resume file {path} is not a readable torch file: {error}") from error
    if not isinstance(state, dict) or state.get("format") != RESUME_FORMAT:
        raise ValueError(f"{path} is not an OPD resume file (expected format {RESUME_FORMAT!r}; "
                         "inference weights *.pth cannot resume a run, use the *_resume.pth next to them)")
    missing = [key for key in RESUME_KEYS if key not in state]
    if missing:
        raise ValueError(f"resume file {path} lacks {missing}")
    return state


def check_signature(saved: Mapping, current: Mapping, source: str | Path) -> None:
    """Refuse to continue when any setting of the saved run differs, naming each one."""
    keys = sorted(set(saved) | set(current))
    differences = [f"{key}: saved {saved.get(key)!r}, now {current.get(key)!r}"
                   for key in keys if saved.get(key) != current.get(key)]
    if differences:
        raise ResumeRefusedError(
            f"refusing to resume from {source}: the run's settings differ\n  " + "\n  ".join(differences)
            + "\nresume with the original settings, or start a new run without resume=")

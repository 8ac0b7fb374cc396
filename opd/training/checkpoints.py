"""Training checkpoints: MiniMind inference weights plus a full resume file, written so a run is never lost.

``{stem}.pth`` is native fp16; ``{stem}_resume.pth`` holds fp32 weights, optimizer state, step, data cursor, every
rank's RNG states, the run signature, the weights file's sha256 and a sha256 over every other field (a damaged or
edited file is refused). Both are staged before either is renamed, the resume file last: a crash leaves the previous
pair, or new weights beside the previous resume file, which ``restore`` sets aside and rewrites.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch

from common.atomic_write import commit, stage
from common.minimind.model import load_failure, native_state_dict
from common.resume_signature import ResumeRefusedError, described, differences, flat_settings
from common.user_errors import UserError
from opd.training.data_order import DataCursor

LOG = logging.getLogger(__name__)  # a child of the entries' run log ("opd")
RESUME_FORMAT = "opd-resume/4"
RESUME_KEYS = ("format", "model", "optimization", "step", "cursor", "rng", "signature", "weights_sha256",
               "content_sha256")


class CheckpointWriteError(UserError):
    """A checkpoint file could not be written (a full disk); the one saved before it is intact."""


def checkpoint_stem(model: torch.nn.Module, prefix: str) -> str:
    """``{prefix}_{hidden}`` plus ``_moe`` for a MoE model (MiniMind's naming, e.g. ``agent_opd_768``)."""
    config = model.config
    return f"{prefix}_{config.hidden_size}{'_moe' if getattr(config, 'num_experts', None) else ''}"


def checkpoint_paths(out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    """The inference weights and resume file of ``stem`` in ``out_dir``."""
    out = Path(out_dir)
    return out / f"{stem}.pth", out / f"{stem}_resume.pth"


def step_weights_path(out_dir: str | Path, stem: str, step: int) -> Path:
    """The weights a save at ``step`` keeps with ``keep_saved_weights=true``."""
    return Path(out_dir) / f"{stem}_step{step}.pth"


def check_out_dir(out_dir: str | Path, stem: str, *, resume: str | None, overwrite: bool) -> None:
    """Refuse ``out_dir``'s checkpoints of ``stem`` (kept step weights included), naming the files, unless the run
    resumes exactly them or ``overwrite``."""
    weights, resume_file = checkpoint_paths(out_dir, stem)
    existing = [path for path in (weights, resume_file) if path.exists()] + sorted(Path(out_dir).glob(f"{stem}_step*.pth"))
    if not existing or overwrite:
        return
    if resume and resume_file.exists() and resume_file.resolve() == Path(resume).expanduser().resolve():
        return
    what = "another run's checkpoints" if resume else "checkpoints"
    raise UserError(f"{out_dir} already holds {what}: {', '.join(map(str, existing))}; continue that run with "
                    f"resume={resume_file}, write elsewhere with out_dir=..., or replace them with overwrite=true")


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


def run_signature(settings: Mapping, *, models: Mapping[str, torch.nn.Module], fingerprints: Mapping[str, str]) -> dict:
    """Everything a continuation must share, as flat dotted keys: ``settings``, model architectures, ``fingerprints``."""
    signature = {**fingerprints, **flat_settings(settings)}
    for role, model in models.items():
        signature.update({f"{role}.{key}": value for key, value in architecture_of(model).items()})
    return signature


def check_signature(saved: Mapping, current: Mapping, source: str | Path) -> None:
    """Refuse to continue when any setting of the saved run differs, naming each one."""
    changed = differences(saved, current)
    if changed:
        raise ResumeRefusedError(
            f"refusing to resume from {source}: the run's settings differ\n  " + described(changed)
            + "\nresume with the original settings, or start a new run without resume=")


def _content_sha256(value, digest=None) -> str:
    """sha256 over a nested dict/list/tuple in a fixed order: each tensor's dtype, shape and bytes, each other value's
    type and ``repr``, each container's kind and size."""
    digest = digest or hashlib.sha256()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"tensor:{tensor.dtype}{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"dict:{len(value)};".encode())
        for key in sorted(value, key=lambda key: (type(key).__name__, repr(key))):
            _content_sha256(key, digest)
            _content_sha256(value[key], digest)
    elif isinstance(value, list | tuple):
        digest.update(f"{type(value).__name__}:{len(value)};".encode())
        for item in value:
            _content_sha256(item, digest)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    return digest.hexdigest()


def rng_state(sampler) -> dict:
    """Every RNG the loop consumes: rollout sampling (if any), plus torch's global CPU/CUDA generators."""
    return {"sampler": sampler.get_state() if sampler is not None else None, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def save_checkpoint(out_dir: str | Path, stem: str, model: torch.nn.Module, *, optimization, step: int,
                    cursor: DataCursor, rng_states: list[dict], signature: dict,
                    keep_weights: bool = False) -> tuple[Path, Path]:
    """Write the weights and the resume file of ``step`` (``rng_states``: every rank's, in rank order); returns both
    paths. ``keep_weights`` also writes ``step_weights_path``, after the pair."""
    weights_path, resume_path = checkpoint_paths(out_dir, stem)
    weights = io.BytesIO()
    torch.save(native_state_dict(model), weights)
    state = {"format": RESUME_FORMAT,
             "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
             "optimization": optimization.state_dict(), "step": step, "cursor": asdict(cursor),
             "rng": rng_states, "signature": signature,
             "weights_sha256": hashlib.sha256(weights.getbuffer()).hexdigest()}
    state["content_sha256"] = _content_sha256(state)
    staged_weights = stage_checkpoint_file(weights_path, lambda stream: stream.write(weights.getbuffer()), resume_path)
    try:
        staged_resume = stage_checkpoint_file(resume_path, lambda stream: torch.save(state, stream), resume_path)
    except BaseException:
        staged_weights.unlink(missing_ok=True)
        raise
    commit(staged_weights, weights_path)
    commit(staged_resume, resume_path)
    if keep_weights:
        kept = step_weights_path(out_dir, stem, step)
        commit(stage_checkpoint_file(kept, lambda stream: stream.write(weights.getbuffer()), resume_path), kept)
    return weights_path, resume_path


def stage_checkpoint_file(path: Path, write: Callable, resume_path: Path) -> Path:
    """``stage`` one checkpoint file; a failed write (torch reports a full disk as ``RuntimeError``) raises
    ``CheckpointWriteError``."""
    try:
        return stage(path, write)
    except (OSError, RuntimeError) as error:
        cause = error if isinstance(error, OSError) else error.__context__
        if not isinstance(cause, OSError):
            raise
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        kept = (f"{resume_path} and the weights beside it are the last checkpoint, intact: make room and continue "
                f"with resume={resume_path}") if resume_path.is_file() else "no checkpoint was saved before this one"
        raise CheckpointWriteError(f"cannot save checkpoint {path}: {reason}", kept) from None


def load_resume(path: str | Path) -> dict:
    """Read and verify a resume file written by ``save_checkpoint``; refuses anything else with a clear message."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"resume file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt / non-torch files
        raise ResumeRefusedError(f"resume file {path} is not a readable torch file ({load_failure(error)}); it is "
                                 "damaged: resume from an earlier copy or start a new run") from None
    written = state.get("format") if isinstance(state, dict) else None
    if isinstance(written, str) and written.startswith("opd-resume/") and written != RESUME_FORMAT:
        raise ResumeRefusedError(
            f"resume file {path} is of format {written!r}; this version resumes {RESUME_FORMAT!r} files only (the "
            "checksum of 'opd-resume/3' and before covers only the tensors, not the step, cursor and settings)",
            "start a new run (the inference weights beside it can be its starting checkpoint)")
    if written != RESUME_FORMAT:
        raise ResumeRefusedError(f"{path} is not an OPD resume file of format {RESUME_FORMAT!r} (inference weights "
                                 "*.pth cannot resume a run: use the *_resume.pth next to them)")
    missing = [key for key in RESUME_KEYS if key not in state]
    if missing:
        raise ResumeRefusedError(f"resume file {path} lacks {missing}")
    content = {key: value for key, value in state.items() if key != "content_sha256"}
    if _content_sha256(content) != state["content_sha256"]:
        raise ResumeRefusedError(f"resume file {path} is damaged or was edited: its content does not match the "
                                 "checksum written with it; resume from an earlier copy or start a new run")
    return state


def restore_weights_file(weights_path: Path, model: torch.nn.Module, sha256: str, resume_path: Path) -> None:
    """Make ``weights_path`` the weights written with the resume file again; a file found there that differs is kept as
    ``{stem}.unmatched-{sha256[:12]}.pth``, never overwritten, with one warning line."""
    found = file_fingerprint(weights_path) if weights_path.is_file() else None
    if found == sha256:
        return
    if found is not None:
        aside = weights_path.with_name(f"{weights_path.stem}.unmatched-{found[:12]}.pth")
        os.replace(weights_path, aside)
        LOG.warning(f"warning: {weights_path} was not the weights file written with {resume_path} (a crash between "
                    f"writing the two); kept it as {aside} and wrote the resume file's weights in its place")
    weights = io.BytesIO()
    torch.save(native_state_dict(model), weights)
    commit(stage_checkpoint_file(weights_path, lambda stream: stream.write(weights.getbuffer()), resume_path),
           weights_path)


def restore(path: str | Path, signature: dict, *, model: torch.nn.Module, optimization, sampler,
            rank: int = 0) -> tuple[int, DataCursor]:
    """Load a verified resume file into the run's objects after checking its signature, taking this ``rank``'s RNG
    states (rank 0 restores the weights file). Returns (step, next cursor)."""
    state = load_resume(path)
    path = Path(path).expanduser()
    weights_path = path.with_name(path.name.removesuffix("_resume.pth") + ".pth")
    check_signature(state["signature"], signature, path)
    model.load_state_dict(state["model"], strict=True)
    if rank == 0:
        restore_weights_file(weights_path, model, state["weights_sha256"], path)
    optimization.load_state_dict(state["optimization"])
    rng = state["rng"][rank]
    if sampler is not None:
        sampler.set_state(rng["sampler"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state["step"], DataCursor(**state["cursor"])

"""The run manifest (``<stem>.manifest.json``): what produced an output, so a resume cannot mix settings.

It records the dataset's identity and fingerprint, the model, the row-text tokenizer and every setting that shapes
a row. A resume that differs is refused, listing the keys, unless ``resume_accept_changes=true`` (the change is
appended to ``changes``). An output without a manifest is resumed with a warning and gets one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.atomic_write import atomic_write_json
from common.resume_signature import ResumeRefusedError, described, differences, flat_settings
from regen.outputs.output_files import OutputPaths
from regen.settings import RegenSettings

MANIFEST_VERSION = 1


def run_settings(settings: RegenSettings, dataset_fingerprint: str, model: str,
                 tokenizer_fingerprint: str) -> dict[str, Any]:
    """The settings a manifest records, as flat ``dotted.key: value`` pairs (JSON values)."""
    dataset = settings.dataset
    path = str(Path(dataset.path).resolve()) if dataset.source == "local" else dataset.path
    mixes = {name: None if mix is None else {str(o): w for o, w in zip(mix.options, mix.weights, strict=True)}
             for name, mix in (("reasoning_effort_weights", settings.reasoning_effort_weights),
                               ("temperature_weights", settings.temperature_weights))}
    flat: dict[str, Any] = {
        "dataset.name": dataset.name, "dataset.source": dataset.source, "dataset.path": path,
        "dataset.subset": dataset.subset, "dataset.split": dataset.split, "dataset.format": dataset.format,
        "dataset.fingerprint": dataset_fingerprint, "language_filter": settings.language_filter,
        "model": model, "tokenizer": tokenizer_fingerprint, "max_tokens": settings.max_tokens,
        "carry_reasoning": settings.carry_reasoning, "mix_seed": settings.mix_seed,
    }
    if settings.top_logprobs is not None:  # recorded only when set: manifests from before it still resume
        flat["top_logprobs"] = settings.top_logprobs
    flat |= flat_settings({name: value if value else None for name, value in (
        ("sampling", settings.sampling), ("extra_request_params", settings.extra_request_params), *mixes.items())})
    return json.loads(json.dumps(flat))  # tuples become lists, as they read back from the file


def _write(paths: OutputPaths, manifest: dict) -> None:
    atomic_write_json(paths.manifest, manifest)
    paths.match_output_mode(paths.manifest)


def _read(path: Path) -> dict[str, Any]:
    """The manifest at ``path``, checked (shape, and ``version`` this regen's)."""
    hint = "restore it, or remove it to resume without a settings check"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ResumeRefusedError(f"{path} cannot be read ({type(error).__name__}: {error})", hint) from None
    if not isinstance(manifest, dict):
        problem = f"it holds a {type(manifest).__name__}, not an object"
    elif not isinstance(manifest.get("settings"), dict):
        problem = f"'settings' is {type(manifest.get('settings')).__name__}, not an object"
    elif not isinstance(manifest.get("changes", []), list):
        problem = f"'changes' is {type(manifest['changes']).__name__}, not a list"
    elif manifest.get("version") != MANIFEST_VERSION:
        raise ResumeRefusedError(f"{path} has manifest version {manifest.get('version')!r}; this regen reads version "
                            f"{MANIFEST_VERSION} only", "resume it with the regen that wrote it, or remove the manifest "
                            "to resume without a settings check") from None
    else:
        return manifest
    raise ResumeRefusedError(f"{path} is not a regen manifest: {problem}", hint)


def check_and_record(paths: OutputPaths, current: dict[str, Any], *, resuming: bool, accept_changes: bool,
                     warn: Callable[[str], None]) -> dict[str, tuple[Any, Any]]:
    """Compare a resume with the manifest (refusing a difference unless ``accept_changes``) and write the
    manifest for this run; returns the accepted differences (``{}`` when there are none)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    output_exists = paths.output.is_file() and paths.output.stat().st_size > 0
    if not resuming or not paths.manifest.is_file():
        if resuming and output_exists:
            warn(f"{paths.output} has no manifest (written by speculators or an older regen): resuming without "
                 f"checking its settings; {paths.manifest.name} now records this run's")
        _write(paths, {"version": MANIFEST_VERSION, "created": now, "settings": current, "changes": []})
        return {}
    manifest = _read(paths.manifest)
    saved = manifest["settings"]
    changed = differences(saved, current)
    if changed and not accept_changes:
        raise ResumeRefusedError(
            f"refusing to resume {paths.output}: the run's settings differ from {paths.manifest.name}\n  "
            + described(changed),
            "resume with the original settings, or add resume_accept_changes=true to continue with these "
            "(the change is recorded in the manifest)")
    if changed:
        manifest.setdefault("changes", []).append(
            {"at": now, "differences": {key: {"old": old, "new": new} for key, (old, new) in changed.items()}})
        manifest["settings"] = current
        _write(paths, manifest)
    else:
        paths.match_output_mode(paths.manifest)
    return changed

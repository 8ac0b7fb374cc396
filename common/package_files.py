"""Where the files the project ships are, in a checkout and in an installed wheel alike.

The Hydra config tree is ``configs/`` at the top of a checkout (running from the repository, or an editable
install); a wheel ships it as package data, ``onpolicy_research/configs/`` (the ``package-dir`` mapping in
``pyproject.toml``), never as a top-level ``configs`` package. :data:`CONFIG_DIR` is that folder, the one place the
entries (their Hydra ``config_path``), ``--help`` and the model groups read it from.

The presets name the project's own files by resolvers, never by a path relative to the folder a run starts in
(relative paths a person types stay relative to that folder; Hydra does not change it):

- ``${package_data:regen/samples/sample_prompts.jsonl}``: a file shipped inside a package (the first part names
  the package): the bundled sample of ``dataset=sample``.
- ``${tiny_checkpoint:tiny_teacher.pth}``: a file in :func:`tiny_dir`, where ``onpolicy-tiny`` (``make tiny``,
  ``common.minimind.tiny``) writes the tiny random checkpoints of the ``tiny_*`` model presets and their stand-in
  tokenizer (``${tiny_tokenizer:${tokenizer}}``, when no tokenizer is set): ``$ONPOLICY_TINY_DIR`` if set, else
  ``out/tiny`` in the checkout, else (an installed wheel) ``$XDG_CACHE_HOME/onpolicy-research/tiny``
  (``~/.cache/onpolicy-research/tiny``).

:func:`register_resolvers` registers both (every entry calls it before Hydra composes; ``opd.config`` on import).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from pathlib import Path

PACKAGE = "onpolicy_research"  # the wheel's package of data: onpolicy_research/configs/
TINY_DIR_ENV = "ONPOLICY_TINY_DIR"
_TOP = Path(__file__).resolve().parents[1]  # a checkout's root, or site-packages


def checkout_root() -> Path | None:
    """The repository this code runs from (a checkout, editable install included), or None when installed."""
    return _TOP if (_TOP / "pyproject.toml").is_file() and (_TOP / "configs" / "regen.yaml").is_file() else None


def extras_install(extra: str) -> str:
    """The command that installs the optional ``extra`` (``chart``, ``tensorboard``, ``wandb``) where this code runs:
    into the checkout (editable) or, installed from the wheel, from the package index."""
    if checkout_root() is not None:
        return f"pip install -e '.[{extra}]'"
    return f"pip install 'onpolicy-research[{extra}]'"


def _config_dir() -> Path:
    root = checkout_root()
    if root is not None:
        return root / "configs"
    spec = importlib.util.find_spec(f"{PACKAGE}.configs")  # package data, a folder without __init__.py
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return _TOP / PACKAGE / "configs"  # not found: Hydra names this folder when it is missing


CONFIG_DIR = _config_dir()


def package_data(path: str) -> str:
    """``package/inner/file`` -> the absolute path of ``inner/file`` shipped inside the importable ``package``."""
    package, _, inner = path.strip("/").partition("/")
    if not inner:
        raise ValueError(f"package_data:{path}: expected PACKAGE/PATH, as in regen/samples/sample_prompts.jsonl")
    return str(Path(str(importlib.resources.files(package).joinpath(inner))))


def tiny_dir() -> Path:
    """The folder of the tiny random checkpoints (module doc): ``$ONPOLICY_TINY_DIR``, else the checkout's
    ``out/tiny``, else the user's cache folder."""
    if os.environ.get(TINY_DIR_ENV):
        return Path(os.environ[TINY_DIR_ENV]).expanduser().absolute()
    root = checkout_root()
    if root is not None:
        return root / "out" / "tiny"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache.absolute() / "onpolicy-research" / "tiny"


def tiny_checkpoint(name: str) -> str:
    """``${tiny_checkpoint:tiny_teacher.pth}``: that file in :func:`tiny_dir`."""
    return str(tiny_dir() / name)


def tiny_tokenizer(chosen: str | None) -> str:
    """``${tiny_tokenizer:${tokenizer}}``: the tokenizer the entry names, else the stand-in one in :func:`tiny_dir`
    (the tiny presets' tokenizer when none is set)."""
    return chosen if chosen else str(tiny_dir() / "standin-tokenizer")


def register_resolvers() -> None:
    """Register ``package_data``, ``tiny_checkpoint`` and ``tiny_tokenizer`` with OmegaConf (again is harmless). Not done on import:
    the entries import this module before anything slow, to handle Ctrl-C from their first line."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("package_data", package_data, replace=True)
    OmegaConf.register_new_resolver("tiny_checkpoint", tiny_checkpoint, replace=True)
    OmegaConf.register_new_resolver("tiny_tokenizer", tiny_tokenizer, replace=True)

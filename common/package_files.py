"""Where the files the project ships are, in a checkout and an installed wheel alike: :data:`CONFIG_DIR`, and the
OmegaConf resolvers (``${package_data:...}``, ``${tiny_checkpoint:...}``, ``${tiny_tokenizer:...}``) the presets name
files by, never by a path relative to the run's folder."""

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
    """The command that installs the optional ``extra`` where this code runs (editable checkout, or the index)."""
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
    """The tiny checkpoints' folder: ``$ONPOLICY_TINY_DIR``, else the checkout's ``out/tiny``, else the user cache."""
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
    """``${tiny_tokenizer:${tokenizer}}``: the tokenizer the entry names, else the stand-in in :func:`tiny_dir`."""
    return chosen if chosen else str(tiny_dir() / "standin-tokenizer")


def register_resolvers() -> None:
    """Register the three resolvers with OmegaConf (again is harmless); not on import, which must stay fast."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("package_data", package_data, replace=True)
    OmegaConf.register_new_resolver("tiny_checkpoint", tiny_checkpoint, replace=True)
    OmegaConf.register_new_resolver("tiny_tokenizer", tiny_tokenizer, replace=True)

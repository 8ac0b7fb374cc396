"""``--help`` for the Hydra entries, read from the YAML (each key's default and comment, each group's options) without
composing, so a required group (``dataset: ???``) needs no choice first."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from common.package_files import CONFIG_DIR  # the entries' config tree, in a checkout or an installed wheel

HELP_FLAGS = ("--help", "-h")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")
_COMMENT = re.compile(r"^ *#(?: |$)")


def _split_comment(rest: str) -> tuple[str, str]:
    """``value  # meaning`` -> (value, meaning); a ``#`` inside quotes or without a space before it is kept."""
    quote = None
    for index, char in enumerate(rest):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (index == 0 or rest[index - 1] == " "):
            return rest[:index].strip(), rest[index + 1:].strip()
    return rest.strip(), ""


def read_keys(path: Path, prefix: str = "") -> tuple[list[str], list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """A YAML config's (opening comment lines, [(dotted key, default, meaning)], [(group, default option,
    meaning)] of its defaults list); ``hydra:`` is left out (Hydra's own settings)."""
    intro, keys, groups = [], [], []
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings the current line is inside
    section, last = None, None  # the top-level block being read; the entry a continued comment belongs to
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if _COMMENT.match(line):
            text = line.strip()[1:].strip()
            if last is not None and line.startswith(" "):
                last[2] += (" " if last[2] else "") + text
            elif not keys and not groups and not text.startswith("@package"):
                intro.append(text)
            continue
        match = _KEY.match(line)
        if match is None:  # a defaults-list item
            item = line.strip()
            if section == "defaults" and item.startswith("- "):
                group, _, rest = item[2:].partition(":")  # "- job_dirs": a config file, not a group
                option, meaning = _split_comment(rest)
                if not group.startswith("override "):
                    groups.append(last := [group.strip(), option or None, meaning])
                    continue
            last = None
            continue
        indent, key = len(match["indent"]), match["key"]
        value, meaning = _split_comment(match["rest"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if indent == 0:
            section = key
        if section in ("hydra", "defaults"):
            last = None
            continue
        if value:
            keys.append(last := [prefix + ".".join([*(k for _, k in stack), key]), value, meaning])
        else:
            stack.append((indent, key))
            last = None
    return intro, [tuple(k) for k in keys], [tuple(g) for g in groups]


def option_keys(config_dir: Path, folder: Path, option: str, prefix: str) -> list[tuple[str, str, str]]:
    """The keys of a group's option file, with those of the presets it merges (``- /model@_here_: tiny_teacher``)."""
    path = folder / f"{option}.yaml"
    if not path.is_file():
        return []
    keys: list[tuple[str, str, str]] = []
    for group, preset, _ in read_keys(path)[2]:
        if preset and group.startswith("/") and group.endswith("@_here_"):
            keys += option_keys(config_dir, config_dir / group[1:].removesuffix("@_here_"), preset, prefix)
    mine = read_keys(path, prefix=prefix)[1]
    ours = {key for key, _, _ in mine}
    return [key for key in keys if key[0] not in ours] + mine


def chosen_options(argv: list[str]) -> dict[str, str]:
    """``GROUP=OPTION`` items of a command line (``server=local``), as {group: option}; the rest is left out."""
    return dict(item.split("=", 1) for item in argv if re.fullmatch(r"[A-Za-z_][\w-]*=[\w.-]+", item))


def help_text(config_dir: Path, name: str, program: str, group_folders: dict[str, str] | None = None,
              chosen: dict[str, str] | None = None) -> str:
    """The help page of ``config_dir/name.yaml``; ``group_folders`` maps a group to its folder where names differ
    (opd's ``teacher`` is ``model/``); ``chosen`` options' keys are shown instead of the defaults'."""
    chosen = chosen or {}
    intro, keys, groups = read_keys(config_dir / f"{name}.yaml")
    lines = [*intro, "", f"usage: {program} [KEY=VALUE ...]    (-m KEY=A,B ... for a sweep)", "", "groups (GROUP=OPTION):"]
    for group, default, meaning in groups:
        folder = config_dir / (group_folders or {}).get(group, group)
        if default is None:  # "- logger": a file whose keys every run has
            if (config_dir / f"{group}.yaml").is_file():
                keys += read_keys(config_dir / f"{group}.yaml")[1]
            continue
        options = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        state = "required" if default == "???" else f"default {default}"
        if group in chosen:
            state += f", chosen {chosen[group]}"
        lines.append(f"  {group} ({state}): {options}" + (f"  # {meaning}" if meaning else ""))
        keys += option_keys(config_dir, folder, chosen.get(group, default), f"{group}.")
    width = min(max(len(f"{key}={value}") for key, value, _ in keys), 44)
    lines += ["", "keys (KEY=DEFAULT, ??? = required; a group's keys shown for the option chosen on the command line, "
              "else its default):"]
    lines += [f"  {f'{key}={value}':<{width}}  {meaning}".rstrip() for key, value, meaning in keys]
    lines += ["", "--cfg job prints the composed config without running; --hydra-help lists Hydra's own flags."]
    return "\n".join(lines)


def program_name(script: str) -> str:
    """How a usage line names the entry: the console script that ran (``onpolicy-regen``), else ``script``."""
    ran = Path(sys.argv[0]).name
    return ran if ran.startswith("onpolicy-") else script


def exit_with_help_if_asked(name: str, program: str, group_folders: dict[str, str] | None = None,
                            argv: list[str] | None = None, config_dir: Path = CONFIG_DIR) -> None:
    """Print :func:`help_text` and exit 0 when the command line asks for ``--help`` / ``-h``."""
    if not (config_dir / f"{name}.yaml").is_file():  # not installed beside its configs: Hydra says so itself
        return
    argv = sys.argv[1:] if argv is None else argv
    if any(flag in argv for flag in HELP_FLAGS):
        try:
            print(help_text(config_dir, name, program_name(program), group_folders, chosen_options(argv)), flush=True)
        except BrokenPipeError:  # `--help | head` closed the pipe: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(0)

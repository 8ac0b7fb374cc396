"""Hydra's refusals of a command line (unknown option or key, bad override, a group to choose) as a ``UserError``.

``composition_errors_as_user_errors()`` wraps Hydra's private ``run_and_report`` (hydra-core pinned below 1.4), which
prints and exits, and re-raises a ``CompactHydraException``; the rest, and all under ``HYDRA_FULL_ERROR=1``, is Hydra's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from common.user_errors import UserError

HELP = "--help lists the keys and groups this command takes"
_WHERE = re.compile(r"^In '[^']*': ")  # Hydra's "In 'opd': " before a message about a config's defaults
_OVERRIDE = re.compile(r"^Could not override '([^']+)'\.")
_MISSING = re.compile(r"^Could not find '([^']+)/([^'/]*)'$")
_APPEND = re.compile(r"^Could not append to config\. An item is already at '([^']+)'\.$")
_UNPREFIXED = re.compile(r"^Either remove \+ prefix: '(.+)'$")
_CHOOSE = re.compile(r"^You must specify '([^']+)'")
_GUESS = re.compile(r"^Did you mean to override (.+)\?$")
_LEXER = "LexerNoViableAltException: "


def composition_error(error: Exception) -> UserError:
    """The ``UserError`` for a refusal Hydra raised while reading the command line and composing the config."""
    raw = str(getattr(error, "message", error)).splitlines()
    lines = [line for line in (_WHERE.sub("", line).strip() for line in raw) if line]
    first = lines[0] if lines else type(error).__name__
    override = getattr(error, "override", None)
    if override is not None:  # OverrideParseException: the override as typed, and the parser's complaint
        reason = first
        if first.startswith(_LEXER) and len(raw) > 1 and raw[1].strip() == "^":  # a caret under the first bad one
            reason = f"cannot read on from {override[len(raw[1]) - 1 - len(_LEXER):]!r}"
        if first.startswith("Error parsing override") and len(lines) > 1:  # its cause is the next line
            reason = lines[1]
        return UserError(f"cannot read the override {override!r}: {reason}",
                         "its grammar: https://hydra.cc/docs/advanced/override_grammar/basic/")
    options = ", ".join(getattr(error, "options", None) or [])
    if (match := _MISSING.match(first)) and options:
        group, option = match.groups()
        return UserError(f"{group}={option}: {group} has no option {option!r}" if option else
                         f"{group}= names no option", f"{group} is one of: {options}")
    if match := _CHOOSE.match(first):
        group = match.group(1)
        choices = ", ".join(line for line in lines[1:] if line != "Available options:")
        return UserError(f"{group} must be chosen ({group}=<OPTION>)", f"{group} is one of: {choices}")
    if match := _OVERRIDE.match(first):
        guesses = [guess.group(1) for line in lines[1:] if (guess := _GUESS.match(line))]
        return UserError(f"unknown setting {match.group(1)}", f"did you mean {guesses[0]}?" if guesses else HELP)
    if match := _APPEND.match(first):
        plain = [found.group(1) for line in lines[1:] if (found := _UNPREFIXED.match(line))]
        return UserError(f"+{match.group(1)} adds a setting that is already there",
                         f"to change it, leave out the +: {plain[0]}" if plain else HELP)
    return UserError(first, next((line for line in lines[1:] if not line.startswith("Config search path")), None))


@contextmanager
def composition_errors_as_user_errors() -> Iterator[None]:
    """Inside the block ``hydra.main`` raises a ``UserError`` where it would print a refusal (not under
    ``HYDRA_FULL_ERROR=1``)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    from hydra._internal import utils
    from hydra.errors import CompactHydraException

    report = utils.run_and_report

    def run_and_report(func):
        refused: list[CompactHydraException] = []

        def composing():
            try:
                return func()
            except CompactHydraException as error:
                refused.append(error)
                return None

        result = report(composing)
        if refused:
            raise composition_error(refused[0]) from None
        return result

    utils.run_and_report = run_and_report
    try:
        yield
    finally:
        utils.run_and_report = report

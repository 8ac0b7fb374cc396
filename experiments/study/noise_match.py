"""Noise matched to the students by construction (DART; the study's ``data.match_noise``): the noisy demonstrations'
rates set from the warm students' own first call errors at temperature 1.

    python -m experiments.study.noise_match --heldout out/study/data/heldout_prompts.jsonl \
        --episodes out/study/seed0/eval/student/t1/episodes_student.jsonl [--episodes ...] \
        --out out/study/data/noise_rates.json

The episodes are ``opd/evaluate.py``'s rows of the warm students on the held-out prompts (pooled over the files
given); ``experiments.study.gates.error_rates`` measures them. ``--out`` holds ``settings``, the noise settings of
``python -m experiments.study.chain_task --part noisy`` (``--noise-rates``), and ``measured``, the rates they come
from:

- ``value_noise``: the confused calls per call at risk (a wrong value or operation, or a failed guard whose step
  reads back: one number wrong);
- ``syntax_noise``: the other failed calls per call at risk (an invalid expression);
- ``operand_share`` and ``guard_share``: of the confused calls whose numbers read back, the shares with k alone and
  with one guard number alone wrong;
- ``guard_numbers``: of those, the shares by the guard number misread. A misread of several guard numbers at once
  is left out (the noise misreads one), and with none measured the weights are a alone, which is then unused
  unless ``guard_share`` is above 0.

A share with nothing to measure it (no confused call read back) is 0. Broken JSON is measured, not injected:
MiniMind's tool world gives it no observation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.atomic_write import atomic_write_json
from experiments.estimates import jsonl_rows
from experiments.study.chain_task import GUARD_NUMBERS
from experiments.study.gates import error_rates


def noise_settings(measured: dict) -> dict:
    """chain_task's noise settings from ``error_rates``'s measurement (see the module doc)."""
    if not measured["calls_at_risk"]:
        raise ValueError("the episodes hold no call, so there is no error rate to match")
    numbers = {name: share for name, share in (measured["wrong_guard_numbers"] or {}).items() if name in GUARD_NUMBERS}
    return {"value_noise": measured["confused"], "syntax_noise": measured["failed_call"],
            "operand_share": measured["wrong_k_share"] or 0.0, "guard_share": measured["wrong_guard_share"] or 0.0,
            "guard_numbers": numbers or {"a": 1.0}}


def _jsonl(path: Path, what: str) -> list[dict]:
    try:
        return jsonl_rows(path)
    except OSError as error:
        raise ValueError(f"{what} {path}: cannot read it ({error.strerror})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} {path}: line {error.doc.count(chr(10)) + 1} is not JSON") from error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heldout", required=True, type=Path, help="the held-out prompts the episodes were run on")
    parser.add_argument("--episodes", required=True, type=Path, action="append",
                        help="a student's temperature-1 episodes (opd/evaluate.py's episodes_*.jsonl); repeat to pool")
    parser.add_argument("--out", required=True, type=Path, help="the JSON file of the settings and measured rates")
    args = parser.parse_args(argv)
    episodes = ", ".join(map(str, args.episodes))
    try:
        prompts = _jsonl(args.heldout, "held-out prompts")
        rows = [row for path in args.episodes for row in _jsonl(path, "episodes")]
        measured = error_rates(prompts, rows)
    except ValueError as error:
        parser.error(str(error))
    except (KeyError, IndexError, AttributeError, TypeError) as error:
        what = f"lacks {error}" if isinstance(error, KeyError) else "is not an evaluation row of these prompts"
        parser.error(f"{episodes}: an episode {what} ({type(error).__name__})")
    try:
        settings = noise_settings(measured)
    except ValueError as error:
        parser.error(f"{episodes}: {error}")
    atomic_write_json(args.out, {"settings": settings, "measured": measured,
                                 "episodes": [str(path) for path in args.episodes]})
    json.dump(settings, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

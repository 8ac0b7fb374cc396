"""The learning curves' held-out problems (the study's ``curve``): the first ``--problems`` held-out prompts of one
horizon, in the file's order (the chain task shuffles its held-out problems, so these are a random sample of them).

    python -m experiments.study.curve_problems --heldout out/study/data/heldout_prompts.jsonl --horizon 6 \
        --problems 100 --out out/study/data/curve_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.atomic_write import atomic_write_text


def curve_lines(heldout: Path, horizon: int, problems: int) -> list[str]:
    """The first ``problems`` lines of ``heldout`` whose task has ``horizon``; ``ValueError`` when it has fewer."""
    chosen = []
    for number, line in enumerate(heldout.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)["task"]["horizon"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{heldout}:{number}: not a chain task prompt ({type(error).__name__}: {error})") from None
        if found == horizon:
            chosen.append(line)
            if len(chosen) == problems:
                return chosen
    raise ValueError(f"{heldout} holds {len(chosen)} problems of horizon {horizon}, fewer than the {problems} asked "
                     "for (curve.problems)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heldout", required=True, type=Path, help="the chain task's held-out prompts")
    parser.add_argument("--horizon", required=True, type=int, help="the horizon of the problems taken")
    parser.add_argument("--problems", required=True, type=int, help="how many are taken")
    parser.add_argument("--out", required=True, type=Path, help="the JSONL file of the chosen prompts")
    args = parser.parse_args(argv)
    try:
        lines = curve_lines(args.heldout, args.horizon, args.problems)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    atomic_write_text(args.out, "".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()

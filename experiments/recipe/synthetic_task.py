"""A seeded synthetic tool-use task in MiniMind's tool world, with gold demonstrations and three disjoint splits.

    python -m experiments.recipe.synthetic_task --out out/recipe/data --train 3000 --distill 1600 --heldout 500 --seed 0

Every problem asks two things at once, each answered by one of MiniMind's lookup tools (``tools.mock_tools``):
the weather in one of its 15 cities (``get_current_weather``), the exchange rate of one of its 8 currency
pairs (``get_exchange_rate``), the time in one of its 6 timezones (``get_current_time``) or one of its 6
translations (``translate_text``). These 35 lookups are the task's *slots*; a problem is an ordered pair of
two different slots (35 x 34 = 1,190 problems), its *kind* the two tools it needs (``rate+weather``, ...).
The gold episode makes both calls in one assistant turn, gets both observations (exactly the text the
rollout's mock-tool environment returns) and answers with the facts; ``gt`` holds those facts as the
observations render them (``"28°C"``, ``"晴"``, ``"7.21"``, ``"2025-03-07 15:30:00"``, ``"Hello World"``).

Why lookups and not arithmetic: a model of the recipe's size (128 wide, 4 layers, trained from scratch for a
few minutes on CPU) learns to find an entity of the question and use it (a city into a call, that city's facts
into the answer) within a few hundred SFT steps, but copying free multi-digit numbers (an expression into a
call, a result into the answer) takes it thousands (``experiments/recipe/README.md`` has the numbers).

Splits are disjoint by pair of lookups: a problem belongs to the split a fixed hash of its two slots (in
either order, so both orders share a split; seed independent) falls in: ``heldout`` below ``heldout_share``,
then ``distill`` below ``heldout_share + distill_share``, else ``train``. So no held-out or distillation
problem is asked in training, in any wording or order, and no two splits share a pair of lookups; every slot
appears in every split (a held-out problem is a new combination of lookups the model has seen). Held-out
problems are distinct; the train and distill splits are drawn with replacement from their own problems (a
repeat is one more example, never a leak).

Files written to ``--out``: ``train_demonstrations.jsonl`` (SFT, ``offline.source=dataset``),
``train_prompts.jsonl``, ``distill_prompts.jsonl`` (on-policy distillation, teacher rollouts) and
``heldout_prompts.jsonl`` (evaluation): system + user turn and ``gt``; and ``task_summary.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common.atomic_write import atomic_write_json, atomic_write_text
from tools.mock_tools import EXCHANGE_RATES, LOCAL_TIMES, TRANSLATIONS, WEATHER, tool_schemas
from tools.tool_calls import ToolCall
from tools.tool_environment import OK, execute_call

TASK_TOOLS = ("get_current_weather", "get_exchange_rate", "get_current_time", "translate_text")
SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to find the answer, then state it."
SPLITS = ("train", "distill", "heldout")
QUESTIONS = ("What are {a} and {b}?", "Tell me {a}, and {b}.", "I need {a} and also {b}.")

# slot type -> (tool, the phrase a question asks it with)
SLOT_TYPES = {
    "weather": ("get_current_weather", "the weather in {0}"),
    "rate": ("get_exchange_rate", "the exchange rate from {0} to {1}"),
    "time": ("get_current_time", "the time in {0}"),
    "translate": ("translate_text", "'{0}' in {1}"),
}
SLOTS = (*(("weather", city) for city in WEATHER), *(("rate", *pair) for pair in EXCHANGE_RATES),
         *(("time", zone) for zone in LOCAL_TIMES), *(("translate", *item) for item in TRANSLATIONS))


@dataclass(frozen=True)
class Problem:
    """One problem: its key (two different slots, in the order asked) and the user question."""

    key: tuple
    question: str

    @property
    def kind(self) -> str:
        """The tools it needs, as slot types in alphabetical order (``rate+weather``)."""
        return "+".join(sorted(slot[0] for slot in self.key))


def all_keys() -> list[tuple]:
    """Every problem of the task: ordered pairs of different slots."""
    return [(a, b) for a in SLOTS for b in SLOTS if a != b]


def split_of(key: tuple, heldout_share: float, distill_share: float) -> str:
    """The split a problem key belongs to: a fixed hash of its two slots in either order (so both orders of a
    pair share a split), independent of the seed."""
    digest = hashlib.sha256(json.dumps(sorted(key), ensure_ascii=False).encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < heldout_share:
        return "heldout"
    return "distill" if position < heldout_share + distill_share else "train"


def _arguments(slot: tuple) -> tuple[str, dict]:
    kind, *values = slot
    if kind == "weather":
        return "get_current_weather", {"location": values[0]}
    if kind == "rate":
        return "get_exchange_rate", {"from_currency": values[0], "to_currency": values[1]}
    if kind == "time":
        return "get_current_time", {"timezone": values[0]}
    return "translate_text", {"text": values[0], "target_language": values[1]}


def _answer(slot: tuple, result: dict) -> tuple[str, list[str]]:
    """The answer's sentence for one slot and the ``gt`` items it must hold, as the observation renders them."""
    kind, *values = slot
    if kind == "weather":
        return f"{values[0]}: {result['temperature']}, {result['condition']}", [result["temperature"],
                                                                                result["condition"]]
    if kind == "rate":
        rate = json.dumps(result["rate"])
        return f"{values[0]} to {values[1]}: {rate}", [rate]
    if kind == "time":
        return f"{values[0]}: {result['datetime']}", [result["datetime"]]
    return f"'{values[0]}' in {values[1]}: {result['translated_text']}", [result["translated_text"]]


def solve(key: tuple) -> tuple[list[dict], list[str]]:
    """The gold demonstration (one turn with both calls, both observations, the answer) and the ``gt`` strings."""
    calls = [_arguments(slot) for slot in key]
    outcomes = [execute_call(ToolCall(name, arguments), TASK_TOOLS) for name, arguments in calls]
    failed = [(call, outcome.detail) for call, outcome in zip(calls, outcomes, strict=True) if outcome.status != OK]
    if failed:
        raise RuntimeError(f"synthetic task generated failing calls: {failed}")
    turns = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}} for name, arguments in calls]}]
    turns += [{"role": "tool", "content": outcome.observation} for outcome in outcomes]
    sentences, gt = zip(*(_answer(slot, outcome.result) for slot, outcome in zip(key, outcomes, strict=True)),
                        strict=True)
    turns.append({"role": "assistant", "content": ". ".join(sentences) + "."})
    return turns, [item for items in gt for item in items]


def make_problem(key: tuple, rng: random.Random) -> Problem:
    """The problem of ``key`` in one of the question wordings."""
    phrases = [SLOT_TYPES[slot[0]][1].format(*slot[1:]) for slot in key]
    return Problem(key, rng.choice(QUESTIONS).format(a=phrases[0], b=phrases[1]))


def make_record(problem: Problem, *, with_demonstration: bool) -> dict:
    """An agent JSONL row: system turn declaring the tools, the question, ``gt``, optionally the gold turns."""
    demonstration, gt = solve(problem.key)
    system = {"role": "system", "content": SYSTEM_PROMPT, "tools": json.dumps(tool_schemas(list(TASK_TOOLS)))}
    conversation = [system, {"role": "user", "content": problem.question}]
    if with_demonstration:
        conversation += demonstration
    return {"conversations": conversation, "gt": gt,
            "task": {"kind": problem.kind, "key": [list(slot) for slot in problem.key]}}


def generate_problems(counts: dict[str, int], *, seed: int, heldout_share: float = 0.45,
                      distill_share: float = 0.15) -> dict[str, list[Problem]]:
    """Problems per split (see the module doc): held-out ones distinct, the others drawn with replacement."""
    if not (0 < heldout_share and 0 <= distill_share and heldout_share + distill_share < 1):
        raise ValueError(f"heldout_share > 0, distill_share >= 0 and their sum < 1 are required, got "
                         f"{heldout_share} and {distill_share}")
    unknown = set(counts) - set(SPLITS)
    if unknown:
        raise ValueError(f"splits must be among {SPLITS}, got {sorted(unknown)}")
    keys = {split: [] for split in SPLITS}
    for key in all_keys():
        keys[split_of(key, heldout_share, distill_share)].append(key)
    rng = random.Random(seed)
    problems = {}
    for split, count in counts.items():
        available = keys[split]
        if count and not available:
            raise ValueError(f"no problem falls in the {split} split at heldout_share={heldout_share}, "
                             f"distill_share={distill_share}")
        if split == "heldout" and count > len(available):
            raise ValueError(f"{count} distinct held-out problems asked, but only {len(available)} of the task's "
                             f"{len(all_keys())} fall in the held-out split at heldout_share={heldout_share}")
        drawn = rng.sample(available, count) if split == "heldout" else [rng.choice(available) for _ in range(count)]
        problems[split] = [make_problem(key, rng) for key in drawn]
    return problems


FILES = {"train_demonstrations": ("train", True), "train_prompts": ("train", False),
         "distill_prompts": ("distill", False), "heldout_prompts": ("heldout", False)}


def write_task(out_dir: str | Path, *, train: int, heldout: int, distill: int = 0, seed: int = 0,
               heldout_share: float = 0.45, distill_share: float = 0.15) -> dict:
    """Generate the splits and write the four JSONL files and ``task_summary.json``; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    problems = generate_problems({"train": train, "distill": distill, "heldout": heldout}, seed=seed,
                                 heldout_share=heldout_share, distill_share=distill_share)
    for name, (split, demonstrations) in FILES.items():
        rows = [make_record(problem, with_demonstration=demonstrations) for problem in problems[split]]
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    summary = {
        "seed": seed, "heldout_share": heldout_share, "distill_share": distill_share, "tools": list(TASK_TOOLS),
        "files": {name: str(out / f"{name}.jsonl") for name in FILES},
        **{f"{split}_kinds": dict(sorted(Counter(p.kind for p in problems[split]).items())) for split in SPLITS},
        **{f"{split}_distinct_problems": len({p.key for p in problems[split]}) for split in SPLITS},
    }
    atomic_write_json(out / "task_summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSONL files")
    parser.add_argument("--train", type=int, default=3000, help="train records (with demonstrations)")
    parser.add_argument("--distill", type=int, default=1600, help="distillation prompts")
    parser.add_argument("--heldout", type=int, default=500, help="distinct held-out prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-share", type=float, default=0.45, help="share of problems held out")
    parser.add_argument("--distill-share", type=float, default=0.15, help="share of problems for distillation")
    args = parser.parse_args(argv)
    try:
        summary = write_task(args.out, train=args.train, distill=args.distill, heldout=args.heldout, seed=args.seed,
                             heldout_share=args.heldout_share, distill_share=args.distill_share)
    except ValueError as error:
        parser.error(str(error))
    print(json.dumps(summary, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()

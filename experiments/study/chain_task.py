"""Chains of dependent calculator calls in MiniMind's tool world: a horizon of H calls, each needing the last one's result.

    python -m experiments.study.chain_task --out out/study/data --train 1500 --distill 300 --seed 0

A problem is a *triple* (start, op, k) and a horizon H: start in 0..19; op is add or subtract k (k in 1..9) or multiply
by k (k in 3, 7, 9). The user asks: "Start with 13. Subtract six, four times, keeping the remainder after dividing by
20 each time. What is the result?". The gold episode makes H calls of MiniMind's ``calculate_math``, one per assistant
turn: ``"(v op k) % 20"``, where v is the start for the first call and the result of the previous observation for
every later one, so each call's argument is known only from the observation before it, and the answer ("The result is
9.") from the last one. Every operation is a bijection of 0..19, so the final value is uniform over 20 values at every
horizon (chance accuracy 1/20) and a problem's observations change with its triple: nothing can be memorized.

Why this shape: every model of the study trains from scratch on 2 CPU cores, so the task must be learnable in a few
hundred SFT steps by a small model, yet need its horizon. A model never computes here (the tool does); it must copy
the start from the question, the operation and k from the question, every later value from the latest observation,
and count its calls. Measured (batch 16, lr 3e-3, greedy held-out accuracy over all horizons): a 64-wide 2-layer
student goes from chance (0.04 at 400 steps) to 1.0 at 600 steps, a 32-wide one stays at chance after 800 steps.
The start is the only number of the question, k a number word, 0..19 are single tokens of MiniMind's tokenizer.

``gt`` is the phrase of the answer (``"result is 9."``), not the bare number: MiniMind's check finds a gt item as a
substring of the answer, and the bare "1" would be found in "The result is 11.".

Noise-injected demonstrations (for the robust teacher and the off-policy control arm): each call is, with probability
``noise``, first written corrupted (its expression cut before the modulus, ``"(v op k) %"``, or missing its closing
parenthesis, ``"(v op k % 20"``: both are invalid expressions, so MiniMind's tool world answers ``{"error": "unknown
tool or invalid arguments"}``), followed by that error observation and the correct retry. The corrupted turn has
``"weight": 0``: it is context, never a target (``opd.demonstrations``), and the retry is learned.

Splits are disjoint by triple: a fixed hash of the triple (seed independent) puts it in ``heldout`` (below
``heldout_share``), ``distill`` (below ``heldout_share + distill_share``) or ``train``, with all its horizons. The
held-out file holds every held-out triple once at every horizon, in a seeded order; train and distill records are
drawn with replacement from their triples, each horizon equally often (a repeat is one more example, never a leak).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from common.atomic_write import atomic_write_json, atomic_write_text
from tools.mock_tools import tool_schemas
from tools.tool_calls import ToolCall
from tools.tool_environment import OK, execute_call

SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to find the answer, then state it."
TOOLS = ("calculate_math",)
MODULUS = 20
HORIZONS = (1, 2, 4)
TIMES = {1: "once", 2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times"}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
OPERATIONS = {"+": ("Add", tuple(range(1, 10))), "-": ("Subtract", tuple(range(1, 10))), "*": ("Multiply by", (3, 7, 9))}
SPLITS = ("train", "distill", "heldout")
CORRUPTIONS = ("truncated", "unbalanced")


def all_triples() -> list[tuple[int, str, int]]:
    """Every (start, op, k) of the task: 20 starts x 21 operations."""
    return [(start, op, k) for start in range(MODULUS) for op, (_, ks) in OPERATIONS.items() for k in ks]


def split_of(triple: tuple[int, str, int], heldout_share: float, distill_share: float) -> str:
    """The split of a triple: a fixed hash of it, independent of the seed and of the horizon."""
    digest = hashlib.sha256(json.dumps(list(triple)).encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < heldout_share:
        return "heldout"
    return "distill" if position < heldout_share + distill_share else "train"


def question(triple: tuple[int, str, int], horizon: int) -> str:
    start, op, k = triple
    return (f"Start with {start}. {OPERATIONS[op][0]} {NUMBER_WORDS[k]}, {TIMES[horizon]}, keeping the remainder after "
            f"dividing by {MODULUS} each time. What is the result?")


def expression(value: int, op: str, k: int) -> str:
    return f"({value} {op} {k}) % {MODULUS}"


def corrupted(value: int, op: str, k: int, kind: str) -> str:
    """An invalid expression a careless model could write for the same step (see the module doc)."""
    return f"({value} {op} {k}) %" if kind == "truncated" else f"({value} {op} {k} % {MODULUS}"


def _call_turn(text: str, *, weight: int | None = None) -> dict:
    turn = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calculate_math", "arguments": {"expression": text}}}]}
    if weight is not None:
        turn["weight"] = weight
    return turn


def _observe(text: str) -> tuple[str, dict | None]:
    outcome = execute_call(ToolCall("calculate_math", {"expression": text}), TOOLS)
    return outcome.observation, outcome.result if outcome.status == OK else None


def solve(triple: tuple[int, str, int], horizon: int, *, noise: float = 0.0,
          rng: random.Random | None = None) -> tuple[list[dict], str, int]:
    """The demonstration's turns after the prompt, the final answer's ``gt`` and the number of corrupted calls.

    Observations are exactly what the rollout's tool world returns; a corrupted call (probability ``noise`` per call,
    drawn from ``rng``) comes first, with weight 0, then its error observation, then the correct call.
    """
    value, (_, op, k), turns, mistakes = triple[0], triple, [], 0
    for _ in range(horizon):
        if noise and rng.random() < noise:
            wrong = corrupted(value, op, k, rng.choice(CORRUPTIONS))
            observation, result = _observe(wrong)
            if result is not None:
                raise RuntimeError(f"a corrupted expression was accepted by the tool world: {wrong!r}")
            turns += [_call_turn(wrong, weight=0), {"role": "tool", "content": observation}]
            mistakes += 1
        observation, result = _observe(expression(value, op, k))
        if result is None or int(result["result"]) != _step(value, op, k):
            raise RuntimeError(f"the tool world did not compute {expression(value, op, k)!r}: {observation}")
        turns += [_call_turn(expression(value, op, k)), {"role": "tool", "content": observation}]
        value = _step(value, op, k)
    turns.append({"role": "assistant", "content": f"The result is {value}."})
    return turns, str(value), mistakes


def _step(value: int, op: str, k: int) -> int:
    return (value + k if op == "+" else value - k if op == "-" else value * k) % MODULUS


def make_record(triple: tuple[int, str, int], horizon: int, *, demonstration: bool, noise: float = 0.0,
                rng: random.Random | None = None) -> dict:
    """An agent JSONL row: the system turn declaring ``calculate_math``, the question, ``gt``, then the turns (a
    demonstration) or the gold calls as ``expected_calls`` (a prompt: the evaluation classifies every call against
    them, ``opd.scoring``)."""
    turns, gt, mistakes = solve(triple, horizon, noise=noise, rng=rng)
    conversation = [{"role": "system", "content": SYSTEM_PROMPT, "tools": json.dumps(tool_schemas(list(TOOLS)))},
                    {"role": "user", "content": question(triple, horizon)}]
    row = {"conversations": conversation + (turns if demonstration else []), "gt": [f"result is {gt}."],
           "task": {"triple": list(triple), "horizon": horizon, **({"corrupted_calls": mistakes} if demonstration else {})}}
    if not demonstration:  # the calls that are learned (weight-0 corrupted calls are not)
        row["expected_calls"] = [call["function"] for turn in turns if turn.get("weight", 1)
                                 for call in turn.get("tool_calls", [])]
    return row


def split_triples(heldout_share: float, distill_share: float) -> dict[str, list[tuple[int, str, int]]]:
    if not (0 < heldout_share and 0 < distill_share and heldout_share + distill_share < 1):
        raise ValueError(f"heldout_share > 0, distill_share > 0 and their sum < 1 are required, got {heldout_share} and "
                         f"{distill_share}")
    triples = {split: [] for split in SPLITS}
    for triple in all_triples():
        triples[split_of(triple, heldout_share, distill_share)].append(triple)
    return triples


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_task(out_dir: str | Path, *, train: int, distill: int, seed: int = 0, horizons: tuple[int, ...] = HORIZONS,
               warm_horizons: tuple[int, ...] = (1,), noise: float = 0.3, heldout_share: float = 0.4,
               distill_share: float = 0.2) -> dict:
    """Write every file of the task into ``out_dir`` (listed in the summary it returns and writes).

    ``train`` SFT demonstrations and ``distill`` distillation prompts per horizon, each horizon equally often;
    the held-out file holds every held-out triple once per horizon. Each ``*_noisy_demonstrations`` file is the
    same problems as its gold file, with corrupted calls injected; ``warm_demonstrations`` holds the gold training
    demonstrations of the ``warm_horizons`` (the study's warm start).
    """
    if not horizons or any(h not in TIMES for h in horizons):
        raise ValueError(f"horizons must be among {sorted(TIMES)}, got {list(horizons)}")
    if not 0 <= noise < 1:
        raise ValueError(f"noise must be in [0, 1), got {noise}")
    if not warm_horizons or not set(warm_horizons) <= set(horizons):
        raise ValueError(f"warm horizons must be among the horizons {list(horizons)}, got {list(warm_horizons)}")
    out, rng = Path(out_dir), random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    triples = split_triples(heldout_share, distill_share)
    files = {}

    def write(name: str, rows: list[dict]) -> None:
        files[name] = str(out / f"{name}.jsonl")
        atomic_write_text(out / f"{name}.jsonl", _jsonl(rows))

    def draw(split: str, per_horizon: int) -> list[tuple[tuple[int, str, int], int]]:
        drawn = [(rng.choice(triples[split]), horizon) for horizon in horizons for _ in range(per_horizon)]
        rng.shuffle(drawn)
        return drawn

    for split, count in (("train", train), ("distill", distill)):
        drawn = draw(split, count)
        gold = [make_record(t, h, demonstration=True) for t, h in drawn]
        write(f"{split}_demonstrations", gold)
        if split == "train":
            write("warm_demonstrations", [row for row in gold if row["task"]["horizon"] in warm_horizons])
        write(f"{split}_noisy_demonstrations",
              [make_record(t, h, demonstration=True, noise=noise, rng=rng) for t, h in drawn])
        write(f"{split}_prompts", [make_record(t, h, demonstration=False) for t, h in drawn])
    heldout = [(triple, horizon) for horizon in horizons for triple in triples["heldout"]]
    rng.shuffle(heldout)
    write("heldout_prompts", [make_record(t, h, demonstration=False) for t, h in heldout])
    summary = {"seed": seed, "horizons": list(horizons), "warm_horizons": list(warm_horizons), "noise": noise,
               "heldout_share": heldout_share,
               "distill_share": distill_share, "modulus": MODULUS, "tools": list(TOOLS),
               "triples": {split: len(found) for split, found in triples.items()},
               "records": {"train": train * len(horizons), "distill": distill * len(horizons),
                           "heldout": len(heldout)}, "files": files}
    atomic_write_json(out / "task_summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSONL files")
    parser.add_argument("--train", type=int, default=1500, help="SFT demonstrations per horizon")
    parser.add_argument("--distill", type=int, default=300, help="distillation prompts per horizon")
    parser.add_argument("--horizons", default="1,2,4", help="comma list of horizons")
    parser.add_argument("--warm-horizons", default="1", help="comma list: the horizons of warm_demonstrations")
    parser.add_argument("--noise", type=float, default=0.3, help="probability of a corrupted call before each call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        summary = write_task(args.out, train=args.train, distill=args.distill, seed=args.seed, noise=args.noise,
                             horizons=tuple(int(h) for h in args.horizons.split(",")),
                             warm_horizons=tuple(int(h) for h in args.warm_horizons.split(",")))
    except ValueError as error:
        parser.error(str(error))
    print(json.dumps(summary, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()

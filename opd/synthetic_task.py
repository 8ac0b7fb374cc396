"""A seeded synthetic tool-use task whose answers need the mock tools, with gold demonstrations and splits.

    python -m opd.synthetic_task --out out/recipe/data --train 3000 --heldout 200 --seed 0

Five kinds of problem, all inside MiniMind's tool world (``tools.mock_tools``): arithmetic
(``calculate_math``), unit conversion (``unit_converter``, MiniMind's 8 unit pairs), exchange rates
(``get_exchange_rate``, its 8 currency pairs), weather (``get_current_weather``, its 15 cities) and
converting an amount of money, which takes two steps (the rate, then ``calculate_math`` on the amount times
that rate). Every record declares the same four tools, so a batch shares its system prompt. A
demonstration is the gold episode: the assistant's tool call(s), each tool's observation (exactly the
observation text the rollout's mock-tool environment returns) and a final answer; ``gt`` holds the
strings that answer must contain, as the observations render them (``"84"``, ``"62.1371"``, ``"28°C"``).

Splits are disjoint by problem, not just by wording: each problem has a key (the expression; the value
and units; the currency pair; the city; amount and pair) and a key belongs to the held-out split when a
hash of it falls below ``heldout_share``. So a held-out city's weather or a held-out currency pair's rate
is never asked in training (the pair's rate still appears in training amount problems). MiniMind's tables
are small (at the default share 4 of the 15 cities and 1 of the 8 pairs are held out), so both splits
repeat problems: a repeat is one more example of a problem, never a leak.

Files written to ``--out``: ``train_demonstrations.jsonl`` (full conversations, for SFT and the
fixed-data baseline), ``train_prompts.jsonl`` and ``heldout_prompts.jsonl`` (system + user turn and
``gt``, for OPD and evaluation), and ``task_summary.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opd.atomic_write import atomic_write_json, atomic_write_text
from tools.mock_tools import EXCHANGE_RATES, UNIT_FACTORS, WEATHER, tool_schemas
from tools.tool_calls import ToolCall
from tools.tool_environment import OK, execute_call

TASK_TOOLS = ("calculate_math", "unit_converter", "get_exchange_rate", "get_current_weather")
SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to find the answer, then state it."
SPLITS = ("train", "heldout")

CITIES = tuple(WEATHER)
CURRENCY_PAIRS = tuple(EXCHANGE_RATES)
UNIT_PAIRS = tuple(tuple(pair.split("_")) for pair in UNIT_FACTORS)
QUESTIONS = {
    "arithmetic": ("What is {expression}?", "Calculate {expression}.", "Please compute {expression} for me."),
    "unit": ("Convert {value} {source} to {target}.", "How many {target} is {value} {source}?",
             "What is {value} {source} in {target}?"),
    "rate": ("What is the exchange rate from {source} to {target}?", "How many {target} does one {source} buy?",
             "Give me the {source} to {target} exchange rate."),
    "weather": ("What's the weather in {city}?", "How is the weather in {city} right now?",
                "Tell me the current weather in {city}."),
    "amount": ("How much is {amount} {source} in {target}?", "Convert {amount} {source} into {target}.",
               "What is {amount} {source} worth in {target}?"),
}
KINDS = tuple(QUESTIONS)


@dataclass(frozen=True)
class Problem:
    """One drawn problem: its kind, the key that identifies it across wordings, and the user question."""

    kind: str
    key: tuple
    question: str
    values: dict


def _number(value) -> str:
    """A tool result number exactly as it appears in the JSON observation."""
    return json.dumps(value)


def _draw_arithmetic(rng: random.Random) -> tuple[tuple, dict]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    operator = rng.choice("+-*")
    if operator == "*":
        b = rng.randint(2, 99)
    expression = f"{a} {operator} {b}"
    if rng.random() < 0.25:
        expression = f"({expression}) {rng.choice('+-*')} {rng.randint(2, 20)}"
    return ("arithmetic", expression), {"expression": expression}


def _draw_unit(rng: random.Random) -> tuple[tuple, dict]:
    value, (source, target) = rng.randint(1, 500), rng.choice(UNIT_PAIRS)
    return ("unit", value, source, target), {"value": value, "source": source, "target": target}


def _draw_rate(rng: random.Random) -> tuple[tuple, dict]:
    source, target = rng.choice(CURRENCY_PAIRS)
    return ("rate", source, target), {"source": source, "target": target}


def _draw_weather(rng: random.Random) -> tuple[tuple, dict]:
    city = rng.choice(CITIES)
    return ("weather", city), {"city": city}


def _draw_amount(rng: random.Random) -> tuple[tuple, dict]:
    amount, (source, target) = rng.randint(2, 900), rng.choice(CURRENCY_PAIRS)
    return ("amount", amount, source, target), {"amount": amount, "source": source, "target": target}


DRAWS: dict[str, Callable[[random.Random], tuple[tuple, dict]]] = {
    "arithmetic": _draw_arithmetic, "unit": _draw_unit, "rate": _draw_rate, "weather": _draw_weather,
    "amount": _draw_amount,
}


def draw_problem(rng: random.Random, kind: str) -> Problem:
    """A random problem of ``kind`` in one of its wordings."""
    key, values = DRAWS[kind](rng)
    question = rng.choice(QUESTIONS[kind]).format(**values)
    return Problem(kind, key, question, values)


def split_of(key: tuple, heldout_share: float) -> str:
    """The split a problem key belongs to: a fixed hash of the key, independent of the seed."""
    digest = hashlib.sha256(json.dumps(key).encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < heldout_share else "train"


def _call(name: str, arguments: dict, messages: list[dict]) -> dict:
    """Run one mock tool as the rollout would, append the call and its observation, return the result."""
    outcome = execute_call(ToolCall(name, arguments), TASK_TOOLS)
    if outcome.status != OK:
        raise RuntimeError(f"synthetic task generated a failing call {name}({arguments}): {outcome.detail}")
    messages.append({"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]})
    messages.append({"role": "tool", "content": outcome.observation})
    return outcome.result


def solve(problem: Problem) -> tuple[list[dict], list[str]]:
    """The gold demonstration (assistant/tool messages, ending with the final answer) and the ``gt`` strings."""
    v, turns = problem.values, []
    if problem.kind == "arithmetic":
        result = _call("calculate_math", {"expression": v["expression"]}, turns)["result"]
        answer, gt = f"The result is {result}.", [result]
    elif problem.kind == "unit":
        arguments = {"value": v["value"], "from_unit": v["source"], "to_unit": v["target"]}
        result = _number(_call("unit_converter", arguments, turns)["result"])
        answer, gt = f"That is {result} {v['target']}.", [result]
    elif problem.kind == "rate":
        rate = _number(_call("get_exchange_rate", {"from_currency": v["source"], "to_currency": v["target"]},
                             turns)["rate"])
        answer, gt = f"One {v['source']} is {rate} {v['target']}.", [rate]
    elif problem.kind == "weather":
        report = _call("get_current_weather", {"location": v["city"]}, turns)
        answer = f"It is {report['temperature']} and {report['condition']} in {v['city']}."
        gt = [report["temperature"], report["condition"]]
    else:
        rate = _number(_call("get_exchange_rate", {"from_currency": v["source"], "to_currency": v["target"]},
                             turns)["rate"])
        total = _call("calculate_math", {"expression": f"{v['amount']} * {rate}"}, turns)["result"]
        answer, gt = f"{v['amount']} {v['source']} is {total} {v['target']}.", [total]
    turns.append({"role": "assistant", "content": answer})
    return turns, gt


def make_record(problem: Problem, *, with_demonstration: bool) -> dict:
    """An agent JSONL row: system turn declaring the tools, the question, ``gt``, optionally the gold turns."""
    demonstration, gt = solve(problem)
    system = {"role": "system", "content": SYSTEM_PROMPT, "tools": json.dumps(tool_schemas(list(TASK_TOOLS)))}
    conversation = [system, {"role": "user", "content": problem.question}]
    if with_demonstration:
        conversation += demonstration
    return {"conversations": conversation, "gt": gt, "task": {"kind": problem.kind, "key": list(problem.key)}}


def kind_quotas(count: int, kinds: tuple[str, ...]) -> dict[str, int]:
    """``count`` records spread evenly over ``kinds`` (the first kinds take the remainder)."""
    return {kind: count // len(kinds) + (index < count % len(kinds)) for index, kind in enumerate(kinds)}


def generate_problems(counts: dict[str, int], *, seed: int, heldout_share: float = 0.2,
                      kinds: tuple[str, ...] = KINDS, max_draws: int | None = None) -> dict[str, list[Problem]]:
    """Problems per split with kinds balanced and no problem key in two splits (a split may repeat a problem)."""
    if not 0 < heldout_share < 1:
        raise ValueError(f"heldout_share must be in (0, 1), got {heldout_share}")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds}")
    rng = random.Random(seed)
    quotas = {split: kind_quotas(count, kinds) for split, count in counts.items()}
    problems: dict[str, list[Problem]] = {split: [] for split in counts}
    for _ in range(max_draws or 200 * (sum(counts.values()) + 10)):
        open_kinds = [kind for kind in kinds if any(quota[kind] for quota in quotas.values())]
        if not open_kinds:
            return problems
        problem = draw_problem(rng, rng.choice(open_kinds))
        split = split_of(problem.key, heldout_share)
        if not quotas.get(split, {}).get(problem.kind):
            continue
        problems[split].append(problem)
        quotas[split][problem.kind] -= 1
    short = {split: {kind: left for kind, left in quota.items() if left} for split, quota in quotas.items()}
    raise ValueError(f"could not draw enough problems (still missing {short}): at heldout_share={heldout_share} "
                     "no problem of that kind falls in that split; choose another heldout_share")


def write_task(out_dir: str | Path, *, train: int, heldout: int, seed: int = 0, heldout_share: float = 0.2,
               kinds: tuple[str, ...] = KINDS) -> dict:
    """Generate both splits and write the three JSONL files and ``task_summary.json``; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    problems = generate_problems({"train": train, "heldout": heldout}, seed=seed, heldout_share=heldout_share,
                                 kinds=kinds)
    files = {"train_demonstrations": ("train", True), "train_prompts": ("train", False),
             "heldout_prompts": ("heldout", False)}
    for name, (split, demonstrations) in files.items():
        rows = [make_record(p, with_demonstration=demonstrations) for p in problems[split]]
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    summary = {
        "seed": seed, "heldout_share": heldout_share, "tools": list(TASK_TOOLS),
        "files": {name: str(out / f"{name}.jsonl") for name in files},
        **{f"{split}_kinds": dict(sorted(Counter(p.kind for p in problems[split]).items())) for split in SPLITS},
        "train_distinct_problems": len({p.key for p in problems["train"]}),
        "heldout_distinct_problems": len({p.key for p in problems["heldout"]}),
    }
    atomic_write_json(out / "task_summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSONL files")
    parser.add_argument("--train", type=int, default=3000, help="train records")
    parser.add_argument("--heldout", type=int, default=200, help="held-out records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-share", type=float, default=0.2, help="share of problem keys held out")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    args = parser.parse_args(argv)
    summary = write_task(args.out, train=args.train, heldout=args.heldout, seed=args.seed,
                         heldout_share=args.heldout_share, kinds=tuple(args.kinds.split(",")))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

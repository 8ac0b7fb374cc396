"""Chains of dependent calculator calls in MiniMind's tool world: a horizon of H calls, each needing the last one's result.

    python -m experiments.study.chain_task --out out/study/data --train 1500 --distill 300 --seed 0
    python -m experiments.study.chain_task --out out/study/data --train 1500 --distill 300 --seed 0 --part noisy \
        --value-noise 0.2 --syntax-noise 0.05

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

**Checked problems** (``--checked``): the question also states a check of its start, "Start with 13, which is 2
minus 9 modulo 20.", and every call asserts its input before it steps: ``"1 // 0 ** ((2 - 9 - 13) % 20) * (13 - 6) %
20"`` for the first (the check), ``"1 // 0 ** ((13 - 6 - 7) % 20) * (7 - 6) % 20"`` for the next (the step before it,
as the previous call wrote it, and that call's result). The guard is 1 when the input is the guarded step's result and
``1 // 0`` otherwise, so a wrong input, the students' commonest error, gets MiniMind's error observation instead of a
plausible result: an error the model sees, where an unchecked wrong input can only be noticed by comparing two
numbers, which the study's small teachers did not learn (``experiments/study/notes/2026-12-02-pilots-one-to-six.md``).
A wrong k still runs. The observations and answers are those of the unchecked problem. The check's n (1..9) is drawn
per record (its own generator, ``task.check_key``), so the same problem comes with several checks: the check must be
read from the question, not remembered with the problem (with n a fixed hash of the problem, the pilot's teacher
learnt the training problems' checks by heart and missed the held-out ones).

**Operand-checked problems** (``--checked-operand``, with ``--checked``): the question states a check of k as well,
"Subtract six, which is 10 minus 4 modulo 20, four times, ...", and every guard adds it to its exponent,
``"1 // 0 ** ((2 - 9 - 13) % 20 + (10 - 4 - 6) % 20) * (13 - 6) % 20"``: the two terms are in 0..19, so the factor
is 1 only when both are 0, and a misread k (in the check and the step alike) fails as a wrong input does. A wrong
operation, or a number wrong in the step alone, still runs. Its m (1..9) is drawn per record from a generator of its
own (``task.operand_key``), so the problems and their start checks are the checked task's.

``gt`` is the phrase of the answer (``"result is 9."``), not the bare number: MiniMind's check finds a gt item as a
substring of the answer, and the bare "1" would be found in "The result is 11.".

Noise-injected demonstrations (DART: the robust teacher and the ``kd_dart`` arm) hold the errors a student makes,
each followed by the recovery. Before each call (a retry included), with probability ``value_noise``, a *confused*
call is written first: one number replaced, either k (another k of the operation: a misread question) with
probability ``operand_share``, or else the input value (another of 0..19: a misread start or observation), always
with a result other than the correct one; it runs, and its real observation follows. Then, with probability
``syntax_noise`` instead, a *corrupted* call: its expression cut before the modulus, ``"(v op k) %"``, or missing
its closing parenthesis, ``"(v op k % 20"``: both invalid, so MiniMind's tool world answers ``{"error": "unknown
tool or invalid arguments"}``. In a checked problem a wrong input is written in the guard and the step alike, so the
guard fails and the tool world's error text follows; and with probability ``guard_share`` the confused number is
instead one of the guard's (the check, or the step before, or the operand's check misread), which fails the guard
too: which one is drawn by the weights ``--guard-numbers`` over a, b of ``(a op b - v)`` and c, m of ``(c - m - k)``
(by default a alone; a value of another number that still passes the guard is never drawn). The rates and weights
are set from the warm students' own errors at temperature 1: by hand from the rates
``experiments.study.gates.student_error_rates`` reports, or read by ``--noise-rates`` from the file
``experiments.study.noise_match`` writes from them.

Either way the retry follows: the step again from the last correct value, itself a call that noise may precede again
(a retry that fails is retried, the state a teacher meets when its retry of a student's error goes wrong). So a
wrong value is visible (the call's expression sits in the context beside the question and the previous observation)
and fixable (a retry from the last correct value is the right move), and every episode still has H correct calls.
The noise turn has ``"weight": 0``: it is context, never a target (``opd.episodes.demonstrations``); the retry is learned.
The retry turn says so before its call (``RETRY_NOTE``, as an agent states what it noticed): noticing the wrong
value and choosing which observation to copy are then decisions at two different tokens. A bare retry asks both of
one token, which the pilot's 2-layer teacher did not learn
(``experiments/study/notes/2026-12-02-pilots-one-to-six.md``, "Pilot"). With ``--retry-names-input`` the note also
names the value the retry starts from ("That call was wrong; redoing the step from 7."): the copy of the last correct
result is then made in words, where no earlier text ends as the note does, before the guard repeats it (the ninth
pilot's operand-checked teacher wrote a wrong input into the guard of most later-call retries,
``experiments/study/notes/2026-12-04-after-the-first-full-run.md``, "A ninth pilot"). Broken JSON is not injected:
MiniMind's tool world gives it no observation and the episode ends there, so there is nothing to recover in a
demonstration.

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
import re
from pathlib import Path

from common.atomic_write import atomic_write_json, atomic_write_text
from tools.mock_tools import tool_schemas
from tools.tool_calls import ToolCall
from tools.tool_environment import OK, execute_call

SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to find the answer, then state it."
TOOLS = ("calculate_math",)
MODULUS = 20
HORIZONS = (1, 2, 4, 6)
TIMES = {1: "once", 2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times"}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
OPERATIONS = {"+": ("Add", tuple(range(1, 10))), "-": ("Subtract", tuple(range(1, 10))), "*": ("Multiply by", (3, 7, 9))}
SPLITS = ("train", "distill", "heldout")
CORRUPTIONS = ("truncated", "unbalanced")
RETRY_NOTE = "That call was wrong; redoing the step."  # the content of a retry turn, before its call


def retry_note(value: int | None = None) -> str:
    """``RETRY_NOTE``, or with the retry's input ``value`` the note that names it: "That call was wrong; redoing the
    step from 7." (``--retry-names-input``)."""
    return RETRY_NOTE if value is None else f"{RETRY_NOTE[:-1]} from {value}."


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


CHECK_KEYS = tuple(range(1, 10))  # n of a checked problem's start: start = (check - n) % MODULUS


def question(triple: tuple[int, str, int], horizon: int, *, key: int | None = None,
             operand_key: int | None = None) -> str:
    """The user's question; with a check ``key`` n, it states the start's check too, and with an ``operand_key`` m
    the operand's ("Subtract six, which is 15 minus 9 modulo 20, four times, ...")."""
    start, op, k = triple
    stated = (f"Start with {start}." if key is None
              else f"Start with {start}, which is {(start + key) % MODULUS} minus {key} modulo {MODULUS}.")
    operand = (NUMBER_WORDS[k] if operand_key is None
               else f"{NUMBER_WORDS[k]}, which is {(k + operand_key) % MODULUS} minus {operand_key} modulo {MODULUS}")
    return (f"{stated} {OPERATIONS[op][0]} {operand}, {TIMES[horizon]}, keeping the remainder after "
            f"dividing by {MODULUS} each time. What is the result?")


Guard = tuple[int, str, int]  # (a, op, b): the step whose result the input must be, (a op b) % MODULUS
OperandCheck = tuple[int, int]  # (c, m): the question's check of the operand, k = (c - m) % MODULUS


def expression(value: int, op: str, k: int, guard: Guard | None = None,
               operand_check: OperandCheck | None = None) -> str:
    """``(value op k) % MODULUS``; with a ``guard``, preceded by a factor that fails unless ``value`` is its result:
    ``1 // 0 ** ((a op b - value) % MODULUS) * (value op k) % MODULUS`` (``0 ** 0`` is 1, ``0 ** x`` is 0 for x > 0,
    and ``1 // 0`` fails); with an ``operand_check`` too, the exponent also adds ``(c - m - k) % MODULUS``, so the
    factor fails unless k is the question's operand as well (two terms in 0..MODULUS-1: 0 only when both are)."""
    step = f"({value} {op} {k}) % {MODULUS}"
    if guard is None:
        return step
    a, guard_op, b = guard
    checked = "" if operand_check is None else f" + ({operand_check[0]} - {operand_check[1]} - {k}) % {MODULUS}"
    return f"1 // 0 ** (({a} {guard_op} {b} - {value}) % {MODULUS}{checked}) * {step}"


# what ``expression`` writes, without and with a guard (and its operand's check)
STEP = re.compile(r"^\((\d+) ([-+*]) (\d+)\) % (\d+)$")
GUARDED_STEP = re.compile(r"^1 // 0 \*\* \(\((\d+) ([-+*]) (\d+) - (\d+)\) % (\d+)"
                          r"(?: \+ \((\d+) - (\d+) - (\d+)\) % (\d+))?"
                          r"\) \* \((?P<value>\d+) (?P<op>[-+*]) (?P<k>\d+)\) % (\d+)$")


def step_numbers(text: str) -> tuple[int, str, int] | None:
    """(input, op, k) of an expression shaped as ``expression`` writes it (any modulus; of a guarded one, its step's),
    None for any other text."""
    found = STEP.match(text)
    if found:
        return int(found[1]), found[2], int(found[3])
    found = GUARDED_STEP.match(text)
    return (int(found["value"]), found["op"], int(found["k"])) if found else None


def guard_numbers_of(text: str) -> dict[str, int] | None:
    """The guard's numbers (``GUARD_NUMBERS``: a, b, and with an operand check c, m) of a guarded expression shaped
    as ``expression`` writes it, None for any other text."""
    found = GUARDED_STEP.match(text)
    if not found:
        return None
    numbers = {"a": int(found[1]), "b": int(found[3])}
    return numbers if found[6] is None else {**numbers, "c": int(found[6]), "m": int(found[7])}


def corrupted(value: int, op: str, k: int, kind: str, guard: Guard | None = None,
              operand_check: OperandCheck | None = None) -> str:
    """An invalid expression a careless model could write for the same step (see the module doc)."""
    text = expression(value, op, k, guard, operand_check)
    if kind == "truncated":
        return text.rsplit(" ", 1)[0]  # the modulus cut off: "... %"
    last = text.rindex(")")  # the step's closing parenthesis dropped
    return text[:last] + text[last + 1:]


GUARD_NUMBERS = ("a", "b", "c", "m")  # a guard's numbers: (a op b - input), and the operand check's (c - m - k)


def _guard_holds(value: int, k: int, guard: Guard, operand_check: OperandCheck | None) -> bool:
    a, guard_op, b = guard
    return _step(a, guard_op, b) == value and (operand_check is None or (operand_check[0] - operand_check[1]) % MODULUS == k)


def confused(value: int, op: str, k: int, rng: random.Random, operand_share: float, guard: Guard | None = None,
             guard_share: float = 0.0, operand_check: OperandCheck | None = None,
             guard_numbers: dict[str, float] | None = None) -> str:
    """A valid expression for the same step with one number wrong: with a guard, with probability ``guard_share``
    one of the guard's numbers (the check or the step before misread, or the operand's check; the guard fails),
    drawn by the weights ``guard_numbers`` over ``GUARD_NUMBERS`` (default: the first operand, ``a``, alone);
    else k with probability ``operand_share``, else the input value, in the step and in the guard (or operand check)
    alike (see the module doc). Its result is never the correct one; with a guard a wrong input fails it, and with
    an operand check a wrong k too."""
    if guard is not None and guard_share and rng.random() < guard_share:
        weights = guard_numbers or {"a": 1.0}
        names = [name for name in GUARD_NUMBERS if weights.get(name)]
        name = names[0] if len(names) == 1 else rng.choices(names, [weights[name] for name in names])[0]
        if name in ("c", "m") and operand_check is None:
            raise ValueError(f"guard number {name!r} belongs to the operand's check, which this call does not have")
        index = "abcm".index(name)
        misread = []  # every guard with that number replaced by another that fails it
        for other in range(MODULUS):
            wrong_guard, wrong_check = list(guard), list(operand_check or ())
            numbers, position = (wrong_guard, 2 * index) if index < 2 else (wrong_check, index - 2)
            if other != numbers[position]:
                numbers[position] = other
                checked = tuple(wrong_check) if operand_check else None
                if not _guard_holds(value, k, tuple(wrong_guard), checked):
                    misread.append((tuple(wrong_guard), checked))
        if not misread:  # b of a product with a = 0 (every b gives 0): the first operand, which always fails
            misread = [((other, guard[1], guard[2]), operand_check) for other in range(MODULUS) if other != guard[0]]
        return expression(value, op, k, *rng.choice(misread))
    ks = OPERATIONS[op][1]
    while True:
        if rng.random() >= operand_share:
            wrong_value, wrong_k = rng.choice([v for v in range(MODULUS) if v != value]), k
        elif len(ks) > 1:
            wrong_value, wrong_k = value, rng.choice([other for other in ks if other != k])
        else:
            continue
        if _step(wrong_value, op, wrong_k) != _step(value, op, k):
            return expression(wrong_value, op, wrong_k, guard, operand_check)


def _call_turn(text: str, *, weight: int | None = None, note: str = "") -> dict:
    turn = {"role": "assistant", "content": note,
            "tool_calls": [{"type": "function", "function": {"name": "calculate_math", "arguments": {"expression": text}}}]}
    if weight is not None:
        turn["weight"] = weight
    return turn


def _observe(text: str) -> tuple[str, dict | None]:
    outcome = execute_call(ToolCall("calculate_math", {"expression": text}), TOOLS)
    return outcome.observation, outcome.result if outcome.status == OK else None


def solve(triple: tuple[int, str, int], horizon: int, *, value_noise: float = 0.0, syntax_noise: float = 0.0,
          operand_share: float = 0.0, rng: random.Random | None = None, key: int | None = None,
          guard_share: float = 0.0, operand_key: int | None = None, retry_names_input: bool = False,
          guard_numbers: dict[str, float] | None = None) -> tuple[list[dict], str, dict[str, int]]:
    """The demonstration's turns after the prompt, the final answer's ``gt`` and the noise calls injected by kind
    (``confused``, ``corrupted``).

    Observations are exactly what the rollout's tool world returns; a noise call (probability ``value_noise`` a
    confused one, ``syntax_noise`` a corrupted one, per call, drawn from ``rng``) comes first, with weight 0, then its
    observation, then the retry: ``RETRY_NOTE`` and the correct call from the last correct value. A retry is a call
    too, so it may be preceded by noise again (the note, then another wrong call), up to ``horizon + 1`` noise calls
    per demonstration: with the ``horizon`` calls and the answer, it fits the ``2 * horizon + 2`` turns a rollout
    allows; with ``retry_names_input`` the note names the last correct value (``retry_note``). With a check ``key``:
    every call is guarded (``expression``), the first by the question's check, every later one by the step before
    it; with an ``operand_key`` too, every call also checks its k by the question's.
    """
    value, (_, op, k), turns = triple[0], triple, []
    guard = None if key is None else ((value + key) % MODULUS, "-", key)
    operand_check = None if operand_key is None else ((k + operand_key) % MODULUS, operand_key)
    noise = {"confused": 0, "corrupted": 0}
    for _ in range(horizon):
        note = ""
        while value_noise or syntax_noise:
            draw = rng.random()
            if draw >= value_noise + syntax_noise or sum(noise.values()) > horizon:
                break
            kind = "confused" if draw < value_noise else "corrupted"
            wrong = (confused(value, op, k, rng, operand_share, guard, guard_share, operand_check, guard_numbers)
                     if kind == "confused" else corrupted(value, op, k, rng.choice(CORRUPTIONS), guard, operand_check))
            observation, result = _observe(wrong)
            ran = result is not None
            if ran and (kind == "corrupted" or int(result["result"]) == _step(value, op, k)):
                raise RuntimeError(f"the tool world answered the {kind} call {wrong!r} with {observation}")
            turns += [_call_turn(wrong, weight=0, note=note), {"role": "tool", "content": observation}]
            noise[kind] += 1
            note = retry_note(value if retry_names_input else None)
        right = expression(value, op, k, guard, operand_check)
        observation, result = _observe(right)
        if result is None or int(result["result"]) != _step(value, op, k):
            raise RuntimeError(f"the tool world did not compute {right!r}: {observation}")
        turns += [_call_turn(right, note=note), {"role": "tool", "content": observation}]
        guard = None if key is None else (value, op, k)
        value = _step(value, op, k)
    turns.append({"role": "assistant", "content": f"The result is {value}."})
    return turns, str(value), noise


def _step(value: int, op: str, k: int) -> int:
    return (value + k if op == "+" else value - k if op == "-" else value * k) % MODULUS


def make_record(triple: tuple[int, str, int], horizon: int, *, demonstration: bool, value_noise: float = 0.0,
                syntax_noise: float = 0.0, operand_share: float = 0.0, rng: random.Random | None = None,
                key: int | None = None, guard_share: float = 0.0, operand_key: int | None = None,
                retry_names_input: bool = False, guard_numbers: dict[str, float] | None = None) -> dict:
    """An agent JSONL row: the system turn declaring ``calculate_math``, the question, ``gt``, then the turns (a
    demonstration) or the gold calls as ``expected_calls`` (a prompt: the evaluation classifies every call against
    them, ``opd.episodes.scoring``); ``key`` and ``operand_key``: a checked problem's, kept as ``task.check_key`` and
    ``task.operand_key``."""
    if operand_key is not None and key is None:
        raise ValueError("an operand check needs a checked problem (key), got operand_key without key")
    turns, gt, noise = solve(triple, horizon, value_noise=value_noise, syntax_noise=syntax_noise,
                             operand_share=operand_share, rng=rng, key=key, guard_share=guard_share,
                             operand_key=operand_key, retry_names_input=retry_names_input,
                             guard_numbers=guard_numbers)
    conversation = [{"role": "system", "content": SYSTEM_PROMPT, "tools": json.dumps(tool_schemas(list(TOOLS)))},
                    {"role": "user", "content": question(triple, horizon, key=key, operand_key=operand_key)}]
    row = {"conversations": conversation + (turns if demonstration else []), "gt": [f"result is {gt}."],
           "task": {"triple": list(triple), "horizon": horizon, **({} if key is None else {"check_key": key}),
                    **({} if operand_key is None else {"operand_key": operand_key}),
                    **({"noise_calls": noise} if demonstration else {})}}
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


PARTS = ("task", "noisy")  # what write_task writes: the task's files, or the noise-injected demonstrations


def write_task(out_dir: str | Path, *, train: int, distill: int, seed: int = 0, horizons: tuple[int, ...] = HORIZONS,
               warm_horizons: tuple[int, ...] = (1,), part: str = "task", value_noise: float = 0.2,
               syntax_noise: float = 0.05, operand_share: float = 0.05, heldout_share: float = 0.4,
               distill_share: float = 0.2, checked: bool = False, guard_share: float = 0.0,
               checked_operand: bool = False, retry_names_input: bool = False,
               guard_numbers: dict[str, float] | None = None, warm_noisy_share: float = 0.0) -> dict:
    """Write one ``part`` of the task into ``out_dir`` (listed in the summary it returns and writes,
    ``{part}_summary.json``).

    ``task``: ``train`` SFT demonstrations and ``distill`` distillation prompts per horizon, each horizon equally
    often, as gold demonstrations and as prompts; ``warm_demonstrations``, the gold training demonstrations of the
    ``warm_horizons`` (the study's warm start); the held-out file, every held-out triple once per horizon.
    ``noisy``: the ``*_noisy_demonstrations`` files, the same problems in the same order as the gold ones (the draws
    depend on ``seed`` alone), with noise calls injected from a generator of their own: the noise rates change these
    two files and nothing else. With ``warm_noisy_share`` (part ``task``): also ``warm_noisy_demonstrations``, the
    problems of ``warm_demonstrations`` in the same order, each noise-injected at the noise settings with probability
    ``warm_noisy_share`` (a coin of its own generator; the noise's draws from another) and gold otherwise: a warm
    start whose SFT holds recoveries. ``checked``: every problem states a check of its start and every call is guarded
    (``expression``), so a wrong input fails in the tool world; ``checked_operand`` (with ``checked``): the question
    states a check of k as well and every guard checks k by it, so a wrong k fails too; ``retry_names_input``: each
    noisy demonstration's retry note names the value the retry starts from.
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    if not horizons or any(h not in TIMES for h in horizons):
        raise ValueError(f"horizons must be among {sorted(TIMES)}, got {list(horizons)}")
    if not (0 <= value_noise and 0 <= syntax_noise and value_noise + syntax_noise < 1):
        raise ValueError(f"value_noise >= 0, syntax_noise >= 0 and their sum < 1 are required, got {value_noise} and "
                         f"{syntax_noise}")
    for name, share in (("operand_share", operand_share), ("guard_share", guard_share)):
        if not 0 <= share <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {share}")
    if guard_share and not checked:
        raise ValueError(f"guard_share applies to checked problems only, got {guard_share} without checked")
    if checked_operand and not checked:
        raise ValueError("checked_operand needs checked problems (the operand's check is part of the guard)")
    guard_numbers = dict(guard_numbers or {"a": 1.0})
    if (set(guard_numbers) - set(GUARD_NUMBERS) or any(not w >= 0 for w in guard_numbers.values())
            or not sum(guard_numbers.values()) > 0):
        raise ValueError(f"guard_numbers must weigh some of {', '.join(GUARD_NUMBERS)} by numbers >= 0, not all 0, got "
                         f"{guard_numbers}")
    if not checked_operand and (guard_numbers.get("c") or guard_numbers.get("m")):
        raise ValueError(f"guard_numbers c and m are the operand check's, which needs checked_operand, got {guard_numbers}")
    if not 0 <= warm_noisy_share <= 1 or (warm_noisy_share and part != "task"):
        raise ValueError(f"warm_noisy_share must be in [0, 1], and 0 but for part task, got {warm_noisy_share} for "
                         f"part {part}")
    if retry_names_input and part == "task" and not warm_noisy_share:
        raise ValueError("retry_names_input changes noise-injected demonstrations only (part noisy, or part task with "
                         "warm_noisy_share), got part task without")
    if not warm_horizons or not set(warm_horizons) <= set(horizons):
        raise ValueError(f"warm horizons must be among the horizons {list(horizons)}, got {list(warm_horizons)}")
    out, rng, noise_rng = Path(out_dir), random.Random(seed), random.Random(f"noise-{seed}")
    warm_rng = random.Random(f"warm-{seed}")  # which warm demonstrations are noise-injected
    key_rng = random.Random(f"check-{seed}")  # the checks' own generator: the problems drawn are the unchecked task's
    operand_rng = random.Random(f"operand-check-{seed}")  # and the operand checks': the start checks stay as they were
    out.mkdir(parents=True, exist_ok=True)
    triples = split_triples(heldout_share, distill_share)
    files = {}

    def write(name: str, rows: list[dict]) -> None:
        files[name] = str(out / f"{name}.jsonl")
        atomic_write_text(out / f"{name}.jsonl", _jsonl(rows))

    def keyed(problems: list[tuple[tuple[int, str, int], int]]) -> list[tuple[tuple[int, str, int], int, dict]]:
        return [(triple, horizon, {"key": key_rng.choice(CHECK_KEYS) if checked else None,
                                   "operand_key": operand_rng.choice(CHECK_KEYS) if checked_operand else None})
                for triple, horizon in problems]

    def draw(split: str, per_horizon: int) -> list[tuple[tuple[int, str, int], int, dict]]:
        drawn = [(rng.choice(triples[split]), horizon) for horizon in horizons for _ in range(per_horizon)]
        rng.shuffle(drawn)
        return keyed(drawn)

    noise = {"value_noise": value_noise, "syntax_noise": syntax_noise, "operand_share": operand_share,
             "guard_share": guard_share, "retry_names_input": retry_names_input, "guard_numbers": guard_numbers}
    for split, count in (("train", train), ("distill", distill)):
        drawn = draw(split, count)
        if part == "noisy":
            write(f"{split}_noisy_demonstrations", [make_record(t, h, demonstration=True, rng=noise_rng, **noise, **keys)
                                                    for t, h, keys in drawn])
            continue
        gold = [make_record(t, h, demonstration=True, **keys) for t, h, keys in drawn]
        write(f"{split}_demonstrations", gold)
        if split == "train":
            write("warm_demonstrations", [row for row in gold if row["task"]["horizon"] in warm_horizons])
            if warm_noisy_share:
                write("warm_noisy_demonstrations", [
                    make_record(t, h, demonstration=True, **keys, **(
                        {**noise, "rng": noise_rng} if warm_rng.random() < warm_noisy_share else {}))
                    for t, h, keys in drawn if h in warm_horizons])
        write(f"{split}_prompts", [make_record(t, h, demonstration=False, **keys) for t, h, keys in drawn])
    heldout = [(triple, horizon) for horizon in horizons for triple in triples["heldout"]]
    rng.shuffle(heldout)
    heldout = keyed(heldout)
    if part == "task":
        write("heldout_prompts", [make_record(t, h, demonstration=False, **keys) for t, h, keys in heldout])
    summary = {"part": part, "seed": seed, "checked": checked, "checked_operand": checked_operand,
               "horizons": list(horizons), "warm_horizons": list(warm_horizons),
               **(noise if part == "noisy" or warm_noisy_share else {}),
               **({"warm_noisy_share": warm_noisy_share} if warm_noisy_share else {}),
               "heldout_share": heldout_share, "distill_share": distill_share, "modulus": MODULUS,
               "tools": list(TOOLS), "triples": {split: len(found) for split, found in triples.items()},
               "records": {"train": train * len(horizons), "distill": distill * len(horizons),
                           **({"heldout": len(heldout)} if part == "task" else {})}, "files": files}
    atomic_write_json(out / f"{part}_summary.json", summary)
    return summary


def _weights(parser: argparse.ArgumentParser, text: str) -> dict[str, float]:
    try:
        return {name.strip(): float(weight) for name, weight in (item.split("=") for item in text.split(","))}
    except ValueError:
        parser.error(f"--guard-numbers: name=weight pairs separated by commas, e.g. a=1,c=3, got {text!r}")


NOISE_SETTINGS = ("value_noise", "syntax_noise", "operand_share", "guard_share", "guard_numbers")


def _noise_rates(parser: argparse.ArgumentParser, path: str) -> dict:
    """The noise settings of ``--noise-rates``: the ``settings`` of ``experiments.study.noise_match``'s file."""
    try:
        settings = json.loads(Path(path).read_text())["settings"]
        return {key: settings[key] for key in NOISE_SETTINGS}
    except OSError as error:
        parser.error(f"--noise-rates {path}: cannot read it ({error.strerror})")
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        parser.error(f"--noise-rates {path}: expected experiments.study.noise_match's JSON, whose settings hold "
                     f"{', '.join(NOISE_SETTINGS)} ({type(error).__name__}: {error})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSONL files")
    parser.add_argument("--train", type=int, default=1500, help="SFT demonstrations per horizon")
    parser.add_argument("--distill", type=int, default=300, help="distillation prompts per horizon")
    parser.add_argument("--horizons", default="1,2,4,6", help="comma list of horizons")
    parser.add_argument("--warm-horizons", default="1", help="comma list: the horizons of warm_demonstrations")
    parser.add_argument("--part", choices=PARTS, default="task",
                        help="task: gold demonstrations, prompts, held-out; noisy: the noise-injected demonstrations")
    parser.add_argument("--warm-noisy-share", type=float, default=0.0,
                        help="part task: also warm_noisy_demonstrations, this share of the warm demonstrations "
                             "noise-injected at the settings below")
    parser.add_argument("--value-noise", type=float, default=0.2,
                        help="noisy files: probability of a confused call (one number wrong) before each call")
    parser.add_argument("--syntax-noise", type=float, default=0.05,
                        help="noisy files: probability of a corrupted call (an invalid expression) before each call")
    parser.add_argument("--operand-share", type=float, default=0.05,
                        help="noisy files: of the confused calls, the share with k wrong (else the input value)")
    parser.add_argument("--guard-share", type=float, default=0.0,
                        help="noisy checked files: of the confused calls, the share with a guard number wrong "
                             "(which one: --guard-numbers)")
    parser.add_argument("--guard-numbers", default="a=1",
                        help="noisy checked files: weights of the guard's number misread at the guard share, among a, b "
                             "(the check or the step before: a op b) and c, m (the operand's check: c - m), e.g. a=1,c=3")
    parser.add_argument("--noise-rates", metavar="FILE",
                        help="noisy files: take the five settings above from this file's settings (python -m "
                             "experiments.study.noise_match: the rates measured on the students)")
    parser.add_argument("--checked", action="store_true",
                        help="every problem states a check of its start and every call is guarded by it or the step before")
    parser.add_argument("--checked-operand", action="store_true",
                        help="with --checked: the question checks k too, and every guard checks the call's k by it")
    parser.add_argument("--retry-names-input", action="store_true",
                        help="noisy files: each retry's note names the value it starts from (\"... redoing the step from 7.\")")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    noise = {"value_noise": args.value_noise, "syntax_noise": args.syntax_noise, "operand_share": args.operand_share,
             "guard_share": args.guard_share, "guard_numbers": _weights(parser, args.guard_numbers)}
    if args.noise_rates:
        noise = _noise_rates(parser, args.noise_rates)
    try:
        summary = write_task(args.out, train=args.train, distill=args.distill, seed=args.seed, part=args.part,
                             checked=args.checked, checked_operand=args.checked_operand,
                             retry_names_input=args.retry_names_input, warm_noisy_share=args.warm_noisy_share,
                             **noise,
                             horizons=tuple(int(h) for h in args.horizons.split(",")),
                             warm_horizons=tuple(int(h) for h in args.warm_horizons.split(",")))
    except ValueError as error:
        parser.error(str(error) if not args.noise_rates else f"--noise-rates {args.noise_rates}: {error}")
    except TypeError as error:  # a number of --noise-rates that is not one
        parser.error(f"--noise-rates {args.noise_rates}: every setting must be a number or a mapping of numbers "
                     f"({error})")
    print(json.dumps(summary, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()

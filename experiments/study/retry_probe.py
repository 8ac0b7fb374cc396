"""Does a teacher notice a wrong call? A teacher-forced probe on noise-injected demonstrations.

    python -m experiments.study.retry_probe --checkpoint teacher_robust_128.pth --arch 128,2,2,1 \\
        --data distill_noisy_demonstrations.jsonl --tokenizer PATH --demonstrations 100 --out probe.json

The chain task's noisy demonstrations (``chain_task.py``) follow every weight-0 noise call with a retry that says
``RETRY_NOTE`` before the correct call. This runs the model once over each of the first ``--demonstrations``
demonstrations holding a noise call (the demonstration as context, no sampling) and sorts every trained assistant
turn: ``retry`` (after a noise call: a confused one, ``input`` or ``k`` wrong, or a ``corrupted`` one, at the
``first`` call or a ``later`` one), ``call`` (after a right call or the question) and ``answer``. Per kind it
reports how often the argmax of the turn's first token and of its whole turn equals the demonstration, and the mean
probability of the note's first token there: a model that notices a wrong call says the note after a noise call and
nowhere else; one that learned only how often retries come says it everywhere at about that rate. For retries it
also reports how often the argmax call's input number is the demonstration's (the copy from the last correct value).
``starts_like_note`` is the share of a kind's turns that themselves begin with the note's first token: 0 with the
MiniMind tokenizer, where "That" starts nothing else; a tokenizer that splits finer (a byte-level one) may give the
answers' "The" the same first token, and then P(note) there counts the answer too.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from common.atomic_write import atomic_write_json
from common.minimind.model import load_model
from common.user_errors import exit_on_user_error
from experiments.study.chain_task import RETRY_NOTE, step_numbers
from experiments.study.divergence import model_spec
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import Demonstration, demonstration_episode, load_demonstrations
from tools.tool_calls import ToolCall, split_tool_calls


def turn_kinds(demonstration: Demonstration) -> list[str | None]:
    """Per assistant message: None for a noise call (weight 0), else ``retry-{input,k,corrupted}-{first,later}``,
    ``call`` or ``answer`` (see the module doc)."""
    kinds, previous, calls_done = [], None, 0
    for message in (m for m in demonstration.messages if m["role"] == "assistant"):
        calls = message.get("tool_calls") or []
        expression = calls[0]["function"]["arguments"]["expression"] if calls else None
        if message.get("weight", 1) == 0:
            kinds.append(None)
            previous = expression
            continue
        if previous is not None:
            kinds.append(f"retry-{_confusion(previous, expression)}-{'first' if calls_done == 0 else 'later'}")
        else:
            kinds.append("call" if calls else "answer")
        calls_done += bool(calls)
        previous = None
    return kinds


def _confusion(noise: str, retry: str) -> str:
    """Which number of the noise call differs from the retry's: ``input``, ``k``, or ``corrupted`` (not a step)."""
    wrong, right = step_numbers(noise), step_numbers(retry)
    if wrong is None or right is None:
        return "corrupted"
    return "input" if wrong[0] != right[0] else "k"


def _input_number(text: str) -> int | None:
    """The input of the first call of a turn's text, when it is a chain step."""
    calls = [call for call in split_tool_calls(text)[1] if isinstance(call, ToolCall)]
    step = step_numbers(str(calls[0].arguments.get("expression", ""))) if calls else None
    return step[0] if step else None


def probe(model, chat_format: ChatFormat, demonstrations: list[Demonstration], max_total_len: int) -> dict:
    """Per turn kind: ``turns``, ``first_token_right``, ``whole_turn_right``, ``note_probability``,
    ``starts_like_note`` (means over its turns), and for retries ``input_right``; plus the demonstrations probed."""
    note_token = chat_format.encode(RETRY_NOTE)[0]
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    probed = 0
    for demonstration in demonstrations:
        kinds = turn_kinds(demonstration)
        if None not in kinds:
            continue
        episode = demonstration_episode(demonstration, chat_format, max_total_len)
        ids = torch.tensor([episode.ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        predicted, probabilities = logits.argmax(-1), logits.softmax(-1)
        for kind, turn in zip(kinds, episode.turns, strict=True):
            if kind is None:
                continue
            said, wanted = predicted[turn.start - 1:turn.end - 1], ids[0, turn.start:turn.end]
            row = sums[kind]
            row["turns"] += 1
            row["first_token_right"] += bool(said[0] == wanted[0])
            row["whole_turn_right"] += bool(torch.equal(said, wanted))
            row["note_probability"] += float(probabilities[turn.start - 1, note_token])
            row["starts_like_note"] += bool(wanted[0] == note_token)
            if kind.startswith("retry"):
                numbers = [_input_number(chat_format.decode(tokens.tolist())) for tokens in (said, wanted)]
                row["input_right"] += numbers[1] is not None and numbers[0] == numbers[1]
        probed += 1
    return {"demonstrations": probed, "kinds": {
        kind: {"turns": int(row["turns"]), **{key: value / row["turns"] for key, value in row.items() if key != "turns"}}
        for kind, row in sorted(sums.items())}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="native MiniMind weights (.pth)")
    parser.add_argument("--arch", required=True, help="hidden_size,layers,heads,kv_heads")
    parser.add_argument("--data", required=True, help="the chain task's noisy demonstrations")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--demonstrations", type=int, default=100, help="how many demonstrations holding a noise call")
    parser.add_argument("--max-total-len", type=int, default=1536)
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        model, tokenizer = load_model(model_spec(args.checkpoint, args.arch, args.tokenizer, "teacher"), role="teacher")
        demonstrations, _ = load_demonstrations(args.data)
        noisy = [d for d in demonstrations if None in turn_kinds(d)][:args.demonstrations]
        report = {"checkpoint": args.checkpoint, "data": args.data,
                  **probe(model.eval(), ChatFormat(tokenizer), noisy, args.max_total_len)}
        if args.out:
            atomic_write_json(args.out, report)
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

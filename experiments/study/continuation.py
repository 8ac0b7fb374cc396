"""Gates G4 and G6: can a model recover from the student's own errors? It continues the student's episodes after
their first call error and we count how often it still ends correct (G4: the robust teacher continues them); before
it writes a token, its probability of the retry note's first token there is read (G6: the warm student, on its own
episodes, has the retry in its support).

    python -m experiments.study.continuation --episodes seed0/eval/student/t1/episodes_student.jsonl \\
        --data heldout_prompts.jsonl --tokenizer PATH --model robust.pth --arch 128,2,2,1 \\
        --sampling opd_rollout --seed 0 --out seed0/continuation.json

``--episodes`` is an evaluation's ``episodes_{name}.jsonl`` (``opd/evaluate.py``: each row holds its turns' text and
``opd.episodes.scoring``'s call types). The *post-error prefix* of an episode is its turns up to and including the turn of its
first call error, each call turn followed by the tool world's observations, exactly as the rollout fed them. Only
errors the student can recover from are continued: the row's ``first_error_recoverable`` (``opd.episodes.scoring``: the tool
world answered the call, every error type but ``broken_json``, which MiniMind does not read as a call, and another
turn followed it), so G4 and the recovery rate count the same errors. The teacher
continues each prefix with the turns left (``--max-turns`` minus the prefix's), at ``--sampling`` (a preset of
``configs/sampling/``) with the evaluation's per-record seeds (``opd.rollouts.sampling.sample_seed``), and its episode is scored
by ``opd.episodes.scoring``. ``note_probability``: the mean over the continued prefixes of the model's probability of
``chain_task.RETRY_NOTE``'s first token as the first token of its next turn (teacher-forced on the prefix, one forward
each), also by the erring call. ``recovered`` counts the continuations that end correct with no call past the
chain's (``extra_call``): the shared-set recovery of the study's arms. Writes the counts by first error type, by the erring call (the first call, whose retry reads the
question, or a later one, whose retry reads the last correct call) and the share that ended correct; with
``--episodes-out``, also each continued episode (the prefix's source and first error, the teacher's turns and their
call types), to read how the teacher failed. ``by_misread_number`` counts them by the number the student misread in
its first error (``experiments.study.gates.misread_number``: the input, k, a guard number, or ``unread``): the teacher
copies a misread number it was never shown a retry of (the tenth pilot, study README).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch
from omegaconf import OmegaConf

from common.atomic_write import atomic_write_json, atomic_write_text
from common.chat_records import AgentRecord, load_agent_records
from common.minimind.model import load_model
from common.package_files import CONFIG_DIR
from experiments.estimates import jsonl_rows
from experiments.study.chain_task import RETRY_NOTE
from experiments.study.divergence import model_spec
from experiments.study.gates import gold_calls, misread_number
from opd.config import RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.scoring import BROKEN_JSON, CALL_ERRORS, EXTRA_CALL, FAILED_CALL, WRONG_VALUE, score_episode
from opd.rollouts.rollout import AgentRollout
from opd.rollouts.sampling import record_sampler, sample_seed
from tools.tool_calls import split_tool_calls
from tools.tool_environment import execute_call

SAMPLING_DIR = CONFIG_DIR / "sampling"


def first_error(row: dict) -> tuple[int, int, str] | None:
    """(turn index, call index, error type) of an episode row's first call error, or None."""
    index = next((i for i, kind in enumerate(row["call_types"]) if kind in CALL_ERRORS), None)
    if index is None:
        return None
    seen = 0
    for turn, text in enumerate(row["turn_texts"]):
        seen += len(split_tool_calls(text)[1])
        if index < seen:
            return turn, index, row["call_types"][index]
    raise ValueError(f"{row['source']}: call {index} is in none of its {len(row['turn_texts'])} turns")


def prefix_messages(record: AgentRecord, texts: list[str], eos: str) -> list[dict]:
    """The record's messages, then each turn of ``texts`` as an assistant message followed by the observations the
    rollout fed after it."""
    messages = list(record.messages)
    for text in texts:
        messages.append({"role": "assistant", "content": text.removesuffix(eos)})
        outcomes = [execute_call(block, record.declared_tools) for block in split_tool_calls(text)[1]]
        messages += [{"role": "tool", "content": outcome.observation} for outcome in outcomes if outcome.answered]
    return messages


def continuation_records(rows: list[dict], records: dict[str, AgentRecord], max_turns: int,
                         eos: str) -> tuple[dict[int, list[tuple[AgentRecord, str, int, dict]]], Counter]:
    """The recoverable post-error prefixes as records with their first error's type and call index and the
    episode's row, grouped by the turns left; and why the other error episodes were not continued."""
    by_budget, skipped = defaultdict(list), Counter()
    for row in rows:
        found = first_error(row)
        if found is None:
            continue
        turn, call, kind = found
        if not row["first_error_recoverable"]:  # opd.episodes.scoring's rule, the recovery rate's denominator
            skipped[BROKEN_JSON if kind == BROKEN_JSON else "no_turn_left"] += 1
            continue
        record = records[row["source"]]
        prefix = AgentRecord(prefix_messages(record, row["turn_texts"][:turn + 1], eos), record.tools,
                             f"{row['source']}#sample{row['sample']}", record.gt)
        by_budget[max_turns - turn - 1].append((prefix, kind, call, row))
    return by_budget, skipped


def note_probability(model: torch.nn.Module, chat_format: ChatFormat, prefix: AgentRecord, max_total_len: int) -> float:
    """The model's probability of the retry note's first token as the first token of its turn after ``prefix``."""
    ids = torch.tensor([chat_format.prompt_ids(prefix, max_total_len)])
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    return float(logits.softmax(-1)[chat_format.encode(RETRY_NOTE)[0]])


def sampling_preset(name: str) -> SamplingConfig:
    path = SAMPLING_DIR / f"{name}.yaml"
    if not path.is_file():
        raise SystemExit(f"error: no sampling preset {name!r} in {SAMPLING_DIR}")
    return SamplingConfig(**OmegaConf.to_container(OmegaConf.load(path)))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", required=True, type=Path, help="an evaluation's episodes_{name}.jsonl (or .jsonl.gz)")
    parser.add_argument("--data", required=True, help="the evaluated prompts (the rows' sources)")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--model", required=True, help="the continuing model's .pth (G4: the robust teacher)")
    parser.add_argument("--arch", required=True, help="its hidden_size,layers,heads,kv_heads")
    parser.add_argument("--sampling", default="opd_rollout", help="a preset of configs/sampling/")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=14)
    parser.add_argument("--max-gen-len", type=int, default=64)
    parser.add_argument("--max-total-len", type=int, default=1024)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--episodes-out", type=Path, help="also write every continued episode here (JSONL)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(model_spec(args.model, args.arch, args.tokenizer, "teacher"), role="teacher")
    model.eval()
    chat_format, sampling = ChatFormat(tokenizer), sampling_preset(args.sampling)
    records = {record.source: record for record in load_agent_records(args.data)[0]}
    prompts = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    rows = jsonl_rows(args.episodes)
    by_budget, skipped = continuation_records(rows, records, args.max_turns, tokenizer.eos_token)
    continued, correct = Counter(), Counter()  # by first error type, and by "first_call" / "later_call"
    recovered = Counter()  # of the correct ones, those with no call past the chain's (no extra_call)
    misread, misread_correct = Counter(), Counter()
    notes = defaultdict(list)  # the note's probability, by "first_call" / "later_call"
    continued_rows = []
    for budget, prefixes in sorted(by_budget.items()):
        limits = RolloutConfig(budget, args.max_gen_len, args.max_total_len, False)
        for start in range(0, len(prefixes), args.batch_size):
            chunk = prefixes[start:start + args.batch_size]
            sampler = record_sampler(sampling, "cpu", {r.source: sample_seed(args.seed, r, 0) for r, *_ in chunk})
            episodes = AgentRollout(model, chat_format, sampler, limits).run([record for record, *_ in chunk])
            for episode, (record, kind, call, row) in zip(episodes, chunk, strict=True):
                notes["first_call" if call == 0 else "later_call"].append(
                    note_probability(model, chat_format, record, args.max_total_len))
                score = score_episode(episode, chat_format)
                ended_correct = score.correct
                clean = ended_correct and EXTRA_CALL not in score.call_types
                continued_rows.append({
                    "source": record.source, "first_error": kind, "error_call": call, "turns_left": budget,
                    "correct": ended_correct, "recovered": clean, "final_answer": score.final_answer,
                    "call_types": score.call_types,
                    "note_probability": notes["first_call" if call == 0 else "later_call"][-1],
                    "turn_texts": [tokenizer.decode(episode.turn_ids(i)) for i in range(len(episode.turns))]})
                for key in (kind, "first_call" if call == 0 else "later_call"):
                    continued[key] += 1
                    correct[key] += ended_correct
                    recovered[key] += clean
                readable = kind in (WRONG_VALUE, FAILED_CALL)  # a wrong operation is no misread number
                number = (misread_number(row, gold_calls(prompts, row), call) if readable else None) or "unread"
                misread[number] += 1
                misread_correct[number] += ended_correct
                continued_rows[-1]["misread_number"] = number
    positions = ("first_call", "later_call")
    total, ended_correct = sum(continued[key] for key in positions), sum(correct[key] for key in positions)
    clean = sum(recovered[key] for key in positions)
    report = {"episodes": len(rows), "error_episodes": total + sum(skipped.values()), "continued": total,
              "not_continued": dict(skipped), "correct": ended_correct, "rate": ended_correct / total if total else None,
              "recovered": clean, "recovered_rate": clean / total if total else None,
              "by_first_error": {kind: {"continued": continued[kind], "correct": correct[kind],
                                        "recovered": recovered[kind]} for kind in continued if kind not in positions},
              "by_error_call": {key: {"continued": continued[key], "correct": correct[key], "recovered": recovered[key]}
                                for key in positions if continued[key]},
              "by_misread_number": {key: {"continued": misread[key], "correct": misread_correct[key]}
                                    for key in sorted(misread)},
              "note_probability": _mean([p for found in notes.values() for p in found]),
              "note_probability_by_error_call": {key: _mean(notes[key]) for key in positions if notes[key]},
              "sampling": args.sampling, "model": args.model}
    if args.episodes_out:
        atomic_write_text(args.episodes_out, "".join(json.dumps(row) + "\n" for row in continued_rows))
    atomic_write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Fixed sequences from a dataset's assistant turns: exact ids and a target mask built by hand, token for token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import opd.episodes.demonstrations
from common.chat_records import RecordError
from opd.episodes.chat_format import ChatFormat, PromptTooLongError
from opd.episodes.demonstrations import (
    _start_worker,
    demonstration_episode,
    fitting_episodes,
    load_demonstrations,
    parse_demonstration,
    tokenizing_processes,
)
from opd.episodes.episode import ANSWER, MAX_TURNS, pack_episodes
from tests.helpers.opd_support import call_text, encode, observation_text
from tests.helpers.paths import REPO_ROOT
from tools.mock_tools import tool_schemas

SYSTEM = {"role": "system", "content": "You are a helpful assistant.",
          "tools": json.dumps(tool_schemas(["calculate_math", "get_current_time"]))}


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


DEMONSTRATION = {"conversations": [
    SYSTEM,
    {"role": "user", "content": "What is 2+3, and the time in Tokyo?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [call("calculate_math", expression="2+3")]},
    {"role": "tool", "content": '{"result": 5}'},
    {"role": "assistant", "content": "", "tool_calls": [call("get_current_time", timezone="Asia/Tokyo"),
                                                        call("get_current_weather", location="Oslo")]},
    {"role": "tool", "content": '{"datetime": "2025-03-07 15:30:00", "timezone": "Asia/Tokyo"}'},
    {"role": "tool", "content": '{"error": "not declared"}'},
    {"role": "assistant", "content": "It is 5, and 15:30 in Tokyo."},
    {"role": "user", "content": "Thanks! And 2*4?"},
    {"role": "assistant", "content": "8."},
], "gt": ["5"]}


@pytest.fixture(scope="module")
def chat_format(tokenizer):
    return ChatFormat(tokenizer)


def test_demonstration_targets_are_exactly_the_assistant_turns(tokenizer, chat_format):
    demonstration = parse_demonstration(DEMONSTRATION, "demos.jsonl:1")
    episode = demonstration_episode(demonstration, chat_format, max_total_len=4096)
    eos = [tokenizer.eos_token_id]
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM["content"]}, DEMONSTRATION["conversations"][1]],
        tools=tool_schemas(["calculate_math", "get_current_time"]), tokenize=False, add_generation_prompt=True)
    pieces = [
        (encode(tokenizer, prompt_text), False),
        (encode(tokenizer, "Let me compute.\n" + call_text("calculate_math", expression="2+3")) + eos, True),
        (encode(tokenizer, observation_text('{"result": 5}')), False),
        (encode(tokenizer, call_text("get_current_time", timezone="Asia/Tokyo") + "\n"
                + call_text("get_current_weather", location="Oslo")) + eos, True),
        (encode(tokenizer, observation_text('{"datetime": "2025-03-07 15:30:00", "timezone": "Asia/Tokyo"}',
                                            '{"error": "not declared"}')), False),
        (encode(tokenizer, "It is 5, and 15:30 in Tokyo.") + eos, True),
        (encode(tokenizer, "\n<|im_start|>user\nThanks! And 2*4?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
         False),
        (encode(tokenizer, "8.") + eos, True),
    ]
    ids = [token for piece, _ in pieces for token in piece]
    mask = [target for piece, target in pieces for _ in piece]
    assert episode.ids == ids
    assert episode.target_mask() == mask
    assert episode.prompt_length == len(pieces[0][0])
    assert episode.assistant_tokens == sum(mask) and episode.stop_reason == ANSWER
    assert [[c.status for c in turn.calls] for turn in episode.turns] == [["ok"], ["ok", "undeclared"], [], []]
    assert episode.record.gt == ["5"] and episode.record.messages[-1]["role"] == "user"
    # what the update trains on: the logits before every target token, nothing else
    packed = pack_episodes([episode], tokenizer.pad_token_id)
    assert packed.target_mask[0].tolist() == mask[1:]
    assert packed.input_ids[0, 1:][packed.target_mask[0]].tolist() == [t for t, m in zip(ids, mask, strict=True) if m]
    # decoded, the sequence is the template's rendering of the whole conversation
    rendered = chat_format.render(demonstration.messages, demonstration.record.tools, generation_prompt=False)
    assert tokenizer.decode(ids) + "\n" == rendered


def test_an_assistant_turn_with_weight_0_is_context_not_a_target(tokenizer, chat_format):
    """A demonstrated mistake (weight 0) stays in the sequence, so the turns after it are conditioned on it, but
    none of its tokens is a target; every other turn is learned as before."""
    conversation = [dict(message) for message in DEMONSTRATION["conversations"]]
    conversation[4]["weight"], conversation[7]["weight"] = 0, 1
    weighted = demonstration_episode(parse_demonstration({"conversations": conversation}, "w.jsonl:1"), chat_format)
    plain = demonstration_episode(parse_demonstration(DEMONSTRATION, "demos.jsonl:1"), chat_format)
    assert weighted.ids == plain.ids and [t.trained for t in weighted.turns] == [True, False, True, True]
    second = weighted.turns[1]
    expected = plain.target_mask()
    expected[second.start:second.end] = [False] * (second.end - second.start)
    assert weighted.target_mask() == expected and sum(expected) == sum(plain.target_mask()) - (second.end - second.start)
    assert [[c.status for c in turn.calls] for turn in weighted.turns][1] == ["ok", "undeclared"]  # still checked


@pytest.mark.parametrize("conversation,message", [
    ([SYSTEM, {"role": "user", "content": "hi", "weight": 0}, {"role": "assistant", "content": "x"}],
     r"w.jsonl:2: conversations\[1\].weight: only an assistant message has a weight, 0 \(context, not learned\) or 1, "
     "got 0 on a user message"),
    ([SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "weight": 0.5}],
     r"conversations\[2\].weight: .* got 0.5 on an assistant message"),
    ([SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "weight": True}],
     r"conversations\[2\].weight: .* got True"),
    ([SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "weight": 0}],
     "w.jsonl:2: conversations: every assistant turn has weight 0, so there is nothing to learn from"),
])
def test_bad_weights_are_refused_naming_the_message(conversation, message):
    with pytest.raises(RecordError, match=message):
        parse_demonstration({"conversations": conversation}, "w.jsonl:2")


def test_a_demonstration_ending_in_tool_calls_is_not_an_answer(chat_format):
    row = {"conversations": DEMONSTRATION["conversations"][:3]}
    episode = demonstration_episode(parse_demonstration(row, "d.jsonl:2"), chat_format)
    assert episode.stop_reason == MAX_TURNS and episode.truncated


@pytest.mark.parametrize("conversation,message", [
    ([SYSTEM, {"role": "user", "content": "hi"}], "d.jsonl:4: conversations has no assistant turn"),
    (DEMONSTRATION["conversations"][:4], r"d.jsonl:4: conversations\[3\]: a demonstration must end with an assistant"),
    ([{"role": "assistant", "content": "hi"}], r"d.jsonl:4: conversations\[0\]: starts with an assistant turn"),
    ([SYSTEM, {"role": "assistant", "content": "hi"}], "d.jsonl:4: conversations must end with a user or tool turn"),
    ([SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": 7}],
     r"d.jsonl:4: conversations\[2\].content: expected a string"),
])
def test_bad_demonstrations_are_refused_naming_the_record(conversation, message):
    with pytest.raises(RecordError, match=message):
        parse_demonstration({"conversations": conversation}, "d.jsonl:4")


def test_turns_the_template_cannot_separate_or_too_long_sequences_are_refused(chat_format):
    thinking = {"conversations": [SYSTEM, {"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello", "reasoning_content": "greet back"}]}
    with pytest.raises(RecordError, match="d.jsonl:5: message 2: the chat template renders"):
        demonstration_episode(parse_demonstration(thinking, "d.jsonl:5"), chat_format)
    assert demonstration_episode(parse_demonstration(thinking, "d.jsonl:5"), ChatFormat(
        chat_format.tokenizer, open_thinking=True)).assistant_tokens > 0  # an open think block is part of the turn
    episode = demonstration_episode(parse_demonstration(DEMONSTRATION, "d.jsonl:6"), chat_format)
    with pytest.raises(RecordError, match=f"d.jsonl:6: the demonstration is {len(episode.ids)} tokens"):
        demonstration_episode(parse_demonstration(DEMONSTRATION, "d.jsonl:6"), chat_format, len(episode.ids) - 1)


def test_demonstrations_over_max_total_len_are_refused_or_left_out_and_named(chat_format, caplog):
    short = {"conversations": [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    demonstrations = [parse_demonstration(row, f"d.jsonl:{line}")
                      for line, row in enumerate([short, DEMONSTRATION, short, DEMONSTRATION], start=1)]
    lengths = [len(demonstration_episode(demonstration, chat_format).ids) for demonstration in demonstrations]
    limit = lengths[1] - 1  # one token short for the long one, whose prompt fits
    assert lengths[0] == lengths[2] < limit
    with pytest.raises(RecordError, match=f"d.jsonl:2: the demonstration is {lengths[1]} tokens, over max_total_len"):
        fitting_episodes(demonstrations, chat_format, limit, drop_too_long=False)
    with caplog.at_level("INFO", logger="opd"):
        kept, episodes = fitting_episodes(demonstrations, chat_format, limit, drop_too_long=True)
    assert [demonstration.record.source for demonstration in kept] == ["d.jsonl:1", "d.jsonl:3"]
    assert [episode.ids for episode in episodes] == [demonstration_episode(d, chat_format).ids for d in kept]
    assert f"left out 2 of 4 demonstrations over max_total_len={limit} (drop_too_long): d.jsonl:2, d.jsonl:4" in (
        caplog.text)
    kept, episodes = fitting_episodes(demonstrations, chat_format, lengths[1], drop_too_long=True)
    assert len(kept) == len(episodes) == 4
    with pytest.raises(RecordError, match=r"every demonstration \(4, first d.jsonl:1\) is over max_total_len=3"):
        fitting_episodes(demonstrations, chat_format, 3, drop_too_long=True)  # prompts that leave no room, too


def test_worker_processes_build_the_same_episodes_in_order_and_leave_out_or_refuse_the_same(chat_format,
                                                                                            monkeypatch):
    short = {"conversations": [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    rows = [short, DEMONSTRATION, short, short, DEMONSTRATION, short, DEMONSTRATION]
    demonstrations = [parse_demonstration(row, f"d.jsonl:{line}") for line, row in enumerate(rows, start=1)]
    limit = len(demonstration_episode(demonstrations[1], chat_format).ids) - 1  # DEMONSTRATION is one token over
    monkeypatch.setattr(opd.episodes.demonstrations, "POOL_MIN", 2)  # a pool for these 7, in chunks of 3: 3 + 3 + 1
    monkeypatch.setattr(opd.episodes.demonstrations, "CHUNK", 3)
    kept, episodes = fitting_episodes(demonstrations, chat_format, limit, drop_too_long=True, processes=2)
    alone = fitting_episodes(demonstrations, chat_format, limit, drop_too_long=True, processes=1)
    assert [demonstration.record.source for demonstration in kept] == ["d.jsonl:1", "d.jsonl:3", "d.jsonl:4",
                                                                       "d.jsonl:6"]
    assert kept == alone[0] and episodes == alone[1]  # ids, turns, calls, stop reasons: every field
    assert all(episode.record is demonstration.record for demonstration, episode in zip(kept, episodes, strict=True))
    with pytest.raises(RecordError, match=f"d.jsonl:2: the demonstration is {limit + 1} tokens, over max_total_len"):
        fitting_episodes(demonstrations, chat_format, limit, drop_too_long=False, processes=2)


def test_workers_leave_ctrl_c_and_sigterm_to_the_run_and_auto_shares_the_cpus_among_the_ranks(chat_format,
                                                                                              monkeypatch):
    installed, watchdogs = [], []

    class Watchdog:  # the worker's thread that exits with its parent (tested below, in a real worker)
        def __init__(self, target, args, daemon):
            watchdogs.append((target, args, daemon))

        def start(self):
            pass

    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.append((signum, handler)))
    monkeypatch.setattr(opd.episodes.demonstrations.threading, "Thread", Watchdog)
    monkeypatch.setattr(opd.episodes.demonstrations, "_WORKER", None)
    _start_worker(chat_format, 100)
    assert installed == [(signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_IGN)]
    assert opd.episodes.demonstrations._WORKER == (chat_format, 100)
    assert watchdogs == [(opd.episodes.demonstrations._exit_with_parent, (os.getppid(),), True)]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert tokenizing_processes("auto") == 8 and tokenizing_processes(3) == 3
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS has no affinity: the CPU count instead
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert tokenizing_processes("auto") == 6
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert tokenizing_processes("auto") == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert tokenizing_processes("auto") == 1


WORKER_OF_A_KILLED_RUN = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
from opd.episodes.demonstrations import _start_worker
pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), _start_worker, (None, 1))
print(pool.submit(__import__("os").getpid).result(), flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """The process has exited (a zombie whose new parent has not reaped it yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_worker_whose_training_process_was_killed_exits_instead_of_waiting_for_tasks():
    run = subprocess.Popen([sys.executable, "-c", WORKER_OF_A_KILLED_RUN], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                           text=True)
    worker = int(run.stdout.readline())
    assert not gone(worker)
    run.kill()  # SIGKILL: no cleanup runs in the training process
    run.wait()
    for _ in range(600):  # it checks its parent once a second
        if gone(worker):
            break
        time.sleep(0.1)
    assert gone(worker)


def test_load_demonstrations_names_the_line(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(DEMONSTRATION) + "\n\n" + json.dumps({"messages": [SYSTEM]}) + "\n")
    with pytest.raises(RecordError, match=f"{path}:3: messages has no assistant turn"):
        load_demonstrations(path)
    path.write_text(json.dumps(DEMONSTRATION) + "\n")
    demonstrations, sha256 = load_demonstrations(path)
    assert len(demonstrations) == 1 and demonstrations[0].record.source == f"{path}:1" and len(sha256) == 64


def test_a_text_far_over_max_total_len_is_refused_before_it_is_tokenized(chat_format, monkeypatch):
    """2 MB of user or assistant text (under the line limit): tokenizing it would take seconds and gigabytes
    (10 MB took 27 s and 2.7 GB), but its bytes alone show it cannot fit 2,048 tokens."""
    rendered = chat_format.render(DEMONSTRATION["conversations"], None, generation_prompt=False)
    assert chat_format.token_floor(rendered) <= len(chat_format.encode(rendered))  # a floor indeed
    huge = "x" * 2_000_000
    prompt = parse_demonstration({"conversations": [SYSTEM, {"role": "user", "content": huge},
                                                    {"role": "assistant", "content": "a"}]}, "d.jsonl:7")
    answer = parse_demonstration({"conversations": [SYSTEM, {"role": "user", "content": "q"},
                                                    {"role": "assistant", "content": huge}]}, "d.jsonl:8")
    monkeypatch.setattr(chat_format, "encode", lambda text: pytest.fail(f"tokenized {len(text)} characters"))
    with pytest.raises(PromptTooLongError, match=r"d.jsonl:7: prompt is at least \d+ tokens, leaving no room"):
        chat_format.prompt_ids(prompt.record, 2048)
    with pytest.raises(RecordError, match=r"d.jsonl:8: the demonstration is at least \d+ tokens, over max_total_len"):
        demonstration_episode(answer, chat_format, 2048)

"""Show rows regen wrote: where its output is, its summary, and its first row decoded.

    python -m regen.show_rows out/demo/sample.jsonl --tokenizer TOKENIZER   # what `make demo` produced

The row is shown as its prompt (``loss_mask`` 0) and generated (``loss_mask`` 1) parts, special tokens kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from common.chat_records import json_lines
from common.entry_help import program_name
from common.user_errors import UserError, exit_on_user_error


def split_row(row: object, where: str, vocab_size: int) -> tuple[list[int], list[int]]:
    """The prompt ids (the ``loss_mask`` 0 prefix) and the generated ids (the 1 suffix) of a row; ``UserError``
    names ``where`` and the field that is wrong."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: a row is a JSON object, got {type(row).__name__}")
    fields = {name: row.get(name) for name in ("input_ids", "loss_mask")}
    for name, value in fields.items():
        if not isinstance(value, list) or not all(type(item) is int for item in value):
            raise UserError(f"{where}: {name} must be a list of integers")
    input_ids, loss_mask = fields["input_ids"], fields["loss_mask"]
    if len(input_ids) != len(loss_mask):
        raise UserError(f"{where}: input_ids ({len(input_ids)}) and loss_mask ({len(loss_mask)}) differ in length")
    start = loss_mask.index(1) if 1 in loss_mask else len(loss_mask)
    if any(mask != 0 for mask in loss_mask[:start]) or any(mask != 1 for mask in loss_mask[start:]):
        raise UserError(f"{where}: loss_mask is not 0s followed by 1s")
    if (outside := next((token for token in input_ids if not 0 <= token < vocab_size), None)) is not None:
        raise UserError(f"{where}: input_ids holds {outside}, outside the tokenizer's {vocab_size} ids",
                        "give the tokenizer the rows were written with (--tokenizer)")
    return input_ids[:start], input_ids[start:]


def read_output(path: Path) -> tuple[int, object, str | None]:
    """``(row count, first row, its file:line)`` (None, None without rows); a missing file or bad line is a
    ``UserError``."""
    if not path.is_file():
        raise UserError(f"{path}: no such file", "give the regen output JSONL (the run's output=)")
    count, first, where = 0, None, None
    with path.open("rb") as stream:
        for line in json_lines(stream):
            if line.problem:
                raise UserError(f"{path}:{line.number}: {line.problem}")
            if count == 0:
                first, where = line.value, f"{path}:{line.number}"
            count += 1
    return count, first, where


def read_summary(path: Path) -> dict | None:
    """The run's summary (``<stem>.summary.json``) if there is one; one that is no JSON object is a ``UserError``."""
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: not a regen summary ({error})") from None
    if not isinstance(summary, dict):
        raise UserError(f"{path}: not a regen summary (a JSON {type(summary).__name__}, not an object)")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name("python -m regen.show_rows"),
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the regen output JSONL")
    parser.add_argument("--tokenizer", required=True, help="the tokenizer the rows were written with")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        show(args.output, args.tokenizer)


def show(output: Path, tokenizer_path: str) -> None:
    from common.minimind.tokenizer import load_tokenizer

    console = Console()
    summary_path = output.with_name(f"{output.stem}.summary.json")
    count, row, where = read_output(output)
    console.print(f"[bold]output[/]: {output} ({count} rows)")
    console.print(f"[bold]errors[/]: {output.with_name(output.stem + '.errors.jsonl')}")
    if (summary := read_summary(summary_path)) is not None:
        figures = {k: summary.get(k) for k in ("status", "model", "conversations_done", "conversations_truncated",
                                               "conversations_failed", "rows_written", "completion_tokens_per_s")}
        console.print(f"[bold]summary[/] ({summary_path}): " + escape(json.dumps(figures)))
    if not count:
        console.print("[red]no rows were written[/]")
        raise SystemExit(1)
    tokenizer = load_tokenizer(tokenizer_path)
    prompt, generated = split_row(row, where, len(tokenizer))
    console.print(f"[bold]row[/] {escape(str(row.get('id')))}: {len(prompt)} prompt tokens (loss_mask 0), "
                  f"{len(generated)} generated tokens (loss_mask 1); metadata " + escape(json.dumps(row.get("metadata"))))
    console.print(Panel(Text(tokenizer.decode(prompt, skip_special_tokens=False)), title="prompt (loss_mask 0)"))
    console.print(Panel(Text(tokenizer.decode(generated, skip_special_tokens=False)), title="generated (loss_mask 1)"))


if __name__ == "__main__":
    main()

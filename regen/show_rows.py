"""Show what `make demo` produced: where the output is, its summary, and one row decoded.

    python -m regen.show_rows out/demo/sample.jsonl --tokenizer TOKENIZER

The row is shown as its prompt part (``loss_mask`` 0) and generated part (``loss_mask`` 1), each decoded
with special tokens kept, so the token-level bookkeeping is visible.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from common.entry_help import program_name


def split_by_mask(input_ids: list[int], loss_mask: list[int]) -> tuple[list[int], list[int]]:
    """The prompt ids (mask 0 prefix) and the generated ids (mask 1 suffix) of a row."""
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids ({len(input_ids)}) and loss_mask ({len(loss_mask)}) differ in length")
    start = loss_mask.index(1) if 1 in loss_mask else len(loss_mask)
    if any(m != 1 for m in loss_mask[start:]):
        raise ValueError("loss_mask is not 0s followed by 1s")
    return input_ids[:start], input_ids[start:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name("python -m regen.show_rows"),
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the regen output JSONL")
    parser.add_argument("--tokenizer", required=True, help="the tokenizer the rows were written with")
    args = parser.parse_args(argv)
    from common.minimind.tokenizer import load_tokenizer

    console = Console()
    summary_path = args.output.with_name(f"{args.output.stem}.summary.json")
    rows = [json.loads(line) for line in args.output.read_text().splitlines() if line.strip()]
    console.print(f"[bold]output[/]: {args.output} ({len(rows)} rows)")
    console.print(f"[bold]errors[/]: {args.output.with_name(args.output.stem + '.errors.jsonl')}")
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        figures = {k: summary.get(k) for k in ("status", "model", "conversations_done", "conversations_truncated",
                                               "conversations_failed", "rows_written", "completion_tokens_per_s")}
        console.print(f"[bold]summary[/] ({summary_path}): " + escape(json.dumps(figures)))
    if not rows:
        console.print("[red]no rows were written[/]")
        raise SystemExit(1)
    row = rows[0]
    tokenizer = load_tokenizer(args.tokenizer)
    prompt, generated = split_by_mask(row["input_ids"], row["loss_mask"])
    console.print(f"[bold]row[/] {escape(str(row['id']))}: {len(prompt)} prompt tokens (loss_mask 0), "
                  f"{len(generated)} generated tokens (loss_mask 1); metadata " + escape(json.dumps(row.get("metadata"))))
    console.print(Panel(Text(tokenizer.decode(prompt, skip_special_tokens=False)), title="prompt (loss_mask 0)"))
    console.print(Panel(Text(tokenizer.decode(generated, skip_special_tokens=False)), title="generated (loss_mask 1)"))


if __name__ == "__main__":
    main()

"""The run log's lines: whatever a line quotes from outside stays on it (``printable``)."""

from __future__ import annotations

import logging

from common.run_log import RUN_LOG, printable, show


def test_a_shown_line_keeps_whatever_it_quotes_on_one_line(caplog):
    """Issue 67: a path or a served name holding a newline printed a forged ``error:`` line."""
    assert printable("out/a\nerror: forged\r\x1b[2K\u2028.jsonl") == "out/a\\nerror: forged\\r\\x1b[2K\\u2028.jsonl"
    assert printable("数据/données\tok") == "数据/données\\tok"  # only control characters change
    with caplog.at_level(logging.INFO, logger=RUN_LOG.name):
        show("wrote out/a\nerror: forged.json")
    assert [record.getMessage() for record in caplog.records] == ["wrote out/a\\nerror: forged.json"]

"""``onpolicy-serve`` on a port it cannot listen on: one ``error:`` line naming host:port and the flag that changes
it, and no "serving" line (it was printed before the bind, then a 24-line ``OSError`` traceback)."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys

import pytest

from common.minimind.tiny import tiny_arch, write_tiny_checkpoints
from launch.chat_server import bind_error
from launch.serve import build_parser
from tests.helpers.paths import REPO_ROOT


def test_a_busy_port_is_one_error_line_naming_it(tmp_path, tokenizer_path):
    checkpoint = write_tiny_checkpoints(tmp_path)["teacher"]
    arch = tiny_arch("teacher")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "launch.chat_server", "--checkpoint", str(checkpoint), "--tokenizer",
             str(tokenizer_path), "--hidden-size", str(arch.hidden_size), "--num-hidden-layers",
             str(arch.num_hidden_layers), "--num-attention-heads", str(arch.num_attention_heads),
             "--num-key-value-heads", str(arch.num_key_value_heads), "--port", str(port), "--threads", "1"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines() == [f"error: cannot serve on 127.0.0.1:{port}: address already in use "
                                          "(another program listens there: choose another --port)"]
    assert "serving" not in result.stdout


@pytest.mark.parametrize("error,line", [
    (OSError(errno.EACCES, "error while attempting to bind on address ('0.0.0.0', 80): permission denied"),
     "cannot serve on 0.0.0.0:80: permission denied (ports below 1024 need privileges: choose another --port)"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "cannot serve on 0.0.0.0:80: name or service not known (--host takes an address of this machine, as 127.0.0.1 "
     "or 0.0.0.0)"),
    (OSError(errno.EADDRNOTAVAIL, "error while attempting to bind on address ('0.0.0.0', 80): cannot assign "
                                  "requested address"),
     "cannot serve on 0.0.0.0:80: cannot assign requested address (--host takes an address of this machine, as "
     "127.0.0.1 or 0.0.0.0)"),
])
def test_other_bind_failures_name_the_flag_that_changes_them(error, line):
    assert bind_error("0.0.0.0", 80, error).message == line


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_port_out_of_range_is_refused_by_the_command_line(port, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--checkpoint", "c", "--port", port])
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"argument --port: not a port (1 to 65535): {port}")

"""``onpolicy-serve`` (``python -m launch.chat_server``): the embedded CPU server's command. Arguments are parsed
before torch is imported, so a mistyped flag is refused at once; start-up signals end in one line (130 / 143)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from common.entry_help import program_name
from common.start_up import run_entry


def port_number(text: str) -> int:
    """``--port``: a TCP port, 1 to 65535."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port (1 to 65535): {text}")
    return int(text)



def build_parser() -> argparse.ArgumentParser:
    """The server's arguments (torch-free: ``launch.chat_reply``'s parser names, ``MiniMindArch``'s flags)."""
    from common.minimind.spec import MiniMindArch
    from launch.chat_reply import REASONING_PARSERS, TOOL_CALL_PARSERS

    parser = argparse.ArgumentParser(prog=program_name("python -m launch.chat_server"),
                                     description="The embedded CPU server: an OpenAI-compatible aiohttp app speaking vLLM's dialect, on transformers.")
    parser.add_argument("--checkpoint", required=True, help="native MiniMind .pth, HF model folder or hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder or hub id (required for a .pth)")
    for f in fields(MiniMindArch):  # unset flags fall back to MiniMindArch's defaults
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, type=int, default=None, help="architecture flag of a native checkpoint")
    parser.add_argument("--served-model-name", default=None, help="name in /v1/models (default: --checkpoint)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8011)
    parser.add_argument("--max-batch-size", type=int, default=32, help="most sequences decoded together")
    parser.add_argument("--max-prefill-tokens", type=int, default=8192, help="padded prompt tokens per prefill pass")
    parser.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    parser.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default=None)
    parser.add_argument("--tool-call-parser", choices=[*TOOL_CALL_PARSERS, "none"], default="hermes")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--body-timeout-s", type=float, default=30.0,
                        help="seconds a request's body may take to arrive (then 408 and the connection is closed)")
    parser.add_argument("--api-key", default=None, help="requests must send 'Authorization: Bearer KEY' (vLLM's "
                                                        "flag; default: $VLLM_API_KEY, else no key)")
    parser.add_argument("--max-connections", type=int, default=None,
                        help="open connections at most; past it a new one gets 503 and is closed (default: half "
                             "the open-file limit, at most 4096)")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    return parser


def main() -> None:
    build_parser().parse_args()  # a mistake in the arguments: argparse's message and status 2, before the imports
    run_entry("launch.chat_server")

"""Bringing a server process up and down: readiness probe, bounded wait, log tail, process-group stop.

Ready means ``GET /health`` is 200, then ``GET /v1/models`` answers (with ``$VLLM_API_KEY`` when set). Standard
library only: the regen client imports this. Servers run in their own process group, so one signal reaches every worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from common.user_errors import UserError


class ServerStartError(UserError):
    """A server that died, never became ready, or whose port is taken by another model; ``details`` holds the
    last lines of its log (printed above the ``error:`` line)."""


def _get_json(url: str, *, with_key: bool, timeout_s: float) -> tuple[int, object] | None:
    """``(status, decoded body or None)`` of ``GET url``; ``None`` when nothing answers there."""
    request = urllib.request.Request(url)
    if with_key and (api_key := os.environ.get("VLLM_API_KEY")):
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        return status, json.loads(body) if body.strip() else None
    except ValueError:
        return status, None


def probe_health(base_url: str, *, timeout_s: float = 3.0) -> bool:
    """``GET /health`` answers 200 (no API key: vLLM does not guard it)."""
    answer = _get_json(f"{base_url}/health", with_key=False, timeout_s=timeout_s)
    return answer is not None and answer[0] == 200


def probe_models(base_url: str, *, timeout_s: float = 3.0) -> list[str] | None:
    """The model names ``/v1/models`` lists (``id`` and ``root``); None when the server is not there or not ready.
    A server that refuses ``$VLLM_API_KEY`` is an error."""
    if not probe_health(base_url, timeout_s=timeout_s):
        return None
    answer = _get_json(f"{base_url}/v1/models", with_key=True, timeout_s=timeout_s)
    if answer is None:
        return None
    status, listing = answer
    if status == 401:
        state = "set but refused" if os.environ.get("VLLM_API_KEY") else "not set"
        raise ServerStartError(f"the server at {base_url} is up but wants an API key: $VLLM_API_KEY is {state}")
    cards = listing.get("data") if status == 200 and isinstance(listing, dict) else None
    if not isinstance(cards, list):
        return None
    names = [str(card[key]) for card in cards if isinstance(card, dict) for key in ("id", "root") if card.get(key)]
    return list(dict.fromkeys(names))  # vLLM's card has the same name as id and root: each name once


def log_tail(path: str | Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_detached(command: list[str], log_path: str | Path) -> subprocess.Popen:
    """Start ``command`` in a new session (its own process group), output to ``log_path`` (truncated)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def wait_until_ready(base_url: str, process: subprocess.Popen, *, timeout_s: float, log_path: str | Path,
                     poll_s: float = 0.25) -> None:
    """Return once ``/health`` and ``/v1/models`` answer; raise ``ServerStartError`` with the log tail if the
    process exits first or ``timeout_s`` passes (the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = process.poll()
        if status is not None:
            raise ServerStartError(f"server exited with status {status} before it was ready; last lines of {log_path}:",
                                   details=log_tail(log_path))
        if probe_models(base_url) is not None:
            return
        if time.monotonic() >= deadline:
            raise ServerStartError(f"server not ready at {base_url} after {timeout_s:g}s; last lines of {log_path}:",
                                   details=log_tail(log_path))
        time.sleep(poll_s)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(pgid: int, *, grace_s: float, process: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group ``pgid``, SIGKILL what is left after ``grace_s``; pass ``process`` when the leader
    is this process's child, so it is reaped (a zombie still counts)."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            break
        if _wait_group_gone(pgid, wait_s, process):
            break
    if process is not None:
        process.wait()


def _wait_group_gone(pgid: int, timeout_s: float, process: subprocess.Popen | None) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None:
            process.poll()
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)

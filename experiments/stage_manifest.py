"""A run folder's record of its finished stages: ``manifest.jsonl``, one line per stage when it finishes, with its
commands in a machine-free form (the run folder, the interpreter and named outside inputs such as the tokenizer
replaced by ``{run}``, ``python`` and ``{name}``), the sha256 of every input and output (paths relative to the run
folder), its wall seconds and threads, and the machine, torch, Python and date it ran with. A stage is recognised as
finished by these, never by absolute paths, so a clone in another folder or on another machine continues the run.

The folder's ``.gitignore`` is written from it: git keeps the manifest, the finished stages' outputs (but those of
``rebuilt`` stages, which any machine writes byte for byte) and the files the caller names (a README, the report),
and nothing else (logs, resume files, kept weights nothing reads)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.atomic_write import atomic_write_text
from common.user_errors import UserError

MANIFEST = "manifest.jsonl"
FIELDS = ("stage", "commands", "inputs", "outputs", "wall_s", "threads", "machine", "torch", "python", "finished")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "node": platform.node()}


@dataclass
class Hashes:
    """sha256 of files and folders (a folder: of its files' relative paths and hashes), each read once per size and
    modification time."""

    seen: dict = field(default_factory=dict)

    def of(self, path: Path) -> str:
        if path.is_dir():
            digest = hashlib.sha256()
            for item in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(f"{item.relative_to(path).as_posix()}\0{self.of(item)}\n".encode())
            return digest.hexdigest()
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self.seen:
            digest = hashlib.sha256()
            with path.open("rb") as stream:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
            self.seen[key] = digest.hexdigest()
        return self.seen[key]


class Manifest:
    """The finished stages of the run folder ``root`` (the last line of a stage counts)."""

    def __init__(self, root: Path) -> None:
        self.root, self.path = root, root / MANIFEST
        self.entries: dict[str, tuple[int, dict]] = {}
        if self.path.is_file():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"{self.path}:{number}: not a JSON line ({error.msg})") from None
                missing = [key for key in FIELDS if not isinstance(entry, dict) or key not in entry]
                if missing:
                    raise UserError(f"{self.path}:{number}: a stage line lacks {missing}")
                self.entries[entry["stage"]] = (number, entry)

    def where(self, name: str) -> str:
        return f"{self.path}:{self.entries[name][0]}"

    def append(self, entry: dict) -> None:
        """Add one finished stage: one write of a whole line, flushed to disk before the stage counts as done."""
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.entries[entry["stage"]] = (len(self.path.read_text().splitlines()), entry)

    def write_gitignore(self, keep: tuple[str, ...]) -> None:
        """Everything in the folder ignored but the manifest, each finished stage's outputs and ``keep``."""
        kept = sorted({".gitignore", MANIFEST, *keep, *(rel for _, entry in self.entries.values()
                                                        if not entry.get("rebuilt") for rel in entry["outputs"])})
        atomic_write_text(self.root / ".gitignore", "# written by experiments.stage_manifest: git keeps the manifest "
                          "and the finished stages' outputs only\n*\n!*/\n" + "".join(f"!/{rel}\n" for rel in kept))


def entry(name: str, commands: list[list[str]], inputs: dict, outputs: dict, wall_s: float, threads: int) -> dict:
    import torch

    return {"stage": name, "commands": commands, "inputs": inputs, "outputs": outputs, "wall_s": round(wall_s, 1),
            "threads": threads, "machine": machine(), "torch": torch.__version__, "python": platform.python_version(),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def normalized(command: list[str], places: dict[str, Path]) -> list[str]:
    """``command`` without this machine's paths: each of ``places`` (name -> path, ``run`` the run folder) becomes
    ``{name}``, the interpreter ``python``."""
    pairs = sorted(((str(path), f"{{{name}}}") for name, path in places.items()), key=lambda pair: -len(pair[0]))
    words = []
    for word in command:
        if word == sys.executable:
            word = "python"
        for path, name in pairs:
            word = word.replace(path, name)
        words.append(word)
    return words

"""The installed quick start, timed: a wheel built from this checkout, installed in a fresh venv, run from an empty
folder with an empty home (so ``~/.cache/onpolicy-research/tiny`` starts empty).

    python -m benchmarks.quick_start [--keep FOLDER]

Runs ``onpolicy-tiny``, then each command it prints, and prints each one's wall time and exit status. The venv
borrows this venv's dependencies (torch, transformers, ...; a ``.pth`` line) instead of downloading them, so the
figures are the commands' own, not pip's; the wheel itself is installed with ``--no-deps``. JSON: ``out/bench/
quick_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "regen", "opd", "tools", "launch")


def build_and_install(folder: Path) -> dict:
    """The wheel of a copy of the product's files, installed (not editable) into ``folder/venv``; returns
    ``{"wheel", "bin", "site"}``. A build writes ``build/`` beside its sources, hence the copy."""
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for name in ("configs", *PRODUCT):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(folder / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((folder / "dist").glob("onpolicy_research-*.whl"))
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # the dependencies from this venv: a path a .pth adds is searched, its own .pth files are not read, so this
    # venv's editable install of the checkout stays out
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    return {"wheel": str(wheel), "bin": str(venv / "bin"), "site": str(site)}


def clean_env(home: Path) -> dict[str, str]:
    """A new user's environment: ``home`` as HOME, nothing pointing back at the checkout or its files."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "MINIMIND_TOKENIZER", "ONPOLICY_TINY_DIR", "HYDRA_FULL_ERROR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=None, help="work in this (new) folder and keep it")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="quick-start-"))
    folder.mkdir(parents=True, exist_ok=True)
    installed = build_and_install(folder)
    work, home = folder / "work", folder / "home"
    work.mkdir()
    home.mkdir()
    env = clean_env(home)
    timings = []

    def timed(command: list[str]) -> subprocess.CompletedProcess:
        started = time.perf_counter()
        ran = subprocess.run([str(Path(installed["bin"]) / command[0]), *command[1:]], cwd=work, env=env,
                             capture_output=True, text=True, timeout=900)
        timings.append({"command": shlex.join(command), "wall_s": round(time.perf_counter() - started, 1),
                        "status": ran.returncode})
        print(f"{timings[-1]['wall_s']:6.1f} s  exit {ran.returncode}  {timings[-1]['command']}", flush=True)
        return ran

    tiny = timed(["onpolicy-tiny"])
    for line in tiny.stdout.splitlines():
        if line.startswith("  onpolicy-"):
            timed(shlex.split(line))
    out = REPO_ROOT / "out" / "bench" / "quick_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cores": os.cpu_count(), "python": sys.version.split()[0], "commands": timings}, indent=1))
    print(f"wrote {out}")
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

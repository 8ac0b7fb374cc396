"""The study's fourth full run, committed stage by stage (experiments/study/fourth_run): every finished stage's
outputs are in the repository with the bytes its manifest line records, no line names this machine's paths, and
git keeps exactly those outputs."""

from __future__ import annotations

import json

from experiments.stage_manifest import MANIFEST, Hashes
from tests.helpers.paths import REPO_ROOT

RUN = REPO_ROOT / "experiments" / "study" / "fourth_run"


def lines() -> list[dict]:
    return [json.loads(line) for line in (RUN / MANIFEST).read_text().splitlines() if line.strip()]


def test_every_committed_output_matches_its_manifest_line():
    entries, hashes = lines(), Hashes()
    assert entries, "the run has no finished stage"
    assert len({entry["stage"] for entry in entries}) == len(entries)  # each stage finished once
    for entry in entries:
        if entry["rebuilt"]:
            continue  # rebuilt on each machine and checked against these hashes by the runner
        for rel, sha in entry["outputs"].items():
            path = RUN / rel
            assert path.is_file(), f"{entry['stage']}: {rel} is not committed"
            assert hashes.of(path) == sha, f"{entry['stage']}: {rel} differs from the manifest"


def test_the_manifest_is_free_of_machine_paths_and_records_where_each_stage_ran():
    for entry in lines():
        text = json.dumps(entry["commands"]) + json.dumps(entry["inputs"])
        assert "/work/" not in text and str(REPO_ROOT) not in text, entry["stage"]
        assert all(command[0] == "python" for command in entry["commands"])
        assert entry["machine"]["cpu"] and entry["torch"] and entry["finished"] and entry["wall_s"] > 0
        assert all(not rel.startswith(("/", "..")) for rel in [*entry["inputs"], *entry["outputs"]])


def test_git_keeps_the_manifests_outputs_and_the_report_only():
    kept = {line[2:] for line in (RUN / ".gitignore").read_text().splitlines() if line.startswith("!/")}
    outputs = {rel for entry in lines() if not entry["rebuilt"] for rel in entry["outputs"]}
    assert outputs <= kept and not {rel for entry in lines() if entry["rebuilt"] for rel in entry["outputs"]} & kept
    assert kept - outputs <= {".gitignore", MANIFEST, "README.md", "study_summary.json", "accuracy_vs_horizon.png",
                              "accuracy_vs_steps.png"}

"""Checkpoints: the pair is written staged and renamed resume-last, a full disk loses nothing, a damaged or
mismatched resume file is refused, and the tensor checksum catches silent corruption."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest
import torch

from opd.checkpoints import ResumeRefusedError, load_resume, restore, rng_state, save_checkpoint
from opd.config import OptimConfig
from opd.data_order import DataCursor
from opd.minimind.model import load_native
from opd.minimind.precision import resolve_precision
from opd.optimization import Optimization
from tests.opd_support import TINY_STUDENT, tiny_model

CPU = resolve_precision("cpu", "float32")
SIGNATURE = {"seed": 1, "optim.learning_rate": 0.1}


def trained(seed: int = 0):
    """A tiny model and its optimization after one real step (so the optimizer holds state)."""
    model = tiny_model(seed=seed).train()
    optimization = Optimization(model, OptimConfig(0.1, 0.0, "constant", 0, None, 1.0), 10, CPU)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimization.step()
    return model, optimization


def save(out_dir, model, optimization, step: int):
    return save_checkpoint(out_dir, "agent_opd_64", model, optimization=optimization, step=step,
                           cursor=DataCursor(0, step), rng_states=[rng_state(None)], signature=SIGNATURE)


def test_round_trip_restores_weights_optimizer_and_cursor(tmp_path):
    model, optimization = trained()
    weights, resume = save(tmp_path, model, optimization, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent_opd_64.pth", "agent_opd_64_resume.pth"]
    fresh = tiny_model(seed=5)
    fresh_optimization = Optimization(fresh, OptimConfig(0.1, 0.0, "constant", 0, None, 1.0), 10, CPU)
    step, cursor = restore(resume, SIGNATURE, model=fresh, optimization=fresh_optimization, sampler=None)
    assert (step, cursor) == (3, DataCursor(0, 3))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))
    assert fresh_optimization.optimizer.state_dict()["state"][0]["step"] == 1
    native = load_native(weights, TINY_STUDENT)
    assert all(torch.equal(v, model.state_dict()[k].half().float()) for k, v in native.state_dict().items())


def test_a_silently_corrupted_tensor_is_refused(tmp_path):
    model, optimization = trained()
    _, resume = save(tmp_path, model, optimization, 1)
    state = torch.load(resume, weights_only=True)
    state["model"]["model.norm.weight"][0] += 1.0  # a flipped value the zip container would not notice
    torch.save(state, resume)
    with pytest.raises(ResumeRefusedError, match="is corrupted: its tensors do not match the checksum"):
        load_resume(resume)
    resume.write_bytes(resume.read_bytes()[:1000])  # a torn file
    with pytest.raises(ResumeRefusedError, match="is not a readable torch file"):
        load_resume(resume)


def test_weights_from_another_step_beside_the_resume_file_are_refused(tmp_path):
    model, optimization = trained()
    weights, resume = save(tmp_path, model, optimization, 1)
    shutil.copy(weights, tmp_path / "step1.pth")
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    save(tmp_path, model, optimization, 2)
    shutil.copy(tmp_path / "step1.pth", weights)  # as if a crash came between the two renames
    with pytest.raises(ResumeRefusedError, match="is not the weights file written with"):
        restore(resume, SIGNATURE, model=model, optimization=optimization, sampler=None)


def test_a_full_disk_names_the_file_and_keeps_the_previous_pair(tmp_path, monkeypatch):
    model, optimization = trained()
    save(tmp_path, model, optimization, 1)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    calls, real_fsync = [], os.fsync

    def full_disk(descriptor):
        calls.append(descriptor)
        if len(calls) == 2:  # the resume file's data (the weights file got through)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match=f"no space left on device: {tmp_path / 'agent_opd_64_resume.pth'}"):
        save(tmp_path, model, optimization, 2)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file, nothing replaced


def test_a_real_full_tmpfs(tmp_path):
    """The same on a 256 KiB tmpfs (needs permission to mount; the patched-writer test covers the logic)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        model, optimization = trained()
        with pytest.raises(OSError, match=f"no space left on device: {mount}"):
            save(mount, model, optimization, 1)
        assert list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)

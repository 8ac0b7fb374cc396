"""Checkpoints: the pair is written staged and renamed resume-last, a full disk loses nothing, a damaged or
mismatched resume file is refused, weights a crash left beside it are set aside, and the checksum over every
field catches silent corruption and edits."""

from __future__ import annotations

import errno
import os
import shutil
import struct

import pytest
import torch

from common.minimind.model import load_native
from common.minimind.precision import resolve_precision
from common.resume_signature import ResumeRefusedError
from opd.config import OptimConfig
from opd.training.checkpoints import (
    CheckpointWriteError,
    load_resume,
    restore,
    rng_state,
    save_checkpoint,
)
from opd.training.data_order import DataCursor
from opd.training.optimization import Optimization
from tests.helpers.opd_support import TINY_STUDENT, tiny_model
from tests.helpers.paths import small_tmpfs

CPU = resolve_precision("cpu", "float32")
SIGNATURE = {"seed": 1, "optim.learning_rate": 0.1}


def trained(seed: int = 0):
    """A tiny model and its optimization after one real step (so the optimizer holds state)."""
    model = tiny_model(seed=seed).train()
    optimization = Optimization(model, OptimConfig(0.1, 0.0, "constant", 0, None, 1.0), 10, CPU)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimization.step()
    return model, optimization


def save(out_dir, model, optimization, step: int, ranks: int = 1):
    return save_checkpoint(out_dir, "agent_opd_64", model, optimization=optimization, step=step,
                           cursor=DataCursor(0, step), rng_states=[rng_state(None)] * ranks, signature=SIGNATURE)


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
    with pytest.raises(ResumeRefusedError, match="is damaged or was edited: its content does not match the checksum"):
        load_resume(resume)
    resume.write_bytes(resume.read_bytes()[:1000])  # a torn file
    with pytest.raises(ResumeRefusedError, match="is not a readable torch file") as torn:
        load_resume(resume)
    assert "\n" not in str(torn.value)  # torch's reason in one line, not its advice about weights_only
    resume.write_bytes(bytes(range(256)) * 4)  # not a torch file at all: torch's reason is its unpickler's
    with pytest.raises(ResumeRefusedError) as garbage:
        load_resume(resume)
    assert str(garbage.value) == (f"resume file {resume} is not a readable torch file (Unsupported operand 0); it is "
                                  "damaged: resume from an earlier copy or start a new run")


def test_weights_of_an_unsaved_step_beside_the_resume_file_are_kept_aside_and_written_again(tmp_path, caplog):
    """A kill between the two renames: the next step's weights beside this step's resume file. Rank 0 keeps them
    under another name and writes the resume file's weights in their place; any other rank touches no file."""
    model, optimization = trained()
    weights, resume = save(tmp_path, model, optimization, 1, ranks=2)
    step1 = weights.read_bytes()
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    step2 = weights.parent / "step2.pth"
    shutil.copy(save(tmp_path / "next", model, optimization, 2)[0], step2)
    shutil.copy(step2, weights)  # as if the kill came between renaming the weights and the resume file
    fresh, fresh_optimization = trained(seed=1)
    restore(resume, SIGNATURE, model=fresh, optimization=fresh_optimization, sampler=None, rank=1)
    assert weights.read_bytes() == step2.read_bytes() and len(list(tmp_path.glob("*.unmatched-*"))) == 0
    assert restore(resume, SIGNATURE, model=fresh, optimization=fresh_optimization, sampler=None)[0] == 1
    assert weights.read_bytes() == step1  # byte for byte the file written with the resume file
    (aside,) = tmp_path.glob("agent_opd_64.unmatched-*.pth")
    assert aside.read_bytes() == step2.read_bytes()
    assert f"kept it as {aside}" in caplog.text
    caplog.clear()
    weights.unlink()  # a resume file alone also gets its weights back, with nothing to set aside
    restore(resume, SIGNATURE, model=fresh, optimization=fresh_optimization, sampler=None)
    assert weights.read_bytes() == step1 and len(list(tmp_path.glob("*.unmatched-*"))) == 1 and not caplog.text


EDITS = {  # what restore would take from the file: each edit alone must be refused
    "step": lambda state: state.update(step=0),
    "cursor": lambda state: state["cursor"].update(micro_batch=0),
    "signature": lambda state: state["signature"].update({"optim.learning_rate": 0.2}),
    "an RNG state": lambda state: state["rng"][0]["torch"].__setitem__(0, state["rng"][0]["torch"][0] ^ 1),
    "the optimizer's hyperparameters": lambda state: state["optimization"]["optimizer"]["param_groups"][0].update(lr=1.0),
    "the scheduler's position": lambda state: state["optimization"]["scheduler"].update(last_epoch=0),
    "the weights' sha256": lambda state: state.update(weights_sha256="0" * 64),
}


@pytest.mark.parametrize("field", list(EDITS))
def test_an_edited_field_is_refused(tmp_path, field):
    model, optimization = trained()
    _, resume = save(tmp_path, model, optimization, 3)
    state = torch.load(resume, weights_only=True)
    EDITS[field](state)
    torch.save(state, resume)
    with pytest.raises(ResumeRefusedError, match=f"resume file {resume} is damaged or was edited"):
        load_resume(resume)


def test_a_flipped_byte_in_the_pickled_step_is_refused(tmp_path):
    """The zip container keeps a CRC per entry but torch never checks it: a flipped byte loads as another step."""
    model, optimization = trained()
    _, resume = save_checkpoint(tmp_path, "agent_opd_64", model, optimization=optimization, step=123456789,
                                cursor=DataCursor(0, 1), rng_states=[rng_state(None)], signature=SIGNATURE)
    raw, pickled = resume.read_bytes(), b"J" + struct.pack("<i", 123456789)  # BININT 123456789
    assert raw.count(pickled) == 1
    resume.write_bytes(raw.replace(pickled, b"J" + struct.pack("<i", 123456789 ^ 1 << 20)))
    assert torch.load(resume, weights_only=True)["step"] == 123456789 ^ 1 << 20  # torch reads it as it now is
    with pytest.raises(ResumeRefusedError, match="is damaged or was edited"):
        load_resume(resume)


def test_a_resume_file_of_the_older_format_is_refused_as_such(tmp_path):
    model, optimization = trained()
    _, resume = save(tmp_path, model, optimization, 3)
    state = torch.load(resume, weights_only=True)
    state["format"] = "opd-resume/3"  # its checksum covered only the tensors
    state["tensors_sha256"] = state.pop("content_sha256")
    torch.save(state, resume)
    with pytest.raises(ResumeRefusedError, match="is of format 'opd-resume/3'; this version resumes 'opd-resume/4' "
                                                 "files only") as refused:
        load_resume(resume)
    assert "start a new run (the inference weights beside it" in refused.value.hint


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
    resume = tmp_path / "agent_opd_64_resume.pth"
    with pytest.raises(CheckpointWriteError, match=f"cannot save checkpoint {resume}: No space left on device") as full:
        save(tmp_path, model, optimization, 2)
    assert full.value.hint == (f"{resume} and the weights beside it are the last checkpoint, intact: make room and "
                               f"continue with resume={resume}")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file, nothing replaced


def test_a_real_full_tmpfs_keeps_the_previous_pair(tmp_path):
    """On a tmpfs that holds one checkpoint pair and a half: the second save's weights fit, its resume file does
    not, and torch's zip writer reports that as a RuntimeError ('unexpected pos') over the OSError."""
    model, optimization = trained()
    pair = sum(path.stat().st_size for path in save(tmp_path / "sizes", model, optimization, 1))
    with small_tmpfs(tmp_path / "small", pair * 3 // 2) as mount:
        save(mount, model, optimization, 1)
        before = {p.name: p.read_bytes() for p in mount.iterdir()}
        resume = mount / "agent_opd_64_resume.pth"
        with pytest.raises(CheckpointWriteError, match=f"cannot save checkpoint {resume}: No space left on device"):
            save(mount, model, optimization, 2)
        assert {p.name: p.read_bytes() for p in mount.iterdir()} == before
        assert load_resume(resume)["step"] == 1

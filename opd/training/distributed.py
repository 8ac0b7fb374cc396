"""Data parallelism over the processes ``torchrun`` starts; a plain ``python opd/train.py`` has no process group.

``start`` joins the group (NCCL on CUDA, each process on its local rank's GPU; gloo on CPU). Every global micro-batch
is split into equal contiguous shares in rank order, so the ranks together hold what one process would.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.user_errors import UserError


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """A CUDA device is this process's own GPU (its local rank); a CPU stays the CPU."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" and self.distributed else device

    def share(self, indices: list[int]) -> list[int]:
        """This rank's contiguous share of a global micro-batch (shares differ by one at most, in rank order)."""
        size, extra = divmod(len(indices), self.world_size)
        start = self.rank * size + min(self.rank, extra)
        return indices[start:start + size + (self.rank < extra)]

    def seed(self, seed: int) -> int:
        """A sampling seed for this rank derived from the run's seed (rank 0 keeps the run's seed)."""
        if self.rank == 0:
            return seed
        return int.from_bytes(hashlib.sha256(f"{seed}:rank{self.rank}".encode()).digest()[:8], "big") >> 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over all ranks (the values themselves on one process)."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def largest(self, value: int) -> int:
        """The largest of every rank's ``value`` (the value itself on one process)."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self._collective_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def gather(self, item) -> list:
        """Every rank's ``item``, in rank order, on every rank."""
        if not self.distributed:
            return [item]
        items = [None] * self.world_size
        dist.all_gather_object(items, item)
        return items

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @property
    def _collective_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def start(device: torch.device) -> Ranks:
    """Join the torchrun process group when there is one (NCCL on CUDA, gloo on CPU); else one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Ranks()
    ranks = Ranks(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        if ranks.local_rank >= torch.cuda.device_count():
            raise UserError(f"local rank {ranks.local_rank} has no GPU ({torch.cuda.device_count()} visible): start "
                            "at most one process per GPU (torchrun --nproc_per_node)")
        torch.cuda.set_device(ranks.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ranks


def stop(ranks: Ranks) -> None:
    """Leave the process group (a no-op on one process). Delete the DDP wrapper first: its reducer frees the group
    holding the GIL, which gloo's worker may need, and the process hangs in ``~ProcessGroupGloo``."""
    if ranks.distributed and dist.is_initialized():
        dist.destroy_process_group()


def check_batch_divides(batch_size: int, ranks: Ranks) -> None:
    """``batch_size`` is the global batch: it must split evenly over the processes."""
    if batch_size % ranks.world_size:
        raise UserError(f"batch_size={batch_size} does not divide by the {ranks.world_size} processes: batch_size is "
                        f"the global batch; use a multiple of {ranks.world_size}")


def data_parallel(forward: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """``forward`` (a ``TargetLogits``) wrapped in ``DistributedDataParallel`` under torchrun; as is on one process."""
    if not ranks.distributed:
        return forward
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(forward, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(forward: torch.nn.Module) -> torch.nn.Module:
    """The trained model inside a (possibly DDP-wrapped) ``TargetLogits``."""
    return getattr(forward, "module", forward).model


def gradient_sync(forward: torch.nn.Module, *, last: bool):
    """Gradients are summed over ranks only on a window's last micro-batch (``no_sync`` before it)."""
    return forward.no_sync() if hasattr(forward, "no_sync") and not last else nullcontext()


def idle_loss(forward: torch.nn.Module, pad_token_id: int, device: torch.device) -> torch.Tensor:
    """A zero loss through the whole model for a rank with an empty share, so every rank runs the same collectives."""
    ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
    logits, _ = forward(ids, torch.ones_like(ids), torch.zeros((1, 0), dtype=torch.bool, device=device))
    return logits.sum() * 0.0

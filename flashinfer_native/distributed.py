"""Multi-rank sessions: what a recording says about torch.distributed, and per-rank replay.

Recording: ``record_extras()`` is asked at every dumped call (level 10) and, once
``torch.distributed`` is initialised, adds ``"distributed": {"rank", "world_size",
"backend"}`` to the call's metadata records.

Replay: ``flashinfer replay --dir D --per-rank`` under ``torchrun`` (never a launcher of
ours) replays on each rank the calls recorded by the process of that rank, in call
order, then gathers every rank's outcome so rank 0 prints one merged summary.
"""

import os
import sys

__all__ = ["record_extras", "RankSession", "recorded_rank"]


def record_extras():
    """Extra metadata for a dumped call: the torch.distributed identity of this process.

    Returns
    -------
    dict or None
        ``{"distributed": {"rank", "world_size", "backend"}}`` while a default process
        group exists, else None. torch.distributed is never imported for this.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return {
        "distributed": {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
        }
    }


def recorded_rank(records):
    """(rank, world_size) recorded in a dump's metadata records, or (None, None)."""
    if not records:
        return None, None
    info = records[-1].get("distributed")
    if not isinstance(info, dict):
        return None, None
    return info.get("rank"), info.get("world_size")


class RankSession:
    """This process's place in a ``torchrun`` replay: rank, world size, device, group.

    Parameters
    ----------
    device : torch.device or None
        The ``--device`` asked for: None picks ``cuda:LOCAL_RANK`` when CUDA is
        available, else the CPU; a bare ``cuda`` becomes ``cuda:LOCAL_RANK``.

    Raises
    ------
    RuntimeError
        When the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK) are missing.
    """

    def __init__(self, device):
        import torch
        import torch.distributed as dist

        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR") if v not in os.environ]
        if missing and not dist.is_initialized():
            raise RuntimeError(
                f"--per-rank needs a launcher such as torchrun (missing {', '.join(missing)}): "
                "torchrun --nproc_per_node N -m flashinfer_native replay --dir D --per-rank"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.device = device
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def mine(self, entries):
        """Split dump entries into this rank's and the problems found on the way.

        Returns
        -------
        (list, list of str)
            The entries recorded by this rank, in the given order; and one message per
            dump recorded without a rank or with another world size (rank 0 reports
            them, each rank skips them).
        """
        selected, problems = [], []
        for path, records in entries:
            rank, world_size = recorded_rank(records)
            name = os.path.basename(path)
            if rank is None:
                problems.append(f"{name}: recorded without torch.distributed (no rank)")
            elif world_size != self.world_size:
                problems.append(
                    f"{name}: recorded with world_size {world_size}, replayed with "
                    f"{self.world_size}"
                )
            elif rank == self.rank:
                selected.append((path, records))
        return selected, problems

    def gather(self, outcome):
        """Every rank's ``outcome`` (any picklable object), in rank order, on every rank."""
        import torch.distributed as dist

        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, outcome)
        return gathered

    def close(self):
        """Destroy the process group this session created."""
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

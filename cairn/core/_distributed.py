"""Which process of a distributed run this is (mirrors ``det.core.DistributedContext``).

Ranks come from the environment the agent (or ``torchrun``) sets: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``. Rank 0 is the chief: only the chief reports metrics and
checkpoints. Collective helpers use ``torch.distributed`` when a process group is initialised
(cairn.core never imports torch itself); with one process they are trivial.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from events import settings


def _env_int(name: str, default: int, env: dict[str, str]) -> int:
    raw = env.get(name, "")
    return int(raw) if raw.strip() else default


def _num_nodes(env: dict[str, str], default: int) -> int:
    """``CAIRN_NUM_NODES`` (the agents of a gang), else ``default``."""
    value = settings.NUM_NODES.get(env)
    return default if value is None else value


class DistributedContext:
    """Rank and size of this process among the processes of one trial run.

    Args:
        rank: global rank (0 is the chief).
        size: number of processes in the run.
        local_rank: rank among the processes on this machine.
        local_size: processes on this machine (defaults to ``size``).
        cross_rank: index of this machine (defaults to 0).
        cross_size: number of machines (defaults to 1).
        chief_ip: address of the chief's machine, if known.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int | None = None,
        cross_rank: int | None = None,
        cross_size: int | None = None,
        chief_ip: str | None = None,
    ) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a world of size {size}")
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = size if local_size is None else local_size
        self.cross_rank = 0 if cross_rank is None else cross_rank
        self.cross_size = 1 if cross_size is None else cross_size
        self.chief_ip = chief_ip

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DistributedContext:
        """Reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (1 process if unset)."""
        env = dict(os.environ if environ is None else environ)
        size = _env_int("WORLD_SIZE", 1, env)
        rank = _env_int("RANK", 0, env)
        local_size = _env_int("LOCAL_WORLD_SIZE", size, env)
        return cls(
            rank=rank,
            size=size,
            local_rank=_env_int("LOCAL_RANK", rank, env),
            local_size=local_size,
            cross_rank=_env_int("GROUP_RANK", rank // max(local_size, 1), env),
            cross_size=_env_int(
                "GROUP_WORLD_SIZE",
                _num_nodes(env, max(size // max(local_size, 1), 1)),
                env,
            ),
            chief_ip=env.get("MASTER_ADDR") or None,
        )

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """The context of a process launched by ``torchrun`` (``cairn.launch.torch_distributed``)
        or by a multi-slot cairn agent: ranks from ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/
        ``LOCAL_WORLD_SIZE``, the agent's index from ``GROUP_RANK``, the chief's address from
        ``MASTER_ADDR``. The process group is the script's to initialise."""
        ctx = cls.from_env()
        if chief_ip is not None:
            ctx.chief_ip = chief_ip
        return ctx

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        """The context of a process DeepSpeed's launcher started (``cairn.launch.deepspeed``):
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``
        (the ``torchrun`` names where DeepSpeed's are unset)."""
        env = dict(os.environ)
        size = _env_int("WORLD_SIZE", 1, env)
        rank = _env_int("RANK", 0, env)
        local_size = _env_int("LOCAL_SIZE", _env_int("LOCAL_WORLD_SIZE", size, env), env)
        return cls(
            rank=rank,
            size=size,
            local_rank=_env_int("LOCAL_RANK", rank, env),
            local_size=local_size,
            cross_rank=_env_int("CROSS_RANK", rank // max(local_size, 1), env),
            cross_size=_env_int("CROSS_SIZE", max(size // max(local_size, 1), 1), env),
            chief_ip=chief_ip or env.get("MASTER_ADDR") or None,
        )

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: str | None = None) -> DistributedContext:
        """The context of a Horovod worker (``cairn.launch.horovod``), read from the
        initialised ``hvd`` module."""
        return cls(
            rank=int(hvd.rank()),
            size=int(hvd.size()),
            local_rank=int(hvd.local_rank()),
            local_size=int(hvd.local_size()),
            cross_rank=int(hvd.cross_rank()),
            cross_size=int(hvd.cross_size()),
            chief_ip=chief_ip,
        )

    def close(self) -> None:
        """Determined's release of its communication sockets; cairn holds none (collectives go
        through ``torch.distributed``), so this does nothing."""

    @property
    def is_chief(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    def get_rank(self) -> int:
        """Global rank."""
        return self.rank

    def get_size(self) -> int:
        """Number of processes."""
        return self.size

    def get_local_rank(self) -> int:
        """Rank on this machine."""
        return self.local_rank

    def get_local_size(self) -> int:
        """Processes on this machine."""
        return self.local_size

    def get_cross_rank(self) -> int:
        """Index of this machine."""
        return self.cross_rank

    def get_cross_size(self) -> int:
        """Number of machines."""
        return self.cross_size

    def get_num_agents(self) -> int:
        """Number of machines (agents) in the run."""
        return self.cross_size

    def _torch(self) -> Any:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
        if self.size == 1:
            return None
        raise RuntimeError(
            "collectives across processes need torch.distributed.init_process_group() first"
        )

    def broadcast(self, obj: Any) -> Any:
        """Returns the chief's ``obj`` on every rank."""
        dist = self._torch()
        if dist is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather(self, obj: Any) -> list[Any]:
        """Returns every rank's ``obj``, in rank order, on every rank."""
        dist = self._torch()
        if dist is None:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Returns every rank's ``obj`` on the chief and ``None`` elsewhere."""
        dist = self._torch()
        if dist is None:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.is_chief else None
        dist.gather_object(obj, out, dst=0)
        return out


class DummyDistributedContext(DistributedContext):
    """The context of a run with one process: rank 0 of 1, on one machine."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)

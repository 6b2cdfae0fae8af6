"""Slot discovery: NVIDIA GPUs through ``nvidia-smi``, else CPU slots.

A GPU slot's id is the GPU's UUID (stable across reboots and re-registrations). CPU slots
(``--artificial-slots N``, or one CPU slot on a machine without GPUs) get UUIDs derived from the
agent id, so the same agent always offers the same slot ids.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

_CPU_NAMESPACE = uuid.UUID("5d6c0b1e-8a43-4c55-9a0e-6f2a63c4b2d1")


@dataclass(frozen=True)
class Slot:
    """One schedulable device.

    Attributes:
        slot_id: unique on this agent (a GPU UUID or a derived CPU slot UUID).
        device: ``"cuda"`` or ``"cpu"``.
        name: a human name (GPU model, or ``cpu-<n>``).
        index: the GPU's index for ``nvidia-smi``/CUDA, ``None`` for CPU slots.
    """

    slot_id: str
    device: str
    name: str
    index: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The slot as the register call sends it."""
        return {"slot_id": self.slot_id, "device": self.device, "name": self.name}


def cpu_slots(agent_id: str, count: int) -> list[Slot]:
    """``count`` CPU slots whose ids depend only on ``agent_id`` and their position."""
    if count < 1:
        raise ValueError(f"an agent needs at least one slot, got {count}")
    return [
        Slot(str(uuid.uuid5(_CPU_NAMESPACE, f"{agent_id}/cpu/{i}")), "cpu", f"cpu-{i}")
        for i in range(count)
    ]


def parse_nvidia_smi(output: str) -> list[Slot]:
    """Parses ``nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader`` output."""
    slots: list[Slot] = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1]:
            continue
        slots.append(Slot(parts[1], "cuda", parts[2], int(parts[0])))
    return slots


def gpu_slots(nvidia_smi: str = "nvidia-smi", timeout: float = 20.0) -> list[Slot]:
    """The machine's NVIDIA GPUs, or ``[]`` when ``nvidia-smi`` is missing or fails."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return []
    try:
        result = subprocess.run(
            [exe, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    return parse_nvidia_smi(result.stdout)


def discover_slots(agent_id: str, artificial_slots: int | None = None) -> list[Slot]:
    """The slots this agent offers.

    Args:
        agent_id: the agent's id (seeds the CPU slot ids).
        artificial_slots: offer this many CPU slots instead of looking for GPUs.

    Returns:
        ``artificial_slots`` CPU slots when given, else the GPUs, else one CPU slot.
    """
    if artificial_slots is not None:
        return cpu_slots(agent_id, artificial_slots)
    return gpu_slots() or cpu_slots(agent_id, 1)

"""System-metrics profiling (mirrors ``det.core.ProfilerContext``).

While :meth:`ProfilerContext.on` is in effect a daemon thread samples the machine every
``sampling_interval`` seconds (CPU %, memory, and per GPU utilisation and memory when
``nvidia-smi`` is on the ``PATH``) and every ``samples_per_report`` samples reports their means
as the metrics group ``system`` (``steps_completed`` counts the reports). It is off by default
and runs on the chief only.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cairn.core._distributed import DistributedContext
from cairn.core._train import TrainContext

log = logging.getLogger("cairn.core")

GROUP = "system"
_GIB = 1024**3
_NVIDIA_QUERY = (
    "--query-gpu=uuid,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
)

Sampler = Callable[[], dict[str, float]]


def sample_host() -> dict[str, float]:
    """CPU utilisation (% since the previous call) and memory use of this machine."""
    import psutil  # a dependency of cairn; imported here to keep ``import cairn.core`` light

    memory = psutil.virtual_memory()
    return {
        "cpu_util_pct": float(psutil.cpu_percent(interval=None)),
        "memory_used_gb": (memory.total - memory.available) / _GIB,
        "memory_util_pct": float(memory.percent),
    }


def sample_gpus(gpu_uuids: Sequence[str] = ()) -> dict[str, float]:
    """Utilisation and memory of each GPU ``nvidia-smi`` reports (only ``gpu_uuids`` when
    given), as ``gpu<i>_util_pct`` / ``gpu<i>_memory_used_gb`` plus their means; ``{}`` when
    there is no ``nvidia-smi`` or it fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return {}
    try:
        done = subprocess.run(
            [binary, *_NVIDIA_QUERY], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("cairn: nvidia-smi failed: %s", exc)
        return {}
    out: dict[str, float] = {}
    utils: list[float] = []
    used: list[float] = []
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or (gpu_uuids and fields[0] not in gpu_uuids):
            continue
        try:
            util, mem_used = float(fields[1]), float(fields[2]) / 1024
        except ValueError:  # "[N/A]" on some devices
            continue
        index = len(utils)
        out[f"gpu{index}_util_pct"] = util
        out[f"gpu{index}_memory_used_gb"] = mem_used
        utils.append(util)
        used.append(mem_used)
    if utils:
        out["gpu_util_pct"] = sum(utils) / len(utils)
        out["gpu_memory_used_gb"] = sum(used) / len(used)
    return out


class ProfilerContext:
    """Turns system-metrics sampling on and off (see the module docstring).

    Args:
        train: where the ``system`` group is reported.
        distributed: this process's rank (only the chief samples).
        gpu_uuids: the GPUs of this trial (all of the machine's when empty).
        samplers: the sample functions (the host and its GPUs by default).
    """

    def __init__(
        self,
        train: TrainContext,
        distributed: DistributedContext,
        gpu_uuids: Sequence[str] = (),
        samplers: Sequence[Sampler] | None = None,
    ) -> None:
        self._train = train
        self._distributed = distributed
        gpus = list(gpu_uuids)
        self._samplers = list(samplers or (sample_host, lambda: sample_gpus(gpus)))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reports = 0

    @property
    def enabled(self) -> bool:
        """Whether sampling is on."""
        return self._thread is not None

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Starts sampling (no-op when already on, or on a non-chief rank).

        Args:
            sampling_interval: seconds between two samples.
            samples_per_report: samples averaged into one report.

        Raises:
            ValueError: a non-positive interval or count.
        """
        if sampling_interval <= 0 or samples_per_report < 1:
            raise ValueError("sampling_interval must be > 0 and samples_per_report >= 1")
        if not self._distributed.is_chief:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run,
                args=(float(sampling_interval), int(samples_per_report), self._stop),
                name="cairn-profiler",
                daemon=True,
            )
            self._thread.start()

    def off(self) -> None:
        """Stops sampling; samples not yet reported are reported now."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(30.0)

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for sampler in self._samplers:
            try:
                out.update(sampler())
            except Exception as exc:  # a broken sampler must not end training
                log.warning("cairn: profiler sample failed: %s", exc)
        return out

    def _report(self, samples: list[dict[str, float]]) -> None:
        sums: dict[str, list[float]] = {}
        for sample in samples:
            for key, value in sample.items():
                sums.setdefault(key, []).append(value)
        if not sums:
            return
        self._reports += 1
        means: dict[str, Any] = {k: sum(v) / len(v) for k, v in sums.items()}
        self._train.report_metrics(GROUP, self._reports, means)

    def _run(self, interval: float, per_report: int, stop: threading.Event) -> None:
        samples: list[dict[str, float]] = []
        self._sample()  # primes the CPU counter: its first reading covers no interval
        while not stop.wait(interval):
            samples.append(self._sample())
            if len(samples) >= per_report:
                self._report(samples)
                samples = []
        self._report(samples)

    def close(self) -> None:
        """Stops sampling (called when the context closes)."""
        self.off()

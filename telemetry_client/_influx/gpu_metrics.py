"""GPU metrics: NVML per device (keyed by UUID) and torch.cuda allocator statistics.

No GPU, no NVML library or no torch means no GPU points, never an error.
"""

from __future__ import annotations

import sys
from typing import Any

from telemetry_client._engine.self_log import logger

GpuPoint = tuple[str, dict[str, str], dict[str, float]]


class NvmlReader:
    """Reads every device through NVML (nvidia-ml-py); silent and empty where NVML is absent."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[tuple[int, str, str, Any]] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                self._handles.append((index, uuid, _text(pynvml.nvmlDeviceGetName(handle)), handle))
            self._nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError (no driver), ...
            logger.debug("NVML unavailable, no GPU metrics: %s", exc)

    def read(self) -> list[GpuPoint]:
        pynvml = self._nvml
        if pynvml is None:
            return []
        points = []
        for index, uuid, name, handle in self._handles:
            fields: dict[str, float] = {}
            for field, read in (
                ("memory_used_bytes", lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used),
                ("memory_total_bytes", lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).total),
                ("utilization_percent", lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                ("temperature_c", lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                ("power_w", lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ):
                try:
                    fields[field] = float(read(handle))
                except Exception:  # a device may not support a reading
                    continue
            if fields:
                points.append(("gpu", {"gpu_uuid": uuid, "gpu_index": str(index), "gpu_name": name}, fields))
        return points


def torch_memory_points() -> list[GpuPoint]:
    """torch.cuda allocator statistics, only when torch is already imported and CUDA initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return []
        points = []
        for index in range(cuda.device_count()):
            stats = cuda.memory_stats(index)
            uuid = str(getattr(cuda.get_device_properties(index), "uuid", f"cuda:{index}"))
            points.append(
                (
                    "gpu_memory",
                    {"gpu_uuid": uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", "gpu_index": str(index)},
                    {
                        "allocated_bytes": float(stats.get("allocated_bytes.all.current", 0)),
                        "reserved_bytes": float(stats.get("reserved_bytes.all.current", 0)),
                        "max_allocated_bytes": float(stats.get("allocated_bytes.all.peak", 0)),
                        "segments": float(stats.get("segment.all.current", 0)),
                    },
                )
            )
        return points
    except Exception as exc:
        logger.debug("torch.cuda statistics unavailable: %s", exc)
        return []


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class GpuSampler:
    """Samples every GPU at most once per `interval` seconds."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last = -float("inf")
        self._nvml = NvmlReader()

    def due(self, now: float) -> bool:
        return now - self._last >= self.interval

    def sample(self, now: float) -> list[GpuPoint]:
        self._last = now
        return self._nvml.read() + torch_memory_points()

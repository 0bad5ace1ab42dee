"""System and GPU: host CPU and memory, GPU memory, utilisation, temperature and power."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import (
    influx_select,
)
from grafana.builder.targets import Json, influx_target
from grafana.builder.variables import node_variables


def build() -> Json:
    ly = Layout()
    ly.row("Host")
    ly.timeseries(
        "CPU",
        "CPU use of each node's host.",
        influx_target("A", influx_select('mean("cpu_percent")', "system"), "$tag_uid"),
        unit="percent",
    )
    ly.timeseries(
        "Memory",
        "Memory in use as a share of the memory available (the cgroup limit if lower).",
        influx_target("A", influx_select('mean("memory_percent")', "system"), "$tag_uid"),
        unit="percent",
    )
    ly.timeseries(
        "Process resident memory",
        "Resident memory of the process that logs.",
        influx_target("A", influx_select('mean("process_rss_bytes")', "system"), "$tag_uid"),
        unit="bytes",
    )
    ly.timeseries(
        "Host memory used",
        "Bytes in use and available on each host.",
        influx_target("A", influx_select('mean("memory_used_bytes")', "system"), "used $tag_uid"),
        influx_target("B", influx_select('mean("memory_total_bytes")', "system"), "total $tag_uid"),
        unit="bytes",
    )
    ly.timeseries(
        "Disk",
        "Disk in use on the filesystem of each node's working directory (checkpoints, caches).",
        influx_target("A", influx_select('max("disk_percent")', "system"), "$tag_uid"),
        unit="percent",
        width=24,
    )
    ly.row("GPU")
    by_gpu = ("uid", "gpu_index")
    ly.timeseries(
        "GPU memory allocated",
        "torch.cuda memory held by tensors, per device.",
        influx_target(
            "A", influx_select('mean("allocated_bytes")', "gpu_memory", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="bytes",
    )
    ly.timeseries(
        "GPU memory cached (reserved)",
        "torch.cuda memory reserved by the caching allocator, per device.",
        influx_target(
            "A", influx_select('mean("reserved_bytes")', "gpu_memory", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="bytes",
    )
    ly.timeseries(
        "GPU utilisation",
        "NVML utilisation per device.",
        influx_target(
            "A", influx_select('mean("utilization_percent")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="percent",
    )
    ly.timeseries(
        "GPU memory used (all processes)",
        "Device memory in use as a share of the device's memory.",
        influx_target(
            "A",
            influx_select(
                'mean("memory_used_bytes") / mean("memory_total_bytes") * 100',
                "gpu",
                by=by_gpu,
            ),
            "$tag_uid gpu$tag_gpu_index",
        ),
        unit="percent",
    )
    ly.timeseries(
        "GPU temperature",
        "Device temperature.",
        influx_target("A", influx_select('max("temperature_c")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"),
        unit="celsius",
    )
    ly.timeseries(
        "GPU power",
        "Power draw per device.",
        influx_target("A", influx_select('mean("power_w")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"),
        unit="watt",
    )
    return dashboard(
        "telemetry-system",
        "System and GPU",
        "CPU, memory, GPU memory allocated and cached, and GPU utilisation per node.",
        ["system"],
        node_variables(None),
        ly,
    )

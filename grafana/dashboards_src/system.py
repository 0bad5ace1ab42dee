"""System and GPU: host CPU and memory, GPU memory, utilisation, temperature and power."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import fleet_and_nodes, spread_note, worst_nodes
from grafana.builder.targets import Json
from grafana.builder.variables import node_variables

FLEET = "With every node selected: median, p90 and maximum across the nodes; a few chosen in UID: one line each."
GPU = {"by": (), "node_by": ("uid", "gpu_index"), "node_legend": "{uid} gpu{gpu_index}"}


def build() -> Json:
    long_range = spread_note("an hour", "each node's", " across its devices")
    fleet_gpu = (
        f"With every node selected: median, p90 and maximum across the devices{long_range}; "
        "with a few nodes chosen in UID: one line per device."
    )
    ly = Layout()
    ly.row("Host")
    ly.timeseries(
        "CPU", f"CPU use of the nodes' hosts. {FLEET}", *fleet_and_nodes("cpu_percent", "system"), unit="percent"
    )
    ly.timeseries(
        "Memory",
        f"Memory in use as a share of the memory available (the cgroup limit if lower). {FLEET}",
        *fleet_and_nodes("memory_percent", "system"),
        unit="percent",
    )
    ly.timeseries(
        "Process resident memory",
        f"Resident memory of the process that logs. {FLEET}",
        *fleet_and_nodes("process_rss_bytes", "system"),
        unit="bytes",
    )
    ly.timeseries(
        "Host memory used",
        f"Bytes in use and available on the hosts. {FLEET}",
        *fleet_and_nodes("memory_used_bytes", "system", prefix="used ", refs=("A", "B")),
        *fleet_and_nodes("memory_total_bytes", "system", prefix="total ", refs=("C", "D")),
        unit="bytes",
    )
    ly.timeseries(
        "Disk",
        f"Disk in use on the filesystem of the nodes' working directory (checkpoints, caches). {FLEET}",
        *fleet_and_nodes("disk_percent", "system", node_agg="max"),
        unit="percent",
    )
    ly.table(
        "Highest memory use",
        "The five nodes with the highest mean memory use over the time range.",
        worst_nodes("memory_percent", "system"),
    )
    ly.table(
        "Fullest disks",
        "The five nodes with the fullest working-directory filesystem in the time range.",
        worst_nodes("disk_percent", "system", agg="max"),
    )
    ly.row("GPU")
    ly.timeseries(
        "GPU memory allocated",
        f"torch.cuda memory held by tensors. {fleet_gpu}",
        *fleet_and_nodes("allocated_bytes", "gpu_memory", **GPU),
        unit="bytes",
    )
    ly.timeseries(
        "GPU memory cached (reserved)",
        f"torch.cuda memory reserved by the caching allocator. {fleet_gpu}",
        *fleet_and_nodes("reserved_bytes", "gpu_memory", **GPU),
        unit="bytes",
    )
    ly.timeseries(
        "GPU utilisation",
        f"NVML utilisation. {fleet_gpu}",
        *fleet_and_nodes("utilization_percent", "gpu", **GPU),
        unit="percent",
    )
    ly.timeseries(
        "GPU memory used (all processes)",
        f"Device memory in use by every process. {fleet_gpu}",
        *fleet_and_nodes("memory_used_bytes", "gpu", **GPU),
        unit="bytes",
    )
    ly.timeseries(
        "GPU temperature",
        f"Device temperature. {fleet_gpu}",
        *fleet_and_nodes("temperature_c", "gpu", node_agg="max", **GPU),
        unit="celsius",
    )
    ly.timeseries("GPU power", f"Power draw. {fleet_gpu}", *fleet_and_nodes("power_w", "gpu", **GPU), unit="watt")
    ly.table(
        "Hottest GPUs",
        "The five nodes whose devices ran hottest (highest temperature) in the time range.",
        worst_nodes("temperature_c", "gpu", agg="max"),
    )
    ly.table(
        "Least utilised GPUs",
        "The five nodes whose devices were least busy (mean utilisation) over the time range.",
        worst_nodes("utilization_percent", "gpu", lowest_is_worst=True),
    )
    return dashboard(
        "telemetry-system",
        "System and GPU",
        "CPU, memory, GPU memory allocated and cached, and GPU utilisation, across the fleet or per node.",
        ["system"],
        node_variables(None),
        ly,
    )

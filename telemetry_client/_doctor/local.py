"""The doctor's checks of this machine: host metrics, GPU metrics and W&B.

Each says whether the node will collect something, and why not when it will not,
using the same libraries and the same resolution rules as the collectors.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import netrc
import os
from pathlib import Path

from telemetry_client._doctor.report import Check, describe_secret, ok, warn
from telemetry_client._doctor.server import Endpoint
from telemetry_client.experiment_tracking import resolve_mode, wandb_directory

WANDB_HOST = "api.wandb.ai"
WANDB_DEFAULT_BASE_URL = "https://api.wandb.ai"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_metrics() -> Check:
    """psutil reads CPU, memory, disk and network for `with_system_metrics=True`."""
    from telemetry_client._influx.system_metrics import SystemSampler

    try:
        fields = SystemSampler(0).sample()
    except Exception as exc:  # psutil can fail in odd sandboxes; the node would log it and go on
        return warn(
            "Host metrics",
            f"psutil {_version('psutil')} could not read this machine ({type(exc).__name__}: {exc}).",
            "Run the node where /proc and /sys are readable, or log with with_system_metrics=False.",
        )
    return ok(
        "Host metrics",
        f"psutil {_version('psutil')} reads {len(fields)} system fields ({', '.join(sorted(fields))}).",
        fields=sorted(fields),
    )


def nvidia_device_present(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA driver exposes /dev/nvidia0, /dev/nvidia1, ... (containers too, with the NVIDIA runtime)."""
    return any(p.name[len("nvidia") :].isdigit() for p in dev.glob("nvidia*"))


def gpu_metrics() -> Check:
    """NVML per device, and torch.cuda allocator statistics; either may be missing, and why."""
    name = "GPU metrics"
    nvml_version = _version("nvidia-ml-py")
    torch_present = importlib.util.find_spec("torch") is not None
    torch_note = (
        "torch is installed: its allocator statistics come once the training process has initialised CUDA"
        if torch_present
        else "torch is not installed, so no allocator statistics"
    )
    if nvml_version is None and not nvidia_device_present():
        return ok(
            name,
            f"no NVIDIA GPU on this machine (no /dev/nvidia*), so no GPU metrics to collect; {torch_note}.",
            nvml=False,
            torch=torch_present,
        )
    if nvml_version is None:
        return warn(
            name,
            "this machine has NVIDIA GPUs but nvidia-ml-py is not installed, so no per-GPU utilisation, memory, "
            f"temperature or power; {torch_note}.",
            "Install it with pip install 'telemetry-stack[nvml]'.",
            nvml=False,
            torch=torch_present,
        )
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        return warn(
            name,
            f"nvidia-ml-py {nvml_version} is installed but NVML does not start ({exc}): no NVIDIA driver "
            f"is reachable, so no per-GPU metrics; {torch_note}.",
            "Install the NVIDIA driver, or in a container run with the NVIDIA runtime (--gpus all).",
            nvml=False,
            torch=torch_present,
        )
    driver_text = driver.decode() if isinstance(driver, bytes) else driver
    if count == 0:
        return warn(
            name,
            f"NVML (driver {driver_text}) sees no GPU; {torch_note}.",
            "Make the GPUs visible to this process (CUDA_VISIBLE_DEVICES, container --gpus).",
            nvml=True,
            devices=0,
            torch=torch_present,
        )
    return ok(
        name,
        f"NVML (driver {driver_text}) sees {count} GPU(s), collected with with_gpu_metrics=True; {torch_note}.",
        nvml=True,
        devices=count,
        torch=torch_present,
    )


def _wandb_key_source() -> tuple[str, str]:
    """Where W&B would find an API key: WANDB_API_KEY, else ~/.netrc (or NETRC). Never the key itself."""
    key = os.environ.get("WANDB_API_KEY")
    if key:
        return "WANDB_API_KEY", describe_secret(key)
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(WANDB_HOST)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry and entry[2]:
        return str(path), describe_secret(entry[2])
    return "", "not set"


def wandb_check() -> Check:
    """W&B mode (online, offline, disabled), whether it can log in, and where the run-id files are."""
    name = "W&B"
    try:
        mode = resolve_mode()
    except ValueError as exc:
        return warn(name, f"WANDB_MODE is not understood ({exc}).", "Set WANDB_MODE to online, offline or disabled.")
    version = _version("wandb")
    directory = wandb_directory()
    run_files = sorted(p.name for p in directory.glob("wandb_run_id_*.txt")) if directory.is_dir() else []
    where = f"run-id files in {directory}: {', '.join(run_files) if run_files else 'none yet'}"
    details = {"mode": mode, "wandb": version, "directory": str(directory), "run_id_files": run_files}
    if version is None:
        return warn(
            name,
            f"wandb is not installed; initialize_wandb() would raise WandbNotInstalledError (mode would be {mode}).",
            "Install it with pip install 'telemetry-stack[wandb]', or do not call initialize_wandb on this node.",
            **details,
        )
    if mode == "disabled":
        return ok(name, f"wandb {version}, mode disabled (WANDB_MODE): nothing is tracked or written.", **details)
    if mode == "offline":
        return ok(
            name,
            f"wandb {version}, mode offline: runs stay in {directory}, upload them later with `wandb sync`; {where}.",
            **details,
        )
    source, key = _wandb_key_source()
    details["api_key"] = key
    if not source:
        return warn(
            name,
            f"wandb {version}, mode online, but no API key (WANDB_API_KEY or ~/.netrc): runs fall "
            f"back to offline; {where}.",
            "Set WANDB_API_KEY (or run `wandb login`), or set WANDB_MODE=offline.",
            **details,
        )
    return ok(name, f"wandb {version}, mode online, API key from {source} {key}; {where}.", **details)


def wandb_endpoint() -> Endpoint | None:
    """W&B's API server when runs will go online (wandb installed, mode online, a key), else None."""
    try:
        online = resolve_mode() == "online"
    except ValueError:
        return None
    if not online or _version("wandb") is None or not _wandb_key_source()[0]:
        return None
    base = os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_BASE_URL
    return Endpoint(
        "W&B", base.rstrip("/") + "/", url_setting="WANDB_BASE_URL", verify_setting="the system trust store"
    )

"""Weights & Biases experiment tracking: resumable runs with version-prefixed metrics.

A training node restarts many times and upgrades its software along the way. This
module keeps one W&B run per node across restarts (the run id lives in a small file
in the W&B directory), records which software versions the run has seen, and logs
every metric twice, as ``v{version}/<key>`` and ``latest/<key>``, against a
``global_step`` axis that the caller owns. Tracking must never stop training: when
W&B cannot be reached at start-up the run continues offline and can be uploaded
later with ``wandb sync``.

wandb is an optional extra, imported only when a run starts, so importing this module
has no side effects and works without it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import re
import secrets
import string
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Literal

__all__ = ["VersionedRun", "WandbNotInstalledError", "initialize_wandb"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'telemetry-stack[wandb]'"
DEFAULT_PROJECT = "telemetry"
DEFAULT_API_TIMEOUT = 20
STEP_METRIC = "global_step"
UNKNOWN_VERSION = "0+unknown"

# W&B itself only forbids a few characters; a stored id outside this conservative set
# is far more likely to be a damaged file than a real run id.
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ID_ALPHABET = string.ascii_lowercase + string.digits
_MODE_ALIASES = {
    "online": "online",
    "run": "online",
    "offline": "offline",
    "dryrun": "offline",
    "disabled": "disabled",
}

RemoteStatus = Literal["exists", "gone", "unknown"]


class WandbNotInstalledError(ImportError):
    """wandb is needed for experiment tracking but is not installed."""


def _import_wandb() -> ModuleType:
    """Import wandb on first use so the package stays importable without the extra."""
    try:
        import wandb
    except ImportError as exc:
        raise WandbNotInstalledError(
            "Weights & Biases experiment tracking needs the 'wandb' package, which is not "
            f"installed. Install it with: {INSTALL_HINT}"
        ) from exc
    return wandb


def run_id_file(wandb_dir: str | os.PathLike[str], run_prefix: str, uid: str | int) -> Path:
    """Where the run id of `run_prefix`+`uid` is kept (same name as earlier deployments)."""
    return Path(wandb_dir) / f"wandb_run_id_{run_prefix}{uid}.txt"


def _state_file(wandb_dir: Path, run_prefix: str, uid: str | int) -> Path:
    """Side file with what the W&B service cannot give back offline: versions and last step."""
    return wandb_dir / f"wandb_run_state_{run_prefix}{uid}.json"


def _package_version() -> str:
    """The installed telemetry_client version, used when the caller gives none."""
    import telemetry_client

    declared = getattr(telemetry_client, "__version__", None)
    if declared:
        return str(declared)
    try:
        return importlib.metadata.version("telemetry-stack")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def _normalise_version(version: str) -> str:
    """`v1.2` and `1.2` name the same version; a `/` would break the key prefix."""
    text = str(version).strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    if not text or "/" in text or any(c.isspace() for c in text):
        raise ValueError(f"invalid version for metric prefixes: {version!r}")
    return text


def resolve_mode(mode: str | None = None) -> str:
    """Explicit argument first, then W&B's own WANDB_MODE, then online."""
    chosen = mode if mode is not None else os.environ.get("WANDB_MODE") or "online"
    resolved = _MODE_ALIASES.get(chosen.strip().lower())
    if resolved is None:
        raise ValueError(f"unknown W&B mode {chosen!r}; use online, offline or disabled")
    return resolved


def wandb_directory(wandb_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where runs and run-id files live: the argument, else WANDB_DIR, else ./wandb."""
    return Path(wandb_dir or os.environ.get("WANDB_DIR") or Path.cwd() / "wandb")


def _config_to_dict(config: Any) -> dict[str, Any]:
    """Accept a dict, an argparse.Namespace or any object with public attributes."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    raise TypeError(f"config must be a mapping or an object with attributes, not {type(config).__name__}")


def _resolve_project(project: str | None, config: Mapping[str, Any]) -> str:
    """Argument, then WANDB_PROJECT, then a `project` entry in config, then the default."""
    from_config = config.get("project")
    return (
        project
        or os.environ.get("WANDB_PROJECT")
        or (from_config if isinstance(from_config, str) and from_config else None)
        or DEFAULT_PROJECT
    )


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temp file and rename so a crash never leaves a half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_run_id(path: Path) -> str | None:
    """The stored run id, or None (with one warning) when the file is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot read W&B run id file %s (%s); starting a new run", path, exc)
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        logger.warning("W&B run id file %s is empty; starting a new run", path)
        return None
    if not _RUN_ID_RE.fullmatch(text):
        logger.warning(
            "W&B run id file %s does not hold a valid run id (%r); starting a new run",
            path,
            text[:40],
        )
        return None
    return text


@dataclass
class _RunState:
    """What this node remembers about its run between processes."""

    run_id: str | None = None
    version_history: list[str] = field(default_factory=list)
    last_step: int | None = None
    # True while the id has only ever been used offline: the service not knowing it
    # then means "not synced yet", not "deleted", so the id is kept.
    offline_only: bool = False

    @classmethod
    def load(cls, path: Path, run_id: str | None) -> _RunState:
        """The stored state for `run_id`; a fresh state when missing, damaged or for another run."""
        if run_id is None:
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(run_id=run_id)
        if not isinstance(data, dict) or data.get("run_id") != run_id:
            return cls(run_id=run_id)
        history = data.get("version_history")
        last_step = data.get("last_step")
        return cls(
            run_id=run_id,
            version_history=[str(v) for v in history] if isinstance(history, list) else [],
            last_step=last_step if isinstance(last_step, int) else None,
            offline_only=data.get("offline_only") is True,
        )

    def save(self, path: Path) -> None:
        """Persist atomically; a failure is logged, never raised into training."""
        payload = {
            "run_id": self.run_id,
            "version_history": self.version_history,
            "last_step": self.last_step,
            "offline_only": self.offline_only,
        }
        try:
            _atomic_write(path, json.dumps(payload, indent=2) + "\n")
        except OSError as exc:
            logger.warning("cannot write W&B run state %s: %s", path, exc)


def _is_not_found(wandb: ModuleType, exc: BaseException) -> bool:
    """Whether a public-API error means the run does not exist (not a network failure)."""
    errors = wandb.errors
    auth_error = getattr(errors, "AuthenticationError", None)
    if auth_error is not None and isinstance(exc, auth_error):
        return False
    try:
        from wandb.apis.public.runs import RunNotFoundError
    except ImportError:  # older wandb reports a missing run as CommError
        pass
    else:
        if isinstance(exc, RunNotFoundError):
            return True
    if isinstance(exc, errors.CommError):
        message = str(exc).lower()
        return "could not find" in message or "not found" in message or "404" in message
    return False


def _one_line(exc: BaseException) -> str:
    """An exception as one log line: wandb's messages often carry multi-line hints."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _remote_run_status(wandb: ModuleType, entity: str | None, project: str, run_id: str, timeout: int) -> RemoteStatus:
    """Ask the service once whether the run exists; its history is never read."""
    path = f"{entity}/{project}/{run_id}" if entity else f"{project}/{run_id}"
    try:
        wandb.Api(timeout=timeout).run(path)
    except Exception as exc:
        if _is_not_found(wandb, exc):
            return "gone"
        logger.info("could not check W&B run %s (%s); resuming it anyway", path, _one_line(exc))
        return "unknown"
    return "exists"


def _merge_versions(*histories: Any, current: str) -> list[str]:
    """Versions in the order first seen, ending with `current` if it is new."""
    merged: list[str] = []
    for history in histories:
        if isinstance(history, list | tuple):
            for version in history:
                if str(version) not in merged:
                    merged.append(str(version))
    if current not in merged:
        merged.append(current)
    return merged


def _settings(wandb: ModuleType, init_timeout: float | None, system_stats: bool) -> Any:
    """wandb.Settings across versions (the stats switch was renamed over time)."""
    base: dict[str, Any] = {}
    if init_timeout is not None:
        base["init_timeout"] = init_timeout
    if not system_stats:
        for name in ("x_disable_stats", "_disable_stats"):
            try:
                return wandb.Settings(**base, **{name: True})
            except (TypeError, ValueError):
                continue
    return wandb.Settings(**base)


def _summary_step(run: Any) -> int | None:
    """The last global step the service holds for a resumed run, if any."""
    try:
        value = run.summary.get(STEP_METRIC)
    except Exception:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return None


class VersionedRun:
    """A W&B run whose `log` prefixes keys by version and records the caller's step.

    Every attribute it does not define (id, config, summary, finish's arguments, ...)
    is the underlying wandb Run's, so code written against a plain Run keeps working.
    """

    def __init__(
        self,
        run: Any,
        version: str,
        *,
        last_step: int | None = None,
        state: _RunState | None = None,
        state_path: Path | None = None,
    ) -> None:
        self._run = run
        self._version = version
        self._last_step = last_step
        self._open_step = False
        self._state = state
        self._state_path = state_path
        self._lock = threading.Lock()  # loggers on several threads must not share a step by accident

    @property
    def run(self) -> Any:
        """The underlying wandb Run."""
        return self._run

    @property
    def version(self) -> str:
        """The software version used in the `v{version}/` prefix."""
        return self._version

    @property
    def last_step(self) -> int | None:
        """The highest global step logged so far (including before a resume), if any."""
        return self._last_step

    def log(self, metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Log `metrics` as `v{version}/<key>` and `latest/<key>` at global step `step`.

        The step is written as the `global_step` value, never as W&B's internal step,
        so a step lower than one already seen (a restart, a replay) is kept rather than
        dropped. Without `step`, the step after the highest one seen is used (or the
        same step while the previous call had commit=False). A `global_step` key in
        `metrics` is taken as the step.
        """
        values = dict(metrics)
        given = values.pop(STEP_METRIC, None)
        if step is None and given is not None:
            step = int(given)
        with self._lock:
            if step is None:
                previous = -1 if self._last_step is None else self._last_step
                step = previous if self._open_step else previous + 1
            step = int(step)
            self._open_step = commit is False
            if self._last_step is None or step > self._last_step:
                self._last_step = step

        record: dict[str, Any] = {STEP_METRIC: step}
        if "step" not in values:
            record[f"v{self._version}/step"] = step
        for key, value in values.items():
            record[f"v{self._version}/{key}"] = value
            record[f"latest/{key}"] = value
        if commit is None:
            self._run.log(record)
        else:
            self._run.log(record, commit=commit)

    def save_state(self) -> None:
        """Remember the last step so the next process continues after it."""
        if self._state is None or self._state_path is None:
            return
        self._state.last_step = self._last_step
        self._state.save(self._state_path)

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        """Save the local run state, then finish the W&B run."""
        self.save_state()
        return self._run.finish(*args, **kwargs)

    def __enter__(self) -> VersionedRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define.
        if name.startswith("__") or name == "_run":
            raise AttributeError(name)
        return getattr(self._run, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._run, name, value)

    def __repr__(self) -> str:
        return f"VersionedRun(version={self._version!r}, run={self._run!r})"


def _define_metrics(run: Any, version: str) -> None:
    """Plot every key against the caller's global step instead of W&B's internal one."""
    run.define_metric(STEP_METRIC)
    for pattern in ("*", f"v{version}/*", "latest/*"):
        run.define_metric(pattern, step_metric=STEP_METRIC)


def initialize_wandb(
    run_prefix: str,
    uid: str | int,
    config: Any,
    group: str | None,
    job_type: str | None,
    *,
    project: str | None = None,
    entity: str | None = None,
    wandb_dir: str | os.PathLike[str] | None = None,
    mode: str | None = None,
    version: str | None = None,
    tags: Sequence[str] = (),
    init_timeout: float | None = None,
    api_timeout: int = DEFAULT_API_TIMEOUT,
    system_stats: bool = False,
) -> VersionedRun:
    """Start or resume the W&B run named `run_prefix`+`uid` and return it version-aware.

    Defaults: project = argument, WANDB_PROJECT, config's `project`, "telemetry";
    entity = argument, WANDB_ENTITY, else the account's default entity; wandb_dir =
    argument, WANDB_DIR, else ./wandb; mode = argument, WANDB_MODE, else online;
    version = argument, else telemetry_client's version; init_timeout = W&B's own
    (WANDB_INIT_TIMEOUT). System statistics are off unless `system_stats` (the
    InfluxDB pipeline already collects them).

    Raises WandbNotInstalledError (an ImportError) when wandb is missing.
    """
    wandb = _import_wandb()
    run_version = _normalise_version(version if version is not None else _package_version())
    run_mode = resolve_mode(mode)
    config_dict = _config_to_dict(config)
    run_project = _resolve_project(project, config_dict)
    run_entity = entity or os.environ.get("WANDB_ENTITY") or None
    name = f"{run_prefix}{uid}"
    init_kwargs: dict[str, Any] = {
        "project": run_project,
        "entity": run_entity,
        "name": name,
        "group": group,
        "job_type": job_type,
        "tags": [f"v{run_version}", *tags],
        "settings": _settings(wandb, init_timeout, system_stats),
    }

    if run_mode == "disabled":
        # Nothing is written: no directory, no run id file, no state.
        run = wandb.init(mode="disabled", **init_kwargs)
        history = [run_version]
        _apply_config(run, config_dict, history, run_version)
        _define_metrics(run, run_version)
        return VersionedRun(run, run_version)

    directory = wandb_directory(wandb_dir)
    directory.mkdir(parents=True, exist_ok=True)
    id_path = run_id_file(directory, run_prefix, uid)
    state_path = _state_file(directory, run_prefix, uid)

    stored_id = _read_run_id(id_path)
    state = _RunState.load(state_path, stored_id)
    if stored_id is not None and run_mode == "online" and not state.offline_only:
        status = _remote_run_status(wandb, run_entity, run_project, stored_id, api_timeout)
        if status == "gone":
            logger.info("W&B run %s no longer exists; starting a new run", stored_id)
            stored_id = None
            state = _RunState()

    run_id = stored_id or "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))
    init_kwargs.update(id=run_id, resume="allow" if stored_id else "never", dir=str(directory))
    run, actual_mode = _init_with_fallback(wandb, run_mode, init_kwargs)

    history = _merge_versions(_config_value(run, "version_history"), state.version_history, current=run_version)
    _apply_config(run, config_dict, history, run_version)
    _define_metrics(run, run_version)

    steps = [s for s in (state.last_step, _summary_step(run)) if s is not None]
    last_step = max(steps) if steps else None

    if run.id != stored_id:
        try:
            _atomic_write(id_path, f"{run.id}\n")
        except OSError as exc:
            logger.warning("cannot write W&B run id file %s: %s", id_path, exc)
    new_state = _RunState(
        run_id=run.id,
        version_history=history,
        last_step=last_step,
        offline_only=actual_mode == "offline" and (stored_id is None or state.offline_only),
    )
    new_state.save(state_path)
    return VersionedRun(run, run_version, last_step=last_step, state=new_state, state_path=state_path)


def _init_with_fallback(wandb: ModuleType, mode: str, init_kwargs: dict[str, Any]) -> tuple[Any, str]:
    """wandb.init; in online mode an unreachable service means offline, not a crash."""
    try:
        return wandb.init(mode=mode, **init_kwargs), mode
    except Exception as exc:
        if mode != "online":
            raise
        logger.warning(
            "W&B is unreachable (%s); continuing offline. Upload the run later with `wandb sync %s`",
            _one_line(exc),
            Path(init_kwargs["dir"]) / "wandb" / f"offline-run-*-{init_kwargs['id']}",
        )
    teardown = getattr(wandb, "teardown", None)
    if getattr(wandb, "run", None) is None and teardown is not None:
        # wandb's service process keeps the id of the failed attempt registered
        # ("run ID ... is in use"); restarting the service frees it. With no other
        # run active in this process, nothing else is affected.
        teardown()
    return wandb.init(mode="offline", **init_kwargs), "offline"


def _config_value(run: Any, key: str) -> Any:
    """A config entry of a (possibly resumed) run, None when absent."""
    try:
        return run.config.get(key)
    except Exception:
        return None


def _apply_config(run: Any, config: Mapping[str, Any], history: list[str], version: str) -> None:
    """Set the caller's config and the version keys; values may change on resume."""
    if config:
        run.config.update(dict(config), allow_val_change=True)
    run.config.update({"version_history": history, "current_version": version}, allow_val_change=True)

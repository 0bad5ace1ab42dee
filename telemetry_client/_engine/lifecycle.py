"""How each way a process ends reaches the engine's drain.

Python runs `atexit` hooks when the main module returns, on `sys.exit` and after
an uncaught exception. Two common ends skip them:

- multiprocessing children end with `os._exit` (fork start method:
  `multiprocessing/popen_fork.py` `Popen._launch`; forkserver: the `os._exit(code)`
  in `multiprocessing/forkserver.py` `main`). Before that, `BaseProcess._bootstrap`
  (`multiprocessing/process.py`) clears the finalizer registry inherited from the
  parent (`_after_fork`: `util._finalizer_registry.clear()`, then
  `util._run_after_forkers()`), runs the target, and in a `finally` calls
  `util._exit_function()`, which runs every `util.Finalize` whose exitpriority is
  not None (highest first). So a drain registered as a `Finalize` in the child,
  after the registry was cleared, runs on every normal or exceptional return of a
  child's target. (Spawn children end with `sys.exit`, so `atexit` runs there too.)
- SIGTERM's default action kills the process without running any Python code.
  While the handler is still the default one, we install a handler that drains
  within the exit deadline and then ends the process the way the default action
  would: it restores SIG_DFL and sends itself the signal again, so the parent sees
  "killed by signal 15".

Every drain here is bounded by the caller's deadline and never raises.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from telemetry_client.config import exit_timeout_setting, handle_sigterm_setting

# Finalizers with a higher exitpriority run first; multiprocessing's own (queues 10,
# pools 15) only release resources, so the drain goes before them.
FINALIZE_PRIORITY = 100

P = ParamSpec("P")
R = TypeVar("R")
Drain = Callable[[float | None], int]

_drain: Drain | None = None
_sigterm_enabled: bool | None = None  # None: not decided by a call, read the environment
_sigterm_installed = False
_sigterm_lock = threading.Lock()
_draining = threading.Event()


class _Anchor:
    """A weak-referenceable object for `multiprocessing.util.register_after_fork`."""


_ANCHOR = _Anchor()
_after_forker_registered = False


def exit_timeout() -> float:
    """Seconds the process's end waits for delivery: TELEMETRY_EXIT_TIMEOUT, default 3 (see config.py)."""
    return exit_timeout_setting().value


def install_exit_hooks(drain: Drain) -> None:
    """Run `drain(None)` (the default exit deadline) at every ending that runs Python code.

    Called once per process, when the engine is created.
    """
    global _drain
    _drain = drain
    atexit.register(_drain_at_exit)
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    if "multiprocessing.util" in sys.modules:
        _register_multiprocessing_finalizer()


def _drain_at_exit() -> None:
    if _drain is not None:
        with contextlib.suppress(Exception):  # the process is ending; the drain logs its own problems
            _drain(None)


def _after_fork_in_child() -> None:
    """The child's main thread is the one that forked: it is in no engine call, and drains nothing yet."""
    global _draining
    _EngineSection.depth = 0
    _draining = threading.Event()


def _before_fork() -> None:
    """In the parent, just before a fork: make sure a multiprocessing child re-registers its drain."""
    if "multiprocessing.util" in sys.modules:
        _register_after_forker()


def _register_after_forker() -> None:
    global _after_forker_registered
    if _after_forker_registered:
        return
    import multiprocessing.util as mp_util

    mp_util.register_after_fork(_ANCHOR, _in_multiprocessing_child_after_fork)
    _after_forker_registered = True


def _in_multiprocessing_child_after_fork(_anchor: object) -> None:
    _register_multiprocessing_finalizer()
    _restore_default_sigterm()


def _register_multiprocessing_finalizer() -> None:
    """Register the drain with multiprocessing's exit path in this process (a child, or the main one)."""
    import multiprocessing.util as mp_util

    mp_util.Finalize(None, _drain_at_exit, exitpriority=FINALIZE_PRIORITY)
    _register_after_forker()


# ---- SIGTERM -------------------------------------------------------------------------


def handle_sigterm(enabled: bool = True) -> None:
    """Turn the SIGTERM drain on or off for this process (overrides TELEMETRY_HANDLE_SIGTERM).

    Off: if our handler is installed and still in place, SIG_DFL is restored.
    On: our handler is installed now if called from the main thread while SIGTERM's
    handler is the default one; otherwise when the next logger is built.
    """
    global _sigterm_enabled, _sigterm_installed
    with _sigterm_lock:
        _sigterm_enabled = enabled
        if enabled:
            _sigterm_installed = False
    if enabled:
        maybe_install_sigterm_handler()
    else:
        _restore_default_sigterm()


def _in_multiprocessing_child() -> bool:
    process = sys.modules.get("multiprocessing.process")
    return process is not None and process.parent_process() is not None


def _restore_default_sigterm() -> None:
    """Give SIGTERM back its default action if our handler is in place (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError):  # not the main interpreter
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)


def sigterm_wanted() -> bool:
    """Whether to install the handler: `handle_sigterm()`'s choice, else TELEMETRY_HANDLE_SIGTERM (config.py).

    A bad TELEMETRY_HANDLE_SIGTERM raises `ConfigurationError` unless a call decided.
    """
    wanted = handle_sigterm_setting().value if _sigterm_enabled is None else _sigterm_enabled
    if _in_multiprocessing_child():
        # multiprocessing ends its children with SIGTERM (Process.terminate, and Pool.terminate,
        # which leaving `with Pool()` calls). A Python-level handler in a Pool worker made
        # Pool.terminate() hang now and then (about 2 runs in 100 here): children keep the
        # default action, and drain on their normal exit through multiprocessing's finalizers.
        return False
    return wanted


def maybe_install_sigterm_handler() -> None:
    """Install the draining SIGTERM handler once, if wanted and SIGTERM still has its default handler.

    Only the main thread of the main interpreter can set a handler; elsewhere this
    does nothing (and tries again when the next logger is built). A handler the
    application installed earlier is left alone.
    """
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    with _sigterm_lock:
        if _sigterm_installed or not sigterm_wanted():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # a subinterpreter cannot set handlers
            return
        _sigterm_installed = True  # decided once: a later SIG_DFL set by the application is its choice


class _EngineSection:
    """Marks main-thread code that holds, or is about to take, an engine lock.

    A signal handler runs on the main thread between two bytecodes, possibly inside
    such a section: a drain that needed the same lock would then wait for ever.
    The SIGTERM handler reads the depth to know whether it may park the main thread.
    """

    depth = 0

    def __enter__(self) -> None:
        if threading.get_ident() == threading.main_thread().ident:
            _EngineSection.depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.get_ident() == threading.main_thread().ident:
            _EngineSection.depth -= 1


_engine_section = _EngineSection()


def engine_call(method: Callable[P, R]) -> Callable[P, R]:
    """Mark an engine method the main thread may call while a signal arrives (see `_EngineSection`)."""

    @functools.wraps(method)
    def marked(*args: P.args, **kwargs: P.kwargs) -> R:
        with _engine_section:
            return method(*args, **kwargs)

    return marked


def _on_sigterm(signum: int, frame: object) -> None:
    """Drain within the exit deadline, then die of the signal as the default action would.

    The drain runs on its own thread. Normally the main thread waits for it here,
    so the application runs no further, as with the default action. If the signal
    interrupted the main thread inside the engine (a flush, stats, or the exit
    drain itself), the handler returns at once so the main thread can release its
    lock; the drain thread then signals the main thread again when it is done.
    A SIGTERM that arrives while draining ends the process at once.
    """
    if _draining.is_set():
        _die(signum)
    _draining.set()
    timeout = exit_timeout()
    main = threading.main_thread().ident
    interrupted_engine = _EngineSection.depth > 0

    def drain_then_end() -> None:
        if _drain is not None:
            _drain(timeout)  # never raises
        if interrupted_engine and main is not None:
            signal.pthread_kill(main, signum)

    worker = threading.Thread(target=drain_then_end, name="telemetry-sigterm", daemon=True)
    worker.start()
    if interrupted_engine:
        return
    worker.join(timeout)
    _die(signum)


def _die(signum: int) -> None:
    """End the process as the default action of `signum` would: restore it and send the signal again."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os._exit(128 + signum)  # only reached if the signal could not be delivered

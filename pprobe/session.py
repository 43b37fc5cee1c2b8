"""The probe's lifecycle in one process: start, fork, exit, stop.

A :class:`Session` owns the run folder, the dump budget, the log writer and the installed
interceptors. Interceptors are installed by post-import hooks when the program imports their
framework, never before (start-up imports neither numpy nor torch).
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from typing import Any

from . import _report, core, recorder, state
from .config import Config

#: framework module -> interceptor module (install() / uninstall()).
INTERCEPTORS = {
    "numpy": "pprobe.interceptors.numpy_namespace",
    "torch": "pprobe.interceptors.torch_api",
}

_process_hooks_done = False
_orig_exit = os._exit
_orig_sys_exit = sys.exit


class Session:
    active: Session | None = None

    def __init__(self, config: Config) -> None:
        from .dumps import Dumper
        from .run import Run
        from .writer import Writer

        self.config = config
        self.run = Run.create_or_join(config)
        self.config = config = self.run.config if not self.run.root else config
        self.dumper = (
            Dumper(
                self.run.dir,
                config.budget,
                config.dump_queue,
                config.dump_full,
                config.dump_codec,
                keep=config.dump_keep,
                hold=(config.dump_keep or 1) + 1 if config.on_nan == "dump" else 0,
                host=self.run.host,
                pack=config.dump_pack,
                direct=config.dump_direct,
            )
            if config.mode == "dump"
            else None
        )
        self.writer = Writer(
            self.run.dir,
            self.run.id,
            self.run.host,
            config.flush_rows,
            config.flush_seconds,
            self.run.folder,
            buffer_rows=config.buffer_rows,
            drop=config.buffer_full == "drop",
            log_writer=config.log_writer,
        )
        self.forwarder: Any = None  # pprobe.collect.client.Forwarder (PPROBE_COLLECTOR)
        self.installed: dict[str, Any] = {}
        self.exit_code: Any = None
        self.stopped = False

    # ------------------------------------------------------------------ start / stop
    @classmethod
    def start(cls, config: Config) -> Session:
        if cls.active is not None:
            cls.active.stop()
        s = cls(config)
        cls.active = s
        if os.environ.get("RANK", "").isdigit():
            state.rank = int(os.environ["RANK"])
        if os.environ.get("WORLD_SIZE", "").isdigit():
            state.world_size = int(os.environ["WORLD_SIZE"])
        if core.FELL_BACK:
            _report.warn_once("core", f"the Python engine records this run: {core.REASON}.")
        if s.config.collector:
            s._start_forwarder()
        s.writer.start()
        recorder.configure(s.config, s.dumper, s.writer.wake, s.writer.flush)
        _report._listeners[:] = [s.write_meta]
        _install_process_hooks()
        _install_sigterm()
        s.run.coverage["frameworks"] = {}
        for fw in s.config.frameworks:
            s._watch(fw)
        try:  # Lightning, transformers, Accelerate: patched when the program imports them
            from . import integrations

            integrations.watch(s.config.integrations)
        except Exception as e:
            _report.internal_error("watching for framework integrations", e)
        s.write_meta()
        if s.config.plugins:  # PPROBE_PLUGINS (pprobe.ext.plugins): one line per failure
            from .ext import plugins

            plugins.load_configured(s.config.plugins)
        if s.config.step_at:  # PPROBE_STEP_AT (pprobe.stepat): zero-code steps without torch
            from . import stepat

            stepat.install(s.config.step_at)
        if s.config.hooks or s.config.hook_modules:  # lifecycle hooks (pprobe.hooks.config)
            from .config import ConfigError

            try:
                from .hooks import config as hook_config

                hook_config.install(s.config)
            except ConfigError:  # PPROBE_STRICT: the caller stops the program
                s.stop()
                raise
            except Exception as e:
                _report.internal_error("installing the lifecycle hooks", e)
        if s.config.live != "off":  # PPROBE_LIVE: pprobe query --live asks this process
            from .ext import endpoint

            endpoint.start(s, s.config.live)
        return s

    def _start_forwarder(self) -> None:
        """PPROBE_COLLECTOR: the log writer hands its batches to a sender (pprobe.collect)."""
        try:
            from .collect import client

            self.forwarder = client.start(self)
            self.writer.tap = self.forwarder.submit
            self.writer.keep_local = self.forwarder.keep_local
        except Exception as e:
            _report.internal_error("starting the collector client", e)

    def _close_forwarder(self) -> None:
        f = self.forwarder
        if f is None:
            return
        try:
            proc = self.run.process_meta(self.dumper, self.writer)
            self.run.extra["collector"] = f.close(self.run.exit, proc)
        except Exception as e:
            _report.internal_error("closing the collector client", e)

    def _watch(self, framework: str) -> None:
        if framework in sys.modules:
            self._install(framework)
        else:
            import wrapt

            wrapt.register_post_import_hook(_make_hook(framework), framework)

    def _install(self, framework: str) -> None:
        if framework in self.installed or self.stopped:
            return
        try:
            mod = importlib.import_module(INTERCEPTORS[framework])
            self.installed[framework] = mod
            facts = mod.install()
            self.run.coverage["frameworks"][framework] = facts or {}
            self.run.coverage.update({k: v for k, v in (facts or {}).items() if k == "coverage"})
            self.write_meta()
        except ModuleNotFoundError as e:
            if e.name != INTERCEPTORS[framework]:
                _report.internal_error(f"installing the {framework} probe", e)
        except Exception as e:
            _report.internal_error(f"installing the {framework} probe", e)

    def stop(self, exiting: bool = False) -> None:
        """Uninstall the interceptors, flush the log and write the final metadata."""
        if self.stopped:
            return
        self.stopped = True
        lifecycle = sys.modules.get("pprobe.hooks.lifecycle")
        if lifecycle is not None:  # after_epoch, after_training, cleanup (once per process)
            try:
                lifecycle.finish()
            except Exception as e:
                _report.internal_error("ending the lifecycle hooks", e)
        stepat = sys.modules.get("pprobe.stepat")
        if stepat is not None:
            stepat.uninstall()
        recorder.deactivate()
        if not exiting:
            for fw, mod in list(self.installed.items()):
                try:
                    mod.uninstall()
                except Exception as e:
                    _report.internal_error(f"uninstalling the {fw} probe", e)
            self.installed.clear()
        live = sys.modules.get("pprobe.ext.endpoint")
        if live is not None:
            live.stop()
        ext = sys.modules.get("pprobe.ext.tables")
        if ext is not None:  # user tables: sampled once more, written, closed
            try:
                ext.stop()
            except Exception as e:
                _report.internal_error("closing python tables", e)
        self.writer.close()
        if self.dumper is not None:
            try:
                self.dumper.close()
            except Exception as e:
                _report.internal_error("closing the dump writer", e)
        import time

        self.run.end = time.time()
        self.run.exit = self._exit_status() if exiting else {"status": "disabled"}
        self._close_forwarder()
        self.write_meta()
        from . import endofrun

        endofrun.finish(self)  # `latest` given back by an empty run; the one line on stderr
        self.run.close()
        if Session.active is self:
            Session.active = None
        _release_sigterm()

    def _exit_status(self) -> dict[str, Any]:
        if isinstance(self.exit_code, int) and self.exit_code < 0:
            return {"status": "signal", "code": self.exit_code, "signal": -self.exit_code}
        last = getattr(sys, "last_value", None)
        if last is not None:
            return {
                "status": "exception",
                "code": 1,
                "exception": type(last).__name__,
                "message": str(last)[:500],
            }
        code = self.exit_code
        if code is None or code == 0:
            return {"status": "ok", "code": 0}
        return {
            "status": "exited",
            "code": code if isinstance(code, int) else 1,
            "message": None if isinstance(code, int) else str(code),
        }

    def write_meta(self) -> None:
        try:
            self.run.write_meta(self.dumper, self.writer)
        except Exception as e:
            if not self.run.extra.get("meta_failed"):
                self.run.extra["meta_failed"] = True
                _report.internal_error("writing meta.json", e)

    # ------------------------------------------------------------------ processes
    def after_fork_child(self) -> None:
        state.reset_after_fork()
        recorder.after_fork()
        self.run.after_fork()
        if self.dumper is not None:
            self.dumper.after_fork()
        if self.forwarder is not None:  # before the writer's thread hands it batches
            try:
                self.forwarder.after_fork_child()
            except Exception as e:
                _report.internal_error("restarting the collector client", e)
        self.writer.after_fork_child()
        recorder.configure(self.config, self.dumper, self.writer.wake, self.writer.flush)
        self.write_meta()
        _install_sigterm()


def _make_hook(framework: str) -> Any:
    def hook(module: Any) -> None:
        # A post-import hook that raises would make the user's import fail: guard everything.
        try:
            s = Session.active
            if s is not None and framework in s.config.frameworks:
                s._install(framework)
        except Exception as e:
            _report.internal_error(f"import hook for {framework}", e)

    return hook


def _install_process_hooks() -> None:
    """atexit, fork and os._exit handling; installed once per process."""
    global _process_hooks_done
    if _process_hooks_done:
        return
    _process_hooks_done = True
    atexit.register(_at_exit)
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
    )
    os._exit = _exit_wrapper  # type: ignore[assignment]  # forked workers end with os._exit
    sys.exit = _sys_exit_wrapper  # type: ignore[assignment]


#: Longest time a SIGTERM waits for pprobe's flush before the process dies of it.
SIGTERM_GRACE = 1.0
_sigterm_pid = 0  # the process whose watcher thread is started
_sigterm_fds: list[int] = []  # its pipe: (read end, write end)


def _install_sigterm() -> None:
    """Flush on SIGTERM, then die of it as before (pprobe/_sigterm.c says how).

    Only where SIGTERM has its default action. No Python-level handler: signal.getsignal()
    still says SIG_DFL, and the process dies of the signal at most :data:`SIGTERM_GRACE`
    seconds after it, whatever its main thread is doing. Without the C module (no compiler
    at install time) nothing is installed: the rows since the last flush are lost.
    """
    global _sigterm_pid
    try:
        import signal

        from . import _sigterm

        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        if _sigterm_pid == os.getpid():
            _sigterm.arm(_sigterm_fds[1], SIGTERM_GRACE)  # again, after a stop disarmed it
            return
        for fd in _sigterm_fds:  # a forked child: its parent's pipe
            os.close(fd)
        _sigterm_fds.clear()
        r, w = os.pipe()
        if not _sigterm.arm(w, SIGTERM_GRACE):
            os.close(r)
            os.close(w)
            return
        _sigterm_fds[:] = [r, w]
        _sigterm_pid = os.getpid()
        t = threading.Thread(target=_watch_sigterm, args=(r,), name="pprobe-sigterm", daemon=True)
        t.start()
    except (ImportError, AttributeError, ValueError, OSError):  # no signals here (Windows)
        pass


def _watch_sigterm(fd: int) -> None:
    """The watcher thread: on SIGTERM, stop the session (flush, meta.json), then die of it."""
    import signal

    state.local.depth = state.INTERNAL
    try:
        os.read(fd, 1)
    except OSError:
        return
    s = Session.active
    if s is not None and s.stopped:
        return  # another thread is stopping it: its stop ends with the death (_release_sigterm)
    if s is not None:
        try:
            s.exit_code = -signal.SIGTERM
            s.stop(exiting=True)
        except BaseException:
            pass
    _release_sigterm()


def _release_sigterm() -> None:
    """After a caught SIGTERM, die of it now; else give SIGTERM its default action back."""
    if _sigterm_pid == os.getpid():
        from . import _sigterm

        _sigterm.disarm()


def _at_exit() -> None:
    s = Session.active
    if s is not None:
        try:
            s.stop(exiting=True)
        except Exception as e:
            _report.internal_error("exit", e)


def _exit_wrapper(code: int) -> None:
    s = Session.active
    if s is not None:
        try:
            s.exit_code = code
            s.stop(exiting=True)
        except BaseException:
            pass
    _orig_exit(code)


def _sys_exit_wrapper(code: Any = None) -> None:
    # Only the main thread's SystemExit ends the process; in another thread it ends that
    # thread alone (threading ignores it), and the process's exit code is not this one.
    s = Session.active
    if s is not None and threading.current_thread() is threading.main_thread():
        s.exit_code = code
    _orig_sys_exit(code)


def _before_fork() -> None:
    s = Session.active
    if s is not None:
        s.writer.before_fork()


def _after_fork_parent() -> None:
    s = Session.active
    if s is not None:
        s.writer.after_fork_parent()


def _after_fork_child() -> None:
    s = Session.active
    if s is not None:
        try:
            s.after_fork_child()
        except Exception as e:
            _report.internal_error("fork", e)

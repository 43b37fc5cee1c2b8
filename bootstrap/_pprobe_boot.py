"""Shared by sitecustomize.py and usercustomize.py in this folder.

Python's ``site`` imports ``sitecustomize`` (then ``usercustomize`` outside venvs) from the
first folder on sys.path that has one, so ours shadows any the user or the distribution has.
After starting pprobe we import the shadowed module too (the ddtrace-run approach): our folder
is taken off sys.path for that import only, and the user's module takes the name in
sys.modules. An ImportError raised *inside* the user's module propagates as it would without
pprobe (``site`` prints it the same way); only "no such module" is ignored.

PYTHONPATH reaches every child process, whatever Python it runs, so the files of this folder
parse and run on every Python (2.7 included: no annotations, no f-strings). Where pprobe
cannot run (Python < 3.10, pprobe or its dependencies missing), a child of a probed run starts
silently unprobed and leaves ``skipped/{host}-{pid}.json`` in the run folder, which the run's
meta.json lists; a process that is no child says so in one line (nothing on Python 2).
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
MIN_PYTHON = (3, 10)


def _killed():
    return os.environ.get("PPROBE", "x").strip().lower() in ("0", "false", "no", "off")


def skip(reason):
    """This process runs unprobed because of ``reason``: recorded in the run of the parent
    (PPROBE_RESOLVED) when there is one, else said in one line (Python 3 only)."""
    resolved = os.environ.get("PPROBE_RESOLVED")
    if not resolved:
        if sys.version_info[0] >= 3:
            sys.stderr.write("pprobe: " + reason + "; the program runs without pprobe.\n")
        return
    try:  # pprobe.run.record_skipped writes the same record on the Pythons pprobe runs on
        import json
        import socket
        import time

        run_dir = json.loads(resolved)["run_dir"]
        host = socket.gethostname()
        folder = os.path.join(run_dir, "skipped")
        try:
            os.mkdir(folder)
        except OSError:  # there already (another child), or the run is gone: open() says
            pass
        path = os.path.join(folder, "%s-%d.json" % (host, os.getpid()))
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "host": host,
            "executable": sys.executable,
            "python": sys.version.split()[0],
            "argv": list(getattr(sys, "argv", None) or []),
            "time": time.time(),
            "reason": reason,
        }
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.rename(tmp, path)
    except Exception:  # silent: a child never prints pprobe's troubles
        pass


_started = []  # sitecustomize and usercustomize both call boot(): start once


def _start():
    if _started or _killed():
        return
    _started.append(True)
    if sys.version_info[:2] < MIN_PYTHON:
        version = "%d.%d" % sys.version_info[:2]
        skip("Python " + version + " is not supported (pprobe needs Python 3.10 or newer)")
        return
    try:
        try:
            from pprobe import _startup
        except ImportError:
            # Source checkout, pprobe not installed: the package lies beside this folder.
            root = os.path.dirname(_HERE)
            if not os.path.isfile(os.path.join(root, "pprobe", "__init__.py")):
                raise
            sys.path.append(root)
            from pprobe import _startup
    except Exception as e:
        skip("pprobe cannot be imported by " + sys.executable + ": " + repr(e))
        return
    try:
        _startup.initialize(source="bootstrap")
    except SystemExit:
        raise
    except BaseException as e:  # never break the program's start-up
        sys.stderr.write("pprobe: start-up failed: %r; running without pprobe.\n" % (e,))


def _same(p):
    try:
        return os.path.realpath(p or os.getcwd()) == os.path.realpath(_HERE)
    except (OSError, ValueError):
        return False


def chain(name):
    """Import the ``name`` module our own file shadows, if there is one."""
    ours = sys.modules.get(name)
    where = [i for i, p in enumerate(sys.path) if _same(p)]
    for i in reversed(where):
        del sys.path[i]
    sys.modules.pop(name, None)
    try:
        importlib.import_module(name)
    except ImportError as e:
        if getattr(e, "name", name) != name:
            raise  # an ImportError inside the user's module: theirs to see
        if ours is not None:
            sys.modules[name] = ours
    finally:
        for i in where:
            sys.path.insert(i, _HERE)


def boot(name):
    _start()
    chain(name)

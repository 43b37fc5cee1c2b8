"""Shared by sitecustomize.py and usercustomize.py in this folder.

Python's ``site`` imports ``sitecustomize`` (then ``usercustomize`` outside venvs) from the
first folder on sys.path that has one, so ours shadows any the user or the distribution has.
After starting pprobe we import the shadowed module too (the ddtrace-run approach): our folder
is taken off sys.path for that import only, and the user's module takes the name in
sys.modules. An ImportError raised *inside* the user's module propagates as it would without
pprobe (``site`` prints it the same way); only "no such module" is ignored.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _start() -> None:
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
        _startup.initialize(source="bootstrap")
    except SystemExit:
        raise
    except BaseException as e:  # never break the program's start-up
        sys.stderr.write(
            f"pprobe: start-up failed: {type(e).__name__}: {e}; running without pprobe.\n"
        )


def _same(p: str) -> bool:
    try:
        return os.path.realpath(p or os.getcwd()) == os.path.realpath(_HERE)
    except (OSError, ValueError):
        return False


def chain(name: str) -> None:
    """Import the ``name`` module our own file shadows, if there is one."""
    ours = sys.modules.get(name)
    where = [i for i, p in enumerate(sys.path) if _same(p)]
    for i in reversed(where):
        del sys.path[i]
    sys.modules.pop(name, None)
    try:
        importlib.import_module(name)
    except ImportError as e:
        if e.name != name:
            raise  # an ImportError inside the user's module: theirs to see
        if ours is not None:
            sys.modules[name] = ours
    finally:
        for i in where:
            sys.path.insert(i, _HERE)


def boot(name: str) -> None:
    _start()
    chain(name)

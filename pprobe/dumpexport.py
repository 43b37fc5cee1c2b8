"""``pprobe export --npy DIR [--run R]``: a run's dumps as seed-named files.

Small dumps live in the run's pack files (:mod:`pprobe.packs`, ``PPROBE_DUMP_PACK``); this
writes every dump the run holds, packed or not, as the file its rows name
(``op_{op}_input{i}_{prefix}.npy``, or ``....npy.zstd`` for another codec), with exactly the
bytes that file would have held. An alias (the same content dumped again) becomes a file of
its own. The destination is created, or must be an empty folder; every file is created
relative to the folder's descriptor with O_CREAT|O_EXCL|O_NOFOLLOW (pprobe.safefs): nothing is
written through a symlink, nothing existing is overwritten.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any


def _is_dump(name: str) -> bool:
    return not name.startswith(".") and (name.endswith(".npy") or ".npy." in name)


def export_npy(run: str | None, dest: str) -> dict[str, Any]:
    """Write the run's dumps into ``dest``; returns counts: files (copied from dump files),
    packed (from pack entries), aliases (of those, aliases), bytes. FileExistsError: ``dest``
    is not an empty folder; FileNotFoundError: no run."""
    from . import packs
    from .run import resolve_run_dir
    from .safefs import RunDir, UnsafeFolder, write_all

    run_dir = resolve_run_dir(run)
    dest = os.path.abspath(dest)
    if os.path.islink(dest):
        raise UnsafeFolder(f"{dest} is a symlink; give a folder")
    if os.path.lexists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise FileExistsError(f"{dest} exists and is not an empty folder")
    if os.path.realpath(dest) == os.path.realpath(run_dir):
        raise ValueError("the destination is the run folder itself")
    os.makedirs(dest, mode=0o700, exist_ok=True)
    out = RunDir.open(dest)
    counts: dict[str, Any] = {"run_dir": run_dir, "dir": dest}
    counts.update(files=0, packed=0, aliases=0, bytes=0)

    def put(name: str, data: bytes) -> None:
        fd = out.create(name)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        counts["bytes"] += len(data)

    try:
        written: set[str] = set()
        with os.scandir(run_dir) as it:
            plain = sorted(e.name for e in it if _is_dump(e.name))
        for name in plain:
            st = os.lstat(os.path.join(run_dir, name))
            if not stat.S_ISREG(st.st_mode):
                continue  # never read through a symlink planted in the run folder
            with open(os.path.join(run_dir, name), "rb") as f:
                put(name, f.read())
            written.add(name)
            counts["files"] += 1
        entries = packs.names(run_dir)
        for name, e in sorted(entries.items()):
            if name in written or not _is_dump(name) or "/" in name:
                continue
            data = packs.read(os.path.join(run_dir, name))
            if data is None:  # an alias whose first dump is gone
                continue
            put(name, data)
            written.add(name)
            counts["packed"] += 1
            counts["aliases"] += int(e.kind == packs.ALIAS)
    finally:
        out.close()
    return counts


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--npy DIR`` and ``--run R`` on ``pprobe export``'s parser."""
    p.add_argument(
        "--npy",
        metavar="DIR",
        help="write the run's dumps (packed ones included) as seed-named .npy files into DIR "
        "(created; must be empty) instead of the views",
    )
    p.add_argument("--run", dest="run_opt", metavar="R", help="the run (as RUN)")


def main(args: argparse.Namespace) -> int:
    """``pprobe export --npy DIR``: called by ``pprobe export`` when --npy is given."""
    from .safefs import UnsafeFolder

    if args.npy is None:  # no DIR at all
        print("pprobe export: give DIR (the views) or --npy DIR (the dumps)", file=sys.stderr)
        return 2
    if getattr(args, "dir", None):
        print("pprobe export: --npy DIR takes no second folder (the run: --run R)",
              file=sys.stderr)  # fmt: skip
        return 2
    if getattr(args, "run", None) and args.run_opt and args.run != args.run_opt:
        print("pprobe export: two runs given (RUN and --run)", file=sys.stderr)
        return 2
    try:
        c = export_npy(args.run_opt or args.run, args.npy)
    except (OSError, ValueError, UnsafeFolder) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"pprobe export: {first}", file=sys.stderr)
        return 2
    n = c["files"] + c["packed"]
    print(
        f"exported {n} dumps ({c['files']} from files, {c['packed']} from packs, "
        f"{c['aliases']} of them aliases; {c['bytes']} bytes) to {c['dir']}"
    )
    return 0

"""The live endpoint: ``pprobe query --live`` asks the running program (``PPROBE_LIVE``).

Off unless ``PPROBE_LIVE=unix`` or ``tcp``. Then a daemon thread (``pprobe-live``) listens on a
Unix socket in the run folder, ``live/{host}-{pid}.sock`` (0600, in the 0700 run folder), or
on ``127.0.0.1`` (an ephemeral port) where the socket's path would be too long or ``tcp`` is
asked for. ``live/{host}-{pid}.json`` (0600) says where, with a random token that every request
must carry.

A request is one JSON line ``{"token": ..., "sql": ...}``; the answer one JSON line
``{"columns": [...], "rows": [...]}`` or ``{"error": "..."}``. Each connection is served on a
thread of its own: the program's threads never run a query, and DuckDB releases the GIL while
it works, so a slow query does not block the program (docs/extending.md has the measure).

It runs SQL only, one statement, read-only: statements other than SELECT / WITH / FROM /
DESCRIBE / SHOW / EXPLAIN / SUMMARIZE / VALUES, and table functions that read files
(``read_*``, ``glob``, a quoted path as a table), are refused with a clear message; on top of
that the connection is locked with DuckDB's ``enable_external_access = false`` and
``allowed_directories`` = the run folder and its query cache, so nothing outside the run folder
can be read or written whatever the SQL.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import socket
import threading
from typing import Any

from .. import _report, state

#: Longest AF_UNIX path (Linux: 108 bytes with the NUL); longer ones use loopback TCP.
MAX_UNIX_PATH = 100
MAX_REQUEST = 1 << 20
_ALLOWED_START = re.compile(
    r"^\s*(SELECT|WITH|FROM|DESCRIBE|SHOW|EXPLAIN|SUMMARIZE|VALUES|TABLE|\()", re.IGNORECASE
)
_FILE_FUNCS = re.compile(
    r"\b(read_\w+|glob|sniff_csv|parquet_\w+|query_table|query|iceberg_\w+|delta_scan)\s*\(",
    re.IGNORECASE,
)
_QUOTED_TABLE = re.compile(r"\b(FROM|JOIN)\s*\(?\s*'", re.IGNORECASE)


class Refused(ValueError):
    """A request the endpoint does not run (the message says why)."""


def check_sql(sql: str) -> str:
    """The SQL if the endpoint may run it; else :class:`Refused` with a one-line reason."""
    s = sql.strip().rstrip(";").strip()
    if not s:
        raise Refused("empty SQL")
    if ";" in _strip_strings(s):
        raise Refused("one statement per request")
    if not _ALLOWED_START.match(s):
        word = s.split(None, 1)[0].upper()
        raise Refused(
            f"{word} is refused: the live endpoint runs read-only queries (SELECT, WITH, FROM, "
            "DESCRIBE, SHOW, EXPLAIN, SUMMARIZE, VALUES); never COPY, ATTACH, INSTALL, LOAD, "
            "SET or DDL"
        )
    bare = _strip_strings(s)
    m = _FILE_FUNCS.search(bare)
    if m:
        raise Refused(f"{m.group(1)}() is refused: the live endpoint reads no files but the run's")
    if _QUOTED_TABLE.search(s):
        raise Refused("a quoted path as a table is refused: the live endpoint reads no files")
    return s


def _strip_strings(s: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", s)


class Endpoint:
    def __init__(self, session: Any, transport: str) -> None:
        self.session = session
        self.token = secrets.token_hex(16)
        self.stopping = False
        self.active: set[Any] = set()  # DuckDB connections running a query
        self.threads: set[threading.Thread] = set()
        run = session.run
        host = re.sub(r"[^A-Za-z0-9._-]", "_", run.host)
        folder = run.folder.subdir("live")
        base = f"{host}-{os.getpid()}"
        path = os.path.join(run.dir, "live", base + ".sock")
        if transport == "unix" and len(path) <= MAX_UNIX_PATH and hasattr(socket, "AF_UNIX"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)  # in the run folder (0700 unless PPROBE_PERMISSIONS says otherwise)
            os.chmod(path, 0o600)  # and connecting needs the token anyway
            where: dict[str, Any] = {"transport": "unix", "path": path}
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            where = {"transport": "tcp", "host": "127.0.0.1", "port": sock.getsockname()[1]}
        sock.listen(8)
        self.sock = sock
        self.where = where
        info = {"pid": os.getpid(), "token": self.token, **where}
        folder.replace_atomic(base + ".json", json.dumps(info).encode())
        folder.close()
        self.thread = threading.Thread(target=self._serve, name="pprobe-live", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        state.local.depth = state.INTERNAL
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._handle, args=(conn,), name="pprobe-live-query",
                                 daemon=True)  # fmt: skip
            self.threads.add(t)
            t.start()

    def _handle(self, conn: socket.socket) -> None:
        state.local.depth = state.INTERNAL
        try:
            with conn:
                data = b""
                while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                answer = self.answer(data)
                conn.sendall(json.dumps(answer, default=str).encode() + b"\n")
        except Exception as e:
            if not self.stopping:
                _report.internal_error("the live endpoint", e)
        finally:
            self.threads.discard(threading.current_thread())

    def answer(self, data: bytes) -> dict[str, Any]:
        try:
            req = json.loads(data)
            token, sql = req.get("token"), req.get("sql")
        except (ValueError, AttributeError):
            return {"error": 'a request is one JSON line: {"token": ..., "sql": ...}'}
        if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
            return {"error": "bad token"}
        if not isinstance(sql, str):
            return {"error": "sql must be a string"}
        try:
            sql = check_sql(sql)
            from .live import run_locked

            if self.stopping:
                return {"error": "the program is stopping"}
            cols, rows = run_locked(sql, self.active)
            return {"columns": cols, "rows": rows}
        except Refused as e:
            return {"error": f"refused: {e}"}
        except Exception as e:
            # Only the program's end interrupts a live query: stop() does, and so may DuckDB
            # itself as the interpreter ends, before stop() has run (DuckDB 2.0).
            if self.stopping or str(e).startswith("INTERRUPT Error"):
                return {"error": "the program stopped before the query ended"}
            return {"error": str(e)}

    def stop(self) -> None:
        """Close the socket, interrupt the queries running and wait for their threads (a
        DuckDB query still running in a daemon thread when the interpreter ends aborts it)."""
        self.stopping = True
        try:
            self.sock.close()
        except OSError:
            pass
        import time

        # A query may be about to start (its connection not yet listed, or an interrupt sent
        # before DuckDB began): interrupt again until every query thread has ended.
        deadline = time.monotonic() + 10
        me = threading.current_thread()
        while time.monotonic() < deadline:
            alive = [t for t in list(self.threads) if t is not me and t.is_alive()]
            if not alive:
                break
            for con in list(self.active):
                try:
                    con.interrupt()
                except Exception:
                    pass
            alive[0].join(timeout=0.05)
        if self.where["transport"] == "unix":
            try:
                os.unlink(self.where["path"])
            except OSError:
                pass


_endpoint: Endpoint | None = None


def start(session: Any, transport: str) -> None:
    global _endpoint
    try:
        _endpoint = Endpoint(session, transport)
    except Exception as e:
        _report.internal_error("starting the live endpoint", e)


def stop() -> None:
    global _endpoint
    if _endpoint is not None:
        _endpoint.stop()
        _endpoint = None


def _after_fork() -> None:
    global _endpoint
    _endpoint = None  # the parent's socket serves the parent; a child has none


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# ---------------------------------------------------------------------- the client
def ask(info_path: str, sql: str, timeout: float = 60.0) -> dict[str, Any]:
    """Send ``sql`` to the endpoint described by ``info_path``; its answer."""
    with open(info_path, "rb") as f:
        info = json.loads(f.read())
    if info["transport"] == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr: Any = info["path"]
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        addr = (info["host"], info["port"])
    s.settimeout(timeout)
    with s:
        s.connect(addr)
        s.sendall(json.dumps({"token": info["token"], "sql": sql}).encode() + b"\n")
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    if not data:
        return {"error": "the program ended before it answered"}
    return json.loads(data)  # type: ignore[no-any-return]

"""What client and collector say to each other over Arrow Flight.

- ``DoPut``: the descriptor's command is a JSON header ``{"run", "host", "pid", "rank",
  "stream", "client"}``; ``stream`` is ``ops``, ``tensors``, ``stacks``, ``python.<table>`` or
  ``dumps``;
  ``client`` is a random id per process instance. Each batch's app metadata is
  ``{"batch": n}``, a number that the client never reuses: (client, batch) is the batch's
  identity, and the collector keeps each identity once.
- ``DoAction("end")``: a JSON body with the process's final figures (rows sent and dropped,
  batches left in its spool, its exit status), sent as it exits.
- Every call carries ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

AUTH = "authorization"
STREAMS = ("ops", "tensors", "stacks", "dumps")
_TABLE = re.compile(r"python\.[A-Za-z_][A-Za-z0-9_]*\Z")
#: Dump batches' columns (name, codec, data).
DUMP_COLUMNS = ("name", "codec", "data")


class BadHeader(ValueError):
    """A header the collector does not accept; the message says which field and why."""


def bearer(token: str) -> bytes:
    return b"Bearer " + token.encode()


def command(header: dict[str, Any]) -> bytes:
    keys = ("run", "host", "pid", "rank", "world_size", "stream", "client")
    return json.dumps({k: header.get(k) for k in keys}, sort_keys=True).encode()


def parse_command(data: bytes) -> dict[str, Any]:
    """The header of a DoPut, checked field by field (never trusted as a path)."""
    try:
        h = json.loads(data)
    except ValueError:
        raise BadHeader("the descriptor is not a JSON header") from None
    if not isinstance(h, dict):
        raise BadHeader("the descriptor is not a JSON object")
    for k in ("run", "host", "client"):
        if not isinstance(h.get(k), str) or not h[k] or len(h[k]) > 1024:
            raise BadHeader(f"{k!r} must be a non-empty string")
    if not isinstance(h.get("pid"), int) or isinstance(h["pid"], bool) or h["pid"] < 0:
        raise BadHeader("'pid' must be a non-negative integer")
    for k in ("rank", "world_size"):
        if h.get(k) is not None and (not isinstance(h[k], int) or isinstance(h[k], bool)):
            raise BadHeader(f"{k!r} must be an integer or null")
    s = h.get("stream")
    if not isinstance(s, str) or not (s in STREAMS or _TABLE.match(s)):
        raise BadHeader(f"'stream' {s!r} is not ops, tensors, stacks, dumps or python.<table>")
    if not re.fullmatch(r"[A-Za-z0-9]{1,64}", h["client"]):
        raise BadHeader("'client' must be 1 to 64 letters and digits")
    return h


def batch_meta(batch_id: int) -> bytes:
    return json.dumps({"batch": batch_id}).encode()


def parse_batch_meta(data: Any) -> int:
    try:
        n = json.loads(bytes(data) if data is not None else b"")["batch"]
    except (ValueError, KeyError, TypeError):
        raise BadHeader("a batch without its id ({'batch': n} app metadata)") from None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise BadHeader("a batch id must be a non-negative integer")
    return n

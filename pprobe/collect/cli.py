"""``pprobe collect``: run the collector, or resend a spool to one."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from typing import Any

COMMAND = "collect"
DEFAULT_LISTEN = "127.0.0.1:8815"


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        COMMAND,
        help="receive many processes' logs over Arrow Flight (docs/distributed.md)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  pprobe collect --output runs --token-file tok        (clients: "
        "PPROBE_COLLECTOR=grpc://127.0.0.1:8815 PPROBE_COLLECTOR_TOKEN_FILE=tok)\n"
        "  pprobe collect --resend np_op_dumps/RUN/.spool --to grpc://HOST:8815 --token-file tok",
    )
    c.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"address to listen on (default {DEFAULT_LISTEN}: loopback only; "
                   "port 0 picks a free port)")  # fmt: skip
    c.add_argument("--output", metavar="DIR", help="folder that receives one run folder per run")
    c.add_argument("--token-file", metavar="F",
                   help="file holding the token clients must send (default: a new random "
                   "token in DIR/.collector-token)")  # fmt: skip
    c.add_argument("--tls-cert", metavar="C", help="PEM certificate: serve grpc+tls")
    c.add_argument("--tls-key", metavar="K", help="PEM private key of --tls-cert")
    c.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    c.add_argument("--metrics-port", type=_port, metavar="P",
                   help="serve Prometheus metrics at http://127.0.0.1:P/metrics "
                   "(needs prometheus_client)")  # fmt: skip
    c.add_argument(
        "--resend",
        metavar="SPOOL",
        help="send a spool folder's batches (then delete them) instead of serving",
    )
    c.add_argument("--to", metavar="URL", help="with --resend: the collector, grpc://HOST:PORT")
    c.add_argument("--tls-root", metavar="C",
                   help="with --resend to grpc+tls://: the certificate to trust")  # fmt: skip


def _port(v: str) -> int:
    if not v.isdigit() or not 0 < int(v) < 65536:
        raise argparse.ArgumentTypeError(f"{v!r} is not a port (1 to 65535)")
    return int(v)


def main(args: argparse.Namespace) -> int:
    if args.resend:
        if not args.to:
            print("pprobe collect: --resend needs --to grpc://HOST:PORT", file=sys.stderr)
            return 2
        return _resend(args)
    if not args.output:
        print("pprobe collect: give --output DIR (or --resend SPOOL --to URL)", file=sys.stderr)
        return 2
    if bool(args.tls_cert) != bool(args.tls_key):
        print("pprobe collect: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    host, _, port_s = args.listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port_s.isdigit() or int(port_s) > 65535:
        print(f"pprobe collect: --listen {args.listen!r}: expected HOST:PORT", file=sys.stderr)
        return 2
    # gRPC's own start-up lines (absl) would repeat, less clearly, the one line said below.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import pyarrow as pa

    try:
        return _serve(args, host, int(port_s))
    except pa.ArrowException as e:
        if "did not start" in str(e):
            print(f"pprobe collect: cannot listen on {args.listen} (the port is in use, or the "
                  "address is not one of this host's)", file=sys.stderr)  # fmt: skip
        else:
            print(f"pprobe collect: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"pprobe collect: {e}", file=sys.stderr)
        return 1


def _token(args: argparse.Namespace) -> tuple[str, str]:
    """(token, the file it is in): --token-file, else DIR/.collector-token (made if missing)."""
    path = args.token_file
    if not path:
        path = os.path.join(args.output, ".collector-token")
        os.makedirs(args.output, mode=0o700, exist_ok=True)
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
    with open(path, encoding="utf-8") as f:
        tok = f.readline().strip()
    if len(tok) < 16:
        raise ValueError(f"{path}: the token must be at least 16 characters")
    return tok, path


def _serve(args: argparse.Namespace, host: str, port: int) -> int:
    from . import server
    from .observe import Log, Metrics

    log = Log(args.log_json)
    metrics, http = Metrics(), None
    if args.metrics_port is not None:
        try:
            metrics, http = Metrics.serve(args.metrics_port)
        except OSError as e:
            print(f"pprobe collect: --metrics-port {args.metrics_port}: {e.strerror}",
                  file=sys.stderr)  # fmt: skip
            return 1
        except ImportError:
            print("pprobe collect: --metrics-port needs prometheus_client (pip install "
                  "prometheus_client)", file=sys.stderr)  # fmt: skip
            return 2
    tok, tok_path = _token(args)
    tls = None
    if args.tls_cert:
        with open(args.tls_cert, "rb") as f1, open(args.tls_key, "rb") as f2:
            tls = (f1.read(), f2.read())
    loc = server.location(host, port, tls is not None)
    srv = server.Collector(loc, args.output, tok, log, metrics, tls)
    url = server.location(host, srv.port, tls is not None).replace("grpc+tcp", "grpc")
    print(f"pprobe collect: listening on {url}, writing to {os.path.abspath(args.output)}, "
          f"token in {tok_path}", flush=True)  # fmt: skip
    murl = f"http://127.0.0.1:{args.metrics_port}/metrics" if http else None
    log.event("start", url=url, output=os.path.abspath(args.output), metrics=murl)

    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        log.event("stopping", signal=signal.Signals(signum).name)
        stopping.set()

    # The server serves from its own threads from the start; the main thread waits for a
    # signal (Python runs handlers only on the main thread, between bytecodes: not inside
    # FlightServerBase.wait()).
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping.wait(0.5):
            pass
        srv.shutdown()  # waits for the calls in progress: every batch received is written
    finally:
        srv.close_all()
        log.event("stopped")
    return 0


def _resend(args: argparse.Namespace) -> int:
    import pyarrow.flight as flight

    from . import spool, wire
    from .breaker import backoff
    from .client import read_token

    token = read_token(args.token_file or "")
    kw: dict[str, Any] = {}
    if args.tls_root:
        with open(args.tls_root, "rb") as f:
            kw["tls_root_certs"] = f.read()
    client = flight.FlightClient(args.to, **kw)
    headers = [(wire.AUTH.encode(), wire.bearer(token))] if token else []
    opts = flight.FlightCallOptions(headers=headers, timeout=30)
    sent = rows = failed = 0
    import time

    import pyarrow as pa

    for path in spool.walk(args.resend):
        try:
            with open(path, "rb") as f:
                h, b = spool.decode(f.read())
        except (OSError, ValueError, KeyError) as e:
            print(f"pprobe collect: {path}: not a spool file ({e})", file=sys.stderr)
            failed += 1
            continue
        ok, err = False, ""
        for attempt in range(3):
            try:
                desc = flight.FlightDescriptor.for_command(wire.command(h))
                w, _r = client.do_put(desc, b.schema, opts)
                w.write_with_metadata(b, pa.py_buffer(wire.batch_meta(h["batch"])))
                w.done_writing()
                w.close()
                ok = True
                break
            except flight.FlightError as e:
                err = str(e).splitlines()[0] if str(e) else e.__class__.__name__
                if attempt < 2:
                    time.sleep(backoff(attempt, base=0.2))
        if not ok:
            print(f"pprobe collect: {path}: {err}", file=sys.stderr)
            failed += 1
            continue
        os.unlink(path)
        sent += 1
        rows += b.num_rows if h["stream"] != "dumps" else 0
    print(f"pprobe collect: resent {sent} batches ({rows} rows) to {args.to}; {failed} failed")
    return 1 if failed else 0

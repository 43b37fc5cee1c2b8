"""A ``pprobe collect`` server in a subprocess, for the collector's tests."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

from helpers import PYTHON, clean_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_file(tmp_path: Path, name: str = "token") -> Path:
    p = tmp_path / name
    p.write_text(secrets.token_urlsafe(24) + "\n")
    p.chmod(0o600)
    return p


class Collector:
    """``python -m pprobe collect`` on 127.0.0.1:port writing to ``output``."""

    def __init__(self, tmp_path: Path, output: Path, token: Path, port: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.tmp_path, self.output, self.token = tmp_path, output, token
        self.port = port or free_port()
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        scheme = "grpc+tls" if "--tls-cert" in self.extra else "grpc"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def err_path(self) -> Path:
        return self.tmp_path / f"collector-{self.starts}.err"

    def start(self) -> Collector:
        self.starts += 1
        cmd = [PYTHON, "-m", "pprobe", "collect", "--listen", f"127.0.0.1:{self.port}",
               "--output", str(self.output), "--token-file", str(self.token)]  # fmt: skip
        cmd += self.extra
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=open(self.err_path, "w"), text=True,
            env=clean_env(), cwd=str(self.tmp_path),
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, (line, self.err())
        return self

    def err(self) -> str:
        return "".join(
            (self.tmp_path / f"collector-{i}.err").read_text() for i in range(1, self.starts + 1)
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def client_env(self, **extra: str) -> dict[str, str | None]:
        return {
            "PPROBE_COLLECTOR": self.url,
            "PPROBE_COLLECTOR_TOKEN_FILE": str(self.token),
            **extra,
        }


def wait_for(cond: object, timeout: float = 60.0) -> None:
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        if callable(cond) and cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for a condition")


def run_folders(output: Path) -> list[Path]:
    return sorted(p for p in output.iterdir() if p.is_dir() and not p.name.startswith("."))


__all__ = ["Collector", "free_port", "os", "run_folders", "token_file", "wait_for"]

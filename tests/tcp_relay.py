"""A TCP relay in front of a real server, to take the server away from its clients and bring it back.

``Relay(upstream_port)`` listens on a free port of 127.0.0.1 and forwards every connection to
``127.0.0.1:upstream_port``. ``stop()`` is, for a client, the server going away: the listener closes
(new connections are refused) and every open connection is reset. ``start()`` listens again on the
same port, so clients that keep ``relay.base_url`` reach the server again. The relay runs in daemon
threads of the test process; the process behind it keeps running throughout.
"""

from __future__ import annotations

import socket
import threading

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Relay:
    """A TCP relay from 127.0.0.1:port to the real server: stopping it is, for a client, the server going
    away (connections reset, new ones refused); starting it again on the same port brings it back."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.port = _free_port()
        self.base_url = f"http://{HOST}:{self.port}/v1"
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self.listener is not None

    def start(self) -> None:
        self.listener = socket.create_server((HOST, self.port))  # SO_REUSEADDR: the port can be bound again
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection((HOST, self.upstream), timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

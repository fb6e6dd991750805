"""A TCP proxy on a fixed loopback port in front of a real server, that can forward, refuse or
blackhole traffic: the network fault between the operator and MLflow or S3, made on demand.

- forward: bytes go both ways;
- refuse: nothing listens on the port (a client gets ECONNREFUSED) and open connections are cut;
- blackhole: connections are accepted and then nothing comes back, as a dropped route or a hung
  server looks to a client, which waits out its own timeout.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Literal, Self

Mode = Literal["forward", "refuse", "blackhole"]


class FaultyProxy:
    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.port = port
        self._mode: Mode = "forward"
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._guard = threading.Lock()
        self._stopped = threading.Event()
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._listen()
        threading.Thread(target=self._accept_loop, daemon=True, name="faulty-proxy").start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._close_listener()
        self._cut()

    def set_mode(self, mode: Mode) -> None:
        with self._guard:
            self._mode = mode
        if mode == "refuse":
            self._close_listener()
            self._cut()
        elif self._listener is None:
            self._listen()
        if mode == "blackhole":
            self._cut()  # a keep-alive connection must not outlive the fault

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        sock.settimeout(0.2)
        self.port = sock.getsockname()[1]
        with self._guard:
            self._listener = sock

    def _close_listener(self) -> None:
        with self._guard:
            sock, self._listener = self._listener, None
        if sock is not None:
            sock.close()

    def _cut(self) -> None:
        with self._guard:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            with self._guard:
                listener = self._listener
            if listener is None:
                self._stopped.wait(0.1)
                continue
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            with self._guard:
                mode = self._mode
                self._conns.append(client)
            if mode == "forward":
                threading.Thread(target=self._pipe, args=(client,), daemon=True).start()
            # blackhole: the socket is held open and never read; a later mode change closes it.

    def _pipe(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._guard:
            self._conns.append(server)
        pair = {client: server, server: client}
        try:
            while not self._stopped.is_set():
                with self._guard:
                    if self._mode != "forward":
                        break
                ready, _, _ = select.select(list(pair), [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pair[sock].sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()

"""A TCP address for the sandbox's unix socket (tcp://127.0.0.1:PORT): the same daemon, reached as a remote one is,
for the tests of what hostagent does over tcp (the docker SDK's transport)."""

from __future__ import annotations

import socket
import threading


class Forwarder:
    """tcp://127.0.0.1:PORT to the sandbox's unix socket: a daemon that is not a unix socket."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.socket(socket.AF_UNIX)
            far.connect(self.path)
            self.open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for s in self.open:
            s.close()

"""A TCP proxy in front of a server that can lose a reply: with `drop_reply_after` set, the first
server reply to arrive after a client message containing those bytes is not forwarded, and both
connections are closed, as when a network fails after the server committed. With `orphan` set
too, only the client's side is closed: the server's session lives on, as across a partition,
until close_orphans(). hang_existing() leaves the connections open now carrying nothing more, as
across a dead route."""

from __future__ import annotations

import socket
import threading
from typing import Optional


class Proxy:
    def __init__(self, server_port: int):
        self.server_port = server_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drop_reply_after: Optional[bytes] = None
        self.orphan = False
        self.orphans: list = []
        self.dropped = 0
        self._made = 0
        self._hung_below = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.server_port))
            armed = threading.Event()
            made, self._made = self._made, self._made + 1
            for args in ((client, server, armed, True, made), (server, client, armed, False, made)):
                threading.Thread(target=self._pipe, args=args, daemon=True).start()

    def hang_existing(self) -> None:
        """The connections open now stop carrying data either way, with no reset and no answer;
        connections made later work."""
        self._hung_below = self._made

    def _pipe(
        self, source: socket.socket, sink: socket.socket, armed: threading.Event, upstream: bool, made: int
    ) -> None:
        try:
            while data := source.recv(65536):
                if made < self._hung_below:
                    continue
                if upstream and self.drop_reply_after and self.drop_reply_after in data:
                    self.drop_reply_after = None
                    armed.set()
                elif not upstream and armed.is_set():
                    self.dropped += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        client, server = (source, sink) if upstream else (sink, source)
        _close(client)
        if self.orphan and armed.is_set():
            self.orphans.append(server)
        else:
            _close(server)

    def close_orphans(self) -> None:
        for sock in self.orphans:
            _close(sock)

    def close(self) -> None:
        self.listener.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

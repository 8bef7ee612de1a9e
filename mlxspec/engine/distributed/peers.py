"""Notice at once that a process of a ring group is gone, from this rank's side
of the ring's own connections.

MLX's ring backend (0.32.4) does not surface a lost peer to a collective that
was queued with ``async_eval`` (the decode loop's): the backend prints ``[ring]
Too many send/recv errors. Failing pending tasks...`` and the waiting
``eval`` never returns, so only :mod:`.watchdog`'s bound would end it. The
kernel knows sooner: when a peer process exits, its sockets close and this
rank's end of each reads end-of-file (a reset for an abortive close). A
:class:`PeerWatch` finds the ring's TCP connections (those to or from an
address of ``MLX_HOSTFILE``) once the group is up and peeks at them
(``MSG_PEEK``: nothing is read, MLX's data stays queued) every ``interval``
seconds on a thread of its own. It moves no bytes: the collectives stay MLX's.
A peer whose host dies without closing its connections (power, network) is
left to the watchdog. Other backends (MPI, NCCL, JACCL) have no watch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger("mlxspec.engine.distributed")

#: Seconds between two looks at the ring's connections.
DEFAULT_INTERVAL_S = 0.5


def ring_addresses(env: Mapping[str, str] | None = None) -> set[tuple[str, int]]:
    """Every rank's ring address, from the hostfile ``mlx.launch`` writes.

    Args:
        env (Mapping[str, str] | None): the environment. Default: ``os.environ``.

    Returns:
        set[tuple[str, int]]: ``(ip, port)`` pairs of ``MLX_HOSTFILE`` (a JSON
        list, one list of ``"ip:port"`` strings per rank); empty when there is
        no readable hostfile.
    """
    env = os.environ if env is None else env
    path = env.get("MLX_HOSTFILE")
    if not path:
        return set()
    try:
        with open(path, encoding="utf-8") as file:
            ranks = json.load(file)
        return {_address(entry) for rank in ranks for entry in rank}
    except (OSError, ValueError, TypeError):
        return set()


def _address(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return host.strip("[]"), int(port)


def ring_connections(addresses: set[tuple[str, int]]) -> list[socket.socket]:
    """Duplicates of this process's connected TCP sockets whose peer or local
    address is one of ``addresses`` (the ring's; a listening socket has no peer
    and is left out). Closing a duplicate leaves MLX's socket open."""
    if not addresses or socket.getdefaulttimeout() is not None:
        # with a default timeout Python would make each duplicate non-blocking, which
        # would change MLX's own sockets too (one file description): watch nothing
        return []
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    found, made = [], set()
    for name in os.listdir(fd_dir):
        try:
            # the listing's own descriptor was closed: a duplicate may now hold its number
            if int(name) in made or not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        made.add(sock.fileno())
        try:
            ends = {sock.getpeername()[:2], sock.getsockname()[:2]}
        except OSError:  # not connected (a listener), or not an inet socket
            ends = set()
        if sock.type == socket.SOCK_STREAM and ends & addresses:
            found.append(sock)
        else:
            sock.close()
    return found


def closed(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` closed its end (end-of-file or a reset).

    Peeks one byte without waiting (``MSG_PEEK | MSG_DONTWAIT``): queued data
    stays for MLX to read, and the socket's blocking mode is not touched.
    """
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # open, nothing queued
    except OSError:  # reset, broken pipe
        return True


class PeerWatch:
    """Calls ``on_lost`` once when a ring connection of this rank closes.

    Args:
        sockets (list[socket.socket]): the ring's connections
            (:func:`ring_connections`); the watch owns these duplicates.
        on_lost (Callable[[str], None]): called with the reason from the
            watch's thread (:meth:`~.serving.ShardedServing.lose`).
        interval (float): seconds between looks. Default: :data:`DEFAULT_INTERVAL_S`.
    """

    def __init__(
        self,
        sockets: list[socket.socket],
        on_lost: Callable[[str], None],
        interval: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.sockets, self.interval, self.on_lost = sockets, interval, on_lost
        self._stop = threading.Event()

    def gone(self) -> str | None:
        """The reason if a connection is closed now (any thread), else ``None``;
        the reason is shown to clients, so the peer's address is only logged."""
        for sock in self.sockets:
            if closed(sock):
                try:
                    host, port = sock.getpeername()[:2]
                    peer = f"{host}:{port}"
                except OSError:
                    peer = "unknown"
                log.error("the ring connection to %s closed", peer)
                return "a process of the group exited (its ring connection closed)"
        return None

    def start(self) -> None:
        """Start watching on a daemon thread (nothing to watch: nothing starts)."""
        if self.sockets:
            threading.Thread(target=self._watch, name="mlxspec-dist-peers", daemon=True).start()

    def stop(self) -> None:
        """Stop watching (rank 0 ended the group: its peers exit on purpose)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if (reason := self.gone()) is not None and not self._stop.is_set():
                self.on_lost(reason)
                return

"""How a kept lease, an elector and a retry wait, in pairs: the asyncio half (asleep, AEvent, ALock,
AStop, aspawn), which the aio_*.py files are written with, and the thread half (sleep, Event,
Lock, Stop, spawn), which tools/async_to_sync.py puts in its place in the sync files it makes of
them."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import threading
import time
from typing import Any, Callable, Coroutine, Optional

sleep = time.sleep
asleep = asyncio.sleep

# A thread's is reentrant: the callbacks run under a kept lease's (on_lost from a proclaim,
# on_stopped_leading from a hand-off) must not deadlock when they call the lease back.
Lock = threading.RLock
ALock = asyncio.Lock


class Event(threading.Event):
    def wait_timeout(self, timeout: float) -> bool:
        """Whether the event is set, waiting `timeout` seconds at most."""
        return self.wait(timeout)


class AEvent(asyncio.Event):
    async def wait_timeout(self, timeout: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wait(), timeout)
        return self.is_set()


def spawn(run: Callable[[], Any], name: str) -> threading.Thread:
    """`run` in a thread of its own, which does not keep the process alive."""
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def aspawn(run: Callable[[], Coroutine[Any, Any, Any]], name: str) -> "asyncio.Task[Any]":
    return asyncio.get_running_loop().create_task(run(), name=name)


class Stop:
    """A loop's stop signal, whose wait can also end when a socket becomes readable."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._wake, self._waker = socket.socketpair()

    def set(self) -> None:
        self._event.set()
        with contextlib.suppress(OSError):
            self._waker.send(b"x")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float, fd: Optional[int] = None) -> bool:
        """Whether stopped, waiting `timeout` seconds at most, or until `fd` is readable."""
        if fd is None:
            return self._event.wait(timeout)
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake, selectors.EVENT_READ)
            selector.register(fd, selectors.EVENT_READ)
            selector.select(timeout)
        return self._event.is_set()

    def close(self) -> None:
        self._wake.close()
        self._waker.close()


class AStop:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float, fd: Optional[int] = None) -> bool:
        loop = asyncio.get_running_loop()
        stopped = loop.create_task(self._event.wait())
        readable = loop.create_future()
        if fd is not None:
            loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait((stopped, readable), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if fd is not None:
                loop.remove_reader(fd)
            stopped.cancel()
        return self._event.is_set()

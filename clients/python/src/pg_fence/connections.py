"""The sync client's connections, and how long a call on one may take (aio_connections.py has
asyncio's; caller.py retries the calls).

From a conninfo: one connection, kept and made again when it breaks. From a psycopg_pool pool: a
connection per call, or (`pinned`, as a keeper and a session-bound lease need) one held until
it breaks, switched to autocommit while held and given back as it came, `statement_timeout`
reset. Every call runs in its own transaction: autocommit connections run it as it is, others
inside `conn.transaction()`.

A call is bounded (`bounded`): a stopped server answers nothing, and TCP keepalives do not help
when its kernel still acknowledges them. A call that runs out of time is abandoned with its
connection, which the thread still running it disposes of when it returns."""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Set, TypeVar

import psycopg

from .errors import READ_ONLY, CallTimedOut, connecting, retryable, sqlstate
from .source import CANCEL_TIMEOUT, Source

T = TypeVar("T")


class _Lending(Source):
    """A sync source's `use()`: a connection checked out for a block, and checked in with the
    failure that ended the block, if one did (which decides whether the connection is kept)."""

    @contextlib.contextmanager
    def use(self) -> Iterator[psycopg.Connection]:
        conn = self.checkout()
        failure: Optional[BaseException] = None
        try:
            yield conn
        except BaseException as err:
            failure = err
            raise
        finally:
            self.checkin(conn, failure)

    def checkout(self) -> psycopg.Connection:
        raise NotImplementedError

    def checkin(self, conn: psycopg.Connection, failure: Optional[BaseException] = None) -> None:
        raise NotImplementedError

    def turn(self, conn: psycopg.Connection) -> ContextManager[Any]:
        """Held while a call runs on `conn`: the statement on it is then the call's own (one to
        cancel when the call is interrupted). A connection lent to one call at a time needs none."""
        return contextlib.nullcontext()


class Connections(_Lending):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._conn: Optional[psycopg.Connection] = None
        self._lock = threading.Lock()
        self._turns: "weakref.WeakKeyDictionary[psycopg.Connection, threading.Lock]" = weakref.WeakKeyDictionary()

    def turn(self, conn: psycopg.Connection) -> ContextManager[Any]:
        """The client's one connection (no pool) is every thread's: calls on it take turns."""
        if self.pool is not None and not self.pinned:
            return contextlib.nullcontext()
        with self._lock:
            return self._turns.setdefault(conn, threading.Lock())

    def checkout(self) -> psycopg.Connection:
        if self.pool is not None and not self.pinned:
            with connecting():
                return self.pool.getconn()
        return self._current_or_new()

    def checkin(self, conn: psycopg.Connection, failure: Optional[BaseException] = None) -> None:
        """Done with `conn`, after `failure` if the call failed."""
        if self.pool is not None and not self.pinned:
            self.pool.putconn(conn)
            return
        # A standby (25006, as after a failover) is left for a new connection, which a multi-host
        # conninfo with target_session_attrs=read-write sends to the primary.
        if failure is not None and (conn.broken or sqlstate(failure) == READ_ONLY) and self.forget(conn):
            self.dispose(conn)

    def abandoned(self, conn: psycopg.Connection) -> None:
        """`conn` came back from a call given up on (out of time, interrupted), and is no longer
        handed out. The client's one connection may still be in other threads' hands: closed
        under its lock, never under a statement (a call that comes to it later finds it closed)."""
        if self.pool is not None and not self.pinned:
            self.pool.putconn(conn)
            return
        with conn.lock if self.pool is None else contextlib.nullcontext():
            self.dispose(conn)

    def current(self) -> Optional[psycopg.Connection]:
        return self._conn

    def forget(self, conn: psycopg.Connection) -> bool:
        """Stops handing out `conn`; True if it was the current one (the caller disposes of it)."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
                return True
            return False

    def dispose(self, conn: psycopg.Connection) -> None:
        if self.pool is None:
            with contextlib.suppress(Exception):
                conn.close()
            return
        if not conn.broken and not conn.closed:
            with contextlib.suppress(Exception):
                conn.execute("RESET statement_timeout")
                conn.autocommit = self._autocommit.pop(id(conn), conn.autocommit)
        self.pool.putconn(conn)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            self.dispose(conn)

    def _current_or_new(self) -> psycopg.Connection:
        with self._lock:
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                return conn
            self._conn = None
        if conn is not None:
            self.dispose(conn)
        conn = self._new()
        with self._lock:
            self._conn = conn
        return conn

    def _new(self) -> psycopg.Connection:
        with connecting():
            if self.pool is None:
                return psycopg.connect(self.conninfo, **self.kwargs)
            conn = self.pool.getconn()
        self._autocommit[id(conn)] = conn.autocommit
        conn.autocommit = True
        return conn


class Lanes(_Lending):
    """As aio_connections.AsyncLanes: a keeper's own connections, at most `size` in use at once,
    kept open and reused; a call past its limit gives up its slot at once."""

    def __init__(self, conninfo: str, size: int, **kwargs: Any):
        super().__init__(conninfo, None, pinned=True, **kwargs)
        self.size = size
        self._slots = threading.Semaphore(size)
        self._idle: List[psycopg.Connection] = []
        self._open: Set[psycopg.Connection] = set()
        self._lock = threading.Lock()
        self._shut = False
        #: Connections made since the keeper started: more than `size` only after a failure.
        self.made = 0
        self._opening = False

    def checkout(self) -> psycopg.Connection:
        self._slots.acquire()
        try:
            with self._lock:
                while self._idle:
                    conn = self._idle.pop()
                    if not conn.closed and not conn.broken:
                        return conn
                    self._open.discard(conn)
            with connecting():
                conn = psycopg.connect(self.conninfo, **self.kwargs)
            with self._lock:
                self.made += 1
                self._open.add(conn)
            return conn
        except BaseException:
            self._slots.release()
            raise

    def checkin(self, conn: psycopg.Connection, failure: Optional[BaseException] = None) -> None:
        unusable = failure is not None and (conn.broken or not isinstance(failure, Exception) or retryable(failure))
        # Decided and kept under one lock: a shut() in between would leave it idle and open.
        with self._lock:
            disposed = self._shut or unusable
            if not disposed:
                if conn.closed:
                    self._open.discard(conn)
                else:
                    self._idle.append(conn)
        if disposed:
            self.dispose(conn)
        self._slots.release()

    def open(self) -> None:
        """As AsyncLanes.open: the lanes' connections made now, once."""
        with self._lock:
            if self._opening:
                return
            self._opening = True
        for _ in range(self.size):
            try:
                with connecting():
                    conn = psycopg.connect(self.conninfo, **self.kwargs)
            except Exception:
                return
            with self._lock:
                self.made += 1
                self._open.add(conn)
                self._idle.append(conn)

    def current(self) -> Optional[psycopg.Connection]:
        return None

    def forget(self, conn: psycopg.Connection) -> bool:
        self._slots.release()
        # Those waiting idle may run over the same dead route: the next call makes a new one.
        with self._lock:
            stale, self._idle = self._idle, []
        for idle in stale:
            self.dispose(idle)
        return False

    def abandoned(self, conn: psycopg.Connection) -> None:
        self.dispose(conn)

    def sibling(self, pinned: bool = False) -> "Lanes":
        return self

    def close(self) -> None:
        pass

    def shut(self) -> None:
        """Closes the idle connections now; one a call is using is closed by the thread running
        that call, when it hands it back: libpq's connection must not be freed under a running
        command (closed from here, it crashed the process)."""
        with self._lock:
            self._shut = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self.dispose(conn)

    def dispose(self, conn: psycopg.Connection) -> None:
        with self._lock:
            self._open.discard(conn)
        with contextlib.suppress(Exception):
            conn.close()


def cancel(conn: Optional[psycopg.Connection]) -> None:
    """Asks the server to cancel the statement running on `conn` (a waiting acquire ends with
    57014, granting nothing), waiting CANCEL_TIMEOUT at most; from any thread."""
    if conn is not None and not conn.closed:
        with contextlib.suppress(Exception):
            conn.cancel_safe(timeout=CANCEL_TIMEOUT)


def in_transaction(conn: psycopg.Connection, call: Callable[[psycopg.Connection], T]) -> T:
    if conn.autocommit:
        return call(conn)
    with conn.transaction():
        return call(conn)


class _Workers:
    """Threads that run bounded calls, kept between calls: starting a thread per call would cost
    about as much as a round trip. A worker whose call ran out of time is left to it, not reused."""

    def __init__(self) -> None:
        self._idle: list = []
        self._lock = threading.Lock()

    def run(self, job: Callable[[], bool]) -> None:
        """`job` on a worker; it returns False when its worker is to take no more work."""
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
        if jobs is not None:
            jobs.put(job)
            return
        jobs = queue.SimpleQueue()
        jobs.put(job)
        threading.Thread(target=self._serve, args=(jobs,), name="pg_fence call", daemon=True).start()

    def _serve(self, jobs: "queue.SimpleQueue") -> None:
        while True:
            if not jobs.get()():
                return  # abandoned: the caller stopped waiting, so do not take more work
            with self._lock:
                self._idle.append(jobs)


_workers = _Workers()


class _Running:
    """A bounded call on a worker thread, and who hands its connection back: the caller, once the
    call has ended or if it never started; the worker, if the caller gave up on it meanwhile."""

    def __init__(self, connections: Connections, conn: psycopg.Connection, call: Callable[[psycopg.Connection], Any]):
        self.connections, self.conn, self.call = connections, conn, call
        self.lock = threading.Lock()
        self.done = threading.Event()
        #: "queued" (also while waiting its turn), "running" (its statement is the connection's),
        #: "ended"; or "withdrawn" (never to run), "abandoned" (the worker disposes of the
        #: connection once the call returns).
        self.state = "queued"
        self.settled = False
        self.value: Any = None
        self.error: Optional[BaseException] = None

    def run(self) -> bool:
        """On the worker: False if it was given up on, so that the worker takes no more work."""
        # Ended (and an abandoned connection disposed of) before the turn passes on: a cancel
        # sent while "running" must reach this call's statement, never the next one's.
        with self.connections.turn(self.conn):
            with self.lock:
                if self.state == "withdrawn":
                    return True
                self.state = "running"
            try:
                self.value = in_transaction(self.conn, self.call)
            except BaseException as err:
                self.error = err
            with self.lock:
                abandoned, self.state = self.state == "abandoned", "ended"
                self.done.set()
            if abandoned:
                self.connections.abandoned(self.conn)
        return not abandoned

    def stop(self, cancel_statement: bool) -> bool:
        """The caller is interrupted: a call not started yet never will be; a running one's
        statement is cancelled if asked, the call holding its turn meanwhile. True if cancelled."""
        with self.lock:
            if self.state == "queued":
                self.state = "withdrawn"
            cancelling = cancel_statement and self.state == "running"
            if cancelling:
                cancel(self.conn)
            return cancelling

    def settle(self) -> bool:
        """True if the call has ended (its outcome is the caller's). The connection is handed back
        then, or when the call never started; else it is the worker's. Once: later calls only
        answer."""
        with self.lock:
            if self.settled:
                return self.state == "ended"
            self.settled = True
            if self.state == "running":
                # Nobody may be handed it meanwhile: a pinned or kept one is replaced by a new one.
                self.state = "abandoned"
                self.connections.forget(self.conn)
                return False
            ended = self.state == "ended"
            if self.state == "queued":
                self.state = "withdrawn"
        self.connections.checkin(self.conn, self.error)
        return ended


def bounded(
    connections: Connections,
    call: Callable[[psycopg.Connection], T],
    limit: Optional[float],
    *,
    cancel_on_interrupt: bool = False,
) -> T:
    """`call` on a connection of `connections`, in its own transaction, given `limit` seconds
    (None: no limit). Past the limit, CallTimedOut; the connection is abandoned to the thread
    still running the call, which hands it back when the call returns. Interrupted
    (KeyboardInterrupt), the same, after cancelling the call's statement if `cancel_on_interrupt`
    (a waiting acquire's: cancelling a release would keep the lease to its TTL). A call not
    started yet never starts. asyncio's `bounded` cancels every interrupted call, as psycopg
    does."""
    if limit is None:
        with connections.use() as conn, connections.turn(conn):
            return in_transaction(conn, call)
    running = _Running(connections, connections.checkout(), call)
    try:
        _workers.run(running.run)
        running.done.wait(max(0.0, limit))
        ended = running.settle()
    except BaseException:
        # The call's connection must not be closed under its thread: the socket would soon be
        # another connection's, whose replies that thread would read, leaving the other waiting
        # for ever. Cancelled before it is given up on, since cancelling reads the connection,
        # which the worker may close once it is.
        try:
            if running.stop(cancel_statement=cancel_on_interrupt):
                running.done.wait(CANCEL_TIMEOUT)
        finally:
            running.settle()
        raise
    if not ended:
        raise CallTimedOut(f"no answer from the server within {limit:.1f} s")
    if running.error is not None:
        raise running.error
    return running.value

"""Where a client's connections come from (a conninfo, or a psycopg_pool pool) and their
settings, shared by the sync Connections (connections.py) and the asyncio ones (aio_connections.py)."""

from __future__ import annotations

from typing import Any, TypeVar

S = TypeVar("S", bound="Source")

APPLICATION_NAME = "pg_fence_client"

#: How long a cancel request may take: a stopped server answers nothing.
CANCEL_TIMEOUT = 2.0


def connect_kwargs(application_name: str, connect_timeout: float) -> dict:
    return {
        "autocommit": True,
        "application_name": application_name,
        "connect_timeout": max(1, int(round(connect_timeout))),
        # A connection whose peer vanished (a failover, a dead host) is noticed within seconds.
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


class Source:
    def __init__(
        self,
        conninfo: str = "",
        pool: Any = None,
        *,
        pinned: bool = False,
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
    ):
        self.conninfo = conninfo
        self.pool = pool
        self.pinned = pinned
        self.application_name, self.connect_timeout = application_name, connect_timeout
        self.kwargs = connect_kwargs(application_name, connect_timeout)
        self._autocommit: dict = {}

    def sibling(self: S, pinned: bool = False) -> S:
        """Connections of their own from the same source, with the same settings."""
        return type(self)(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

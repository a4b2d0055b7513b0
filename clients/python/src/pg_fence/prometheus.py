"""Prometheus metrics of a pg_fence client, with prometheus_client (`pip install 'pg-fence[prometheus]'`):

    from pg_fence import Client
    from pg_fence.prometheus import PrometheusObserver

    client = Client(conninfo, observer=PrometheusObserver())  # the default registry
    prometheus_client.start_http_server(9464)

Its metrics (`labels` add fixed labels to each, e.g. a client's name):

    pgfence_leases_kept                        gauge      kept leases held now
    pgfence_lease_losses_total{reason}         counter    kept leases lost while held, by reason (expired,
                                                          revoked, taken_over, session_ended, restarted,
                                                          unreachable, unknown)
    pgfence_acquire_duration_seconds{outcome}  histogram  acquires, retries and the wait included (granted,
                                                          refused, error)
    pgfence_renew_duration_seconds{outcome}    histogram  renewal calls of kept leases (ok, lost, error)
    pgfence_renew_leases                       histogram  kept leases renewed by one call (the keeper batches)
    pgfence_leader{election}                   gauge      1 while this client leads the election (the
                                                          elector's key), else 0

A lease's key is no label (keys are unbounded); an election's key is, since an application has a few."""

from __future__ import annotations

import threading
from typing import Any, Dict, Mapping, Optional, Sequence

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as err:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "pg_fence.prometheus needs prometheus_client, which is not installed: "
        "pip install 'pg-fence[prometheus]' (or prometheus_client itself)"
    ) from err

from .observer import ERROR, GRANTED, REFUSED, RENEW_ERROR, RENEW_LOST, RENEW_OK, Observer
from .reasons import EXPIRED, RESTARTED, REVOKED, SESSION_ENDED, TAKEN_OVER, UNKNOWN, UNREACHABLE

__all__ = ["PrometheusObserver"]

#: The duration histograms' buckets, in seconds, when not given: 5 ms to 10 s.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PrometheusObserver(Observer):
    """The client's Observer that keeps the metrics above in `registry` (prometheus_client's
    default one unless given); every reason and outcome starts at zero, so that a rate of zero
    shows as such. One per client: two in one registry would register the same names twice
    (ValueError), unless told apart by `labels` in a registry of their own."""

    def __init__(
        self,
        registry: Optional[CollectorRegistry] = REGISTRY,
        *,
        labels: Optional[Mapping[str, str]] = None,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ):
        names = list(labels or {})
        self._labels: Dict[str, str] = dict(labels or {})
        self.kept = Gauge("pgfence_leases_kept", "Kept leases held now.", names, registry=registry)
        self.losses = Counter(
            "pgfence_lease_losses", "Kept leases lost while held, by reason.", names + ["reason"], registry=registry
        )
        self.acquire = Histogram(
            "pgfence_acquire_duration_seconds",
            "Acquires, retries and the wait for the key included, by outcome.",
            names + ["outcome"],
            buckets=buckets,
            registry=registry,
        )
        self.renew = Histogram(
            "pgfence_renew_duration_seconds",
            "Renewal calls of kept leases, by outcome.",
            names + ["outcome"],
            buckets=buckets,
            registry=registry,
        )
        self.renewed = Histogram(
            "pgfence_renew_leases",
            "Kept leases renewed by one renewal call.",
            names,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=registry,
        )
        self.leader = Gauge(
            "pgfence_leader",
            "1 while this client leads the election (the elector's key), else 0.",
            names + ["election"],
            registry=registry,
        )
        self._leading: Dict[str, int] = {}
        self._lock = threading.Lock()
        self._kept().set(0)
        for reason in (EXPIRED, REVOKED, TAKEN_OVER, SESSION_ENDED, RESTARTED, UNREACHABLE, UNKNOWN):
            self._with(self.losses, reason=reason)
        for outcome in (GRANTED, REFUSED, ERROR):
            self._with(self.acquire, outcome=outcome)
        for outcome in (RENEW_OK, RENEW_LOST, RENEW_ERROR):
            self._with(self.renew, outcome=outcome)
        self._renewed()

    def _with(self, metric: Any, **more: str) -> Any:
        labels = {**self._labels, **more}
        return metric.labels(**labels) if labels else metric

    def _kept(self) -> Any:
        return self._with(self.kept)

    def _renewed(self) -> Any:
        return self._with(self.renewed)

    def acquire_finished(self, seconds: float, outcome: str) -> None:
        self._with(self.acquire, outcome=outcome).observe(seconds)

    def renew_finished(self, seconds: float, outcome: str, leases: int) -> None:
        self._with(self.renew, outcome=outcome).observe(seconds)
        self._renewed().observe(leases)

    def kept_lease_started(self, lease: Any) -> None:
        self._kept().inc()

    def kept_lease_ended(self, lease: Any) -> None:
        self._kept().dec()

    def lease_lost(self, lease: Any, reason: str) -> None:
        self._with(self.losses, reason=reason).inc()

    def leadership_gained(self, election: str) -> None:
        with self._lock:
            self._leading[election] = self._leading.get(election, 0) + 1
            self._with(self.leader, election=election).set(1)

    def leadership_lost(self, election: str) -> None:
        with self._lock:
            left = max(0, self._leading.get(election, 0) - 1)
            self._leading[election] = left
            if left == 0:
                self._with(self.leader, election=election).set(0)

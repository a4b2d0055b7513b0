"""The metered worker example (examples/metered_worker.py), two instances in processes of their own
against a real server: their metrics scraped over HTTP tell the kept lease, its renewals, the
second instance refused, and the loss when the lease is revoked."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, Tuple

import pytest
from conftest import Cluster

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "metered_worker.py"
KEY = "worker:metered"


@pytest.fixture(scope="module")
def worker_cluster() -> Iterator[Cluster]:
    cluster = Cluster("metered_worker", 27624).create()
    yield cluster
    cluster.destroy()


Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), -1.0)


def until(port: int, what: str, check: Callable[[Samples], bool], limit: float = 30.0) -> Samples:
    """Scrapes until `check` holds (a bound on a hang: the machine may be loaded)."""
    end = time.monotonic() + limit
    while True:
        try:
            samples = scrape(port)
        except OSError:
            samples = {}  # not serving yet
        if check(samples):
            return samples
        assert time.monotonic() < end, f"not within {limit} s: {what}: {samples}"
        time.sleep(0.05)


def start(cluster: Cluster, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--conninfo", cluster.conninfo, "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_the_workers_metrics_tell_its_lease_its_renewals_and_its_loss(worker_cluster):
    first = start(worker_cluster, 27625)
    try:
        samples = until(
            27625,
            "a renewal of the kept lease",
            lambda s: sample(s, "pgfence_renew_duration_seconds_count", outcome="ok") >= 1,
        )
        assert sample(samples, "pgfence_leases_kept") == 1
        assert sample(samples, "pgfence_acquire_duration_seconds_count", outcome="granted") == 1
        assert sample(samples, "pgfence_lease_losses_total", reason="revoked") == 0
        second = start(worker_cluster, 27626)
        try:
            refused = until(
                27626,
                "the second worker refused the key",
                lambda s: sample(s, "pgfence_acquire_duration_seconds_count", outcome="refused") >= 1,
            )
            assert sample(refused, "pgfence_leases_kept") == 0
            worker_cluster.sql("SELECT fence.lease_revoke(%s)", (KEY,))
            until(
                27625,
                "the revoked lease counted as lost",
                lambda s: sample(s, "pgfence_lease_losses_total", reason="revoked") == 1,
            )
            # One of the two holds the key again: kept leases add up to one.
            end = time.monotonic() + 30
            while sample(scrape(27625), "pgfence_leases_kept") + sample(scrape(27626), "pgfence_leases_kept") != 1:
                assert time.monotonic() < end, "no worker holds the key again"
                time.sleep(0.05)
        finally:
            stop(second)
    finally:
        stop(first)
    assert first.returncode == 0

"""A real Prometheus (Debian's ``prometheus`` package) on a free loopback port, for the
tier's tests: started with a config and rule files written by the test, queried
through its HTTP API (https://prometheus.io/docs/prometheus/latest/querying/api/)."""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from processes import poll, stop
from redisd import free_port


def binary(name: str) -> str:
    """``prometheus`` or ``promtool`` from PATH (installed by the tier's set-up)."""
    found = shutil.which(name)
    assert found, f"{name} is not installed: `make test-prometheus` installs Debian's prometheus package"
    return found


@dataclass
class Prometheus:
    url: str

    def api(self, path: str, **params: Any) -> Any:
        """``GET /api/v1/PATH``: the ``data`` of a successful answer; AssertionError
        with Prometheus's error otherwise."""
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert body.get("status") == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now: the result vector (``[{metric, value: [t, "v"]}]``)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def values(self, expr: str) -> list[float]:
        """The finite sample values of an instant query now."""
        out = [float(sample["value"][1]) for sample in self.query(expr)]
        return [v for v in out if math.isfinite(v)]

    def scraped(self, job: str) -> bool:
        """Every target of ``job`` has been scraped successfully at least once."""
        targets = [t for t in self.api("targets")["activeTargets"] if t["labels"].get("job") == job]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def alerts(self) -> dict[str, set[str]]:
        """Alert name -> states (``pending``, ``firing``) of its active alerts."""
        out: dict[str, set[str]] = {}
        for alert in self.api("alerts")["alerts"]:
            out.setdefault(alert["labels"]["alertname"], set()).add(alert["state"])
        return out


@contextlib.contextmanager
def prometheus(config: Path, data_dir: Path) -> Iterator[Prometheus]:
    """Run Prometheus with ``config`` (its rule files already in place) until the block
    ends; yields once it answers ``/-/ready``."""
    port = free_port()
    log = (data_dir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={data_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(url=f"http://127.0.0.1:{port}")

    def ready() -> bool:
        assert process.poll() is None, (data_dir / "prometheus.log").read_text()[-2000:]
        try:
            return httpx.get(server.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(ready, timeout=60, what="Prometheus to be ready")
        yield server
    finally:
        stop(process, timeout=20)
        log.close()

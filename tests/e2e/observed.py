"""A cluster of real processes whose every service and agent serves ``/metrics`` on a loopback
port, and a scraper that parses what they answer with prometheus-client's own parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cairn.local.servers import free_port
from tests.e2e.harness import Cluster

SERVICES = ("relay", "searcher", "scheduler", "tracker")


@dataclass(frozen=True)
class Sample:
    """One sample of a scrape."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    """The samples of one scrape of ``/metrics``."""

    samples: list[Sample]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the sample ``name`` with exactly these labels among its own (or None)."""
        for sample in self.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
        return None

    def names(self) -> set[str]:
        """Every sample name scraped."""
        return {sample.name for sample in self.samples}

    def label_values(self) -> set[str]:
        """Every label value of every sample."""
        return {value for sample in self.samples for value in sample.labels.values()}


def parse(text: str) -> Scrape:
    """Parses Prometheus's text format (raises on anything the format refuses)."""
    samples = [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    return Scrape(samples)


@dataclass
class ObservedCluster(Cluster):
    """Every service as a process, each with ``--metrics-address 127.0.0.1:<port>``."""

    metrics_ports: dict[str, int] = field(default_factory=dict)

    def start_observed(self, name: str, module: str, *args: str) -> Any:
        """Starts ``name`` serving its metrics on a port of its own (kept across restarts)."""
        port = self.metrics_ports.setdefault(name, free_port())
        return self.start(name, module, *args, "--metrics-address", f"127.0.0.1:{port}")

    def start_all(self, *, slots: int = 2, agent_timeout: float = 15.0) -> None:
        """Relay, searcher, scheduler, tracker, API and agent ``agent-a``, all observed."""
        self.start_observed("relay", "services.relay")
        self.start_observed("searcher", "services.searcher")
        self.start_observed(
            "scheduler", "services.scheduler", "--agent-timeout", str(agent_timeout)
        )
        self.start_observed(
            "tracker", "services.tracker", "--checkpoint-root", str(self.workdir / "checkpoints")
        )
        self.start("api", "services.api", "--port", str(self.api_port))
        self.start_agent("agent-a", slots)

    def start_agent(self, agent_id: str, slots: int, *args: str) -> Any:
        port = self.metrics_ports.setdefault(agent_id, free_port())
        return super().start_agent(agent_id, slots, "--metrics-address", f"127.0.0.1:{port}", *args)

    def url(self, name: str, path: str) -> str:
        """``path`` on ``name``'s listener (the API's own port for ``api``)."""
        if name == "api":
            return f"{self.api_url}{path}"
        return f"http://127.0.0.1:{self.metrics_ports[name]}{path}"

    async def get(self, name: str, path: str, token: str | None = None) -> tuple[int, str]:
        """GETs ``path`` of ``name``; the status and the body (a refused connection is 0)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(self.url(name, path), headers=headers) as resp,
            ):
                return resp.status, await resp.text()
        except aiohttp.ClientError:
            return 0, ""

    async def scrape(self, name: str) -> Scrape:
        """``/metrics`` of ``name`` parsed (the API's with the admin's token)."""
        status, text = await self.get(name, "/metrics", self.token if name == "api" else None)
        assert status == 200, (name, status, text[:500])
        return parse(text)

    async def ready(self, name: str) -> bool:
        """Whether ``name``'s ``/readyz`` answers 200."""
        status, _ = await self.get(name, "/readyz")
        return status == 200

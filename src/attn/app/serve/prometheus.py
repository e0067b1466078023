"""The server's Prometheus metrics (GET /metrics), in a registry of their own per app."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServeMetrics:
    """attn_requests_total, attn_requests_in_flight, attn_queue_length, attn_batch_size,
    attn_request_latency_seconds and attn_time_to_first_token_seconds (docs/serve-api.md)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("attn_requests", "Requests answered, by route, model and HTTP status",
                                ["route", "model", "status"], registry=self.registry)
        self.in_flight = Gauge("attn_requests_in_flight", "Requests being answered (a stream until its last byte; "
                               "/health and /metrics not counted), by route", ["route"], registry=self.registry)
        self.queue_length = Gauge("attn_queue_length", "Jobs waiting or running, by model", ["model"],
                                  registry=self.registry)
        self.batch_size = Histogram("attn_batch_size", "Requests decoded together, by model and route",
                                    ["model", "route"], buckets=_BATCH_BUCKETS, registry=self.registry)
        self.latency = Histogram("attn_request_latency_seconds", "Time from request to the end of its answer",
                                 ["route", "model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.first_token = Histogram("attn_time_to_first_token_seconds", "Time from request to its first token",
                                     ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)

    def text(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

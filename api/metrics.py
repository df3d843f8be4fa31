"""The gateway's Prometheus metrics: requests by endpoint and status class, 401s, 503s by cause.

Counted by :class:`api.access.AccessLog` (one count per HTTP request, when its response has been
sent) and where the API refuses.  The domain's own metrics (429s by limit, store errors, fail-open
periods, the usage journal's) are in :mod:`keys.metrics`; the engine's in
:mod:`inference.metrics`; ``completions_site/metrics.py`` serves them all on ``GET /metrics``.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# The paths a label may name: a label per URL would let clients grow the metrics without bound.
ENDPOINTS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/v1/usage/completions",
    "/healthz",
    "/metrics",
)

http_requests = Counter(
    "completions_http_requests",
    "HTTP requests answered, by endpoint (one of the API's routes, /v1/models/{model}, /v1/organization "
    "for the Administration API, /v1/other for unknown /v1 paths, or site for the admin and pages) and "
    "status class (2xx, 4xx, ...).",
    ["endpoint", "status_class"],
)
http_request_duration = Histogram(
    "completions_http_request_duration_seconds",
    "From the request's arrival until its response's last byte, by endpoint (streams included).",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
unauthorized = Counter(
    "completions_http_unauthorized",
    "Requests answered 401 (a missing, unknown, revoked or expired key).",
)
draining_refused = Counter(
    "completions_http_draining_refused",
    "API requests refused with 503 server_shutting_down because the process was draining (SIGTERM): "
    "a deploy or restart, not a fault; they are in completions_http_requests_total's 5xx too.",
)

unavailable = Counter(
    "completions_http_unavailable",
    "API requests refused with 503 because a store they need failed, by cause: database (it does not "
    "answer) or journal (the usage journal cannot be written).",
    ["cause"],
)


def endpoint_label(path: str) -> str:
    """The ``endpoint`` label of a request path (no query string)."""
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/v1/organization/"):
        return "/v1/organization"  # the Administration API, one label (its paths hold ids)
    if path.startswith("/v1/"):
        return "/v1/other"
    return "site"


def count_request(path: str, status: int, seconds: float) -> None:
    """Count one answered request: its endpoint, status class and duration."""
    endpoint = endpoint_label(path)
    http_requests.labels(endpoint=endpoint, status_class=f"{status // 100}xx").inc()
    http_request_duration.labels(endpoint=endpoint).observe(seconds)
    if status == 401:
        unauthorized.inc()

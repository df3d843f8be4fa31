"""The engine's Prometheus metrics, named as vLLM names its own with our prefix ``completions_``.

vLLM's ``vllm:num_requests_running`` is our ``completions_num_requests_running``, and so on
(vLLM's docs, "Production Metrics"; llama.cpp's server exports the same quantities as
``llamacpp:*``), so an existing dashboard translates by its prefix.  The objects live in this
module, which imports ``prometheus_client`` only (no HTTP, no Django): the engine's worker thread
updates them, and the HTTP side (``completions_site/metrics.py``) exposes the registry.

Cost: the worker updates them once per step (gauges set, one counter ``inc`` by the step's token
count, one histogram observation of the step's duration) and once per request at its first
token and at its end, never per token: a few microseconds against a decode step of tens of
milliseconds (``bench/metrics_cost.py`` measures it).

Every metric carries the ``model_name`` label (vLLM's), the id of the model whose engine counted
it: a process serving several models (``MODELS_CONFIG``) has one engine per model, each updating its
own children (:class:`EngineMetrics`, bound once when the engine is made).

Several server processes (daphne behind a proxy) write their values to files under
``PROMETHEUS_MULTIPROC_DIR`` when that is set before the process starts (prometheus_client's
multiprocess mode); the gauges then add up over live processes (``livesum``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PREFIX = "completions_"

# vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

requests_running = Gauge(
    PREFIX + "num_requests_running",
    "Requests with sequences in the running batch (vLLM: num_requests_running).",
    ["model_name"],
    multiprocess_mode="livesum",
)
requests_waiting = Gauge(
    PREFIX + "num_requests_waiting",
    "Requests queued or being prefilled, not yet in the batch (vLLM: num_requests_waiting).",
    ["model_name"],
    multiprocess_mode="livesum",
)
kv_cache_columns = Gauge(
    PREFIX + "kv_cache_columns_in_use",
    "KV cache positions held by running sequences: the sum of their lengths in tokens.",
    ["model_name"],
    multiprocess_mode="livesum",
)
prompt_tokens = Counter(
    PREFIX + "prompt_tokens", "Prompt tokens prefilled (vLLM: prompt_tokens_total).", ["model_name"]
)
prefix_cache_queries = Counter(
    PREFIX + "prefix_cache_queries",
    "Prompt tokens looked up in the prefix cache (vLLM: prefix_cache_queries_total).",
    ["model_name"],
)
prefix_cache_hits = Counter(
    PREFIX + "prefix_cache_hits",
    "Prompt tokens found in the prefix cache and not prefilled again (vLLM: prefix_cache_hits_total).",
    ["model_name"],
)
generation_tokens = Counter(
    PREFIX + "generation_tokens",
    "Tokens sampled, end-of-sequence and stop-cut tokens included (vLLM: generation_tokens_total).",
    ["model_name"],
)
time_to_first_token = Histogram(
    PREFIX + "time_to_first_token_seconds",
    "From submission to the engine until a request's first token is sampled.",
    ["model_name"],
    buckets=TTFT_BUCKETS,
)
time_per_output_token = Histogram(
    PREFIX + "time_per_output_token_seconds",
    "A finished request's mean time between tokens after the first: (end - first token) / (tokens - 1).",
    ["model_name"],
    buckets=TPOT_BUCKETS,
)
e2e_request_latency = Histogram(
    PREFIX + "e2e_request_latency_seconds",
    "From submission to the engine until the request finished (in the engine).",
    ["model_name"],
    buckets=REQUEST_BUCKETS,
)
request_queue_time = Histogram(
    PREFIX + "request_queue_time_seconds",
    "From submission until the request's first prefill step.",
    ["model_name"],
    buckets=QUEUE_BUCKETS,
)
request_success = Counter(
    PREFIX + "request_success",
    "Engine requests finished, once each (vLLM: request_success_total), by finish_reason: the first "
    "candidate's stop or length, abort (its client left), or error (failed by an engine error or the "
    "shutdown).",
    ["model_name", "finish_reason"],
)
prefill_step_duration = Histogram(
    PREFIX + "prefill_step_duration_seconds",
    "Duration of one prefill step (the scheduler's chunks in one forward pass).",
    ["model_name"],
    buckets=STEP_BUCKETS,
)
decode_step_duration = Histogram(
    PREFIX + "decode_step_duration_seconds",
    "Duration of one decode step (forward pass, sampling and output for the whole batch).",
    ["model_name"],
    buckets=STEP_BUCKETS,
)

FINISH_REASONS = ("stop", "length", "abort", "error")


class EngineMetrics:
    """One engine's children of the metrics above, labelled with its ``model_name`` and bound once
    (``labels()`` per event would cost a dict lookup and a lock)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        label = {"model_name": model_name}
        self.requests_running = requests_running.labels(**label)
        self.requests_waiting = requests_waiting.labels(**label)
        self.kv_cache_columns = kv_cache_columns.labels(**label)
        self.prompt_tokens = prompt_tokens.labels(**label)
        self.prefix_cache_queries = prefix_cache_queries.labels(**label)
        self.prefix_cache_hits = prefix_cache_hits.labels(**label)
        self.generation_tokens = generation_tokens.labels(**label)
        self.time_to_first_token = time_to_first_token.labels(**label)
        self.time_per_output_token = time_per_output_token.labels(**label)
        self.e2e_request_latency = e2e_request_latency.labels(**label)
        self.request_queue_time = request_queue_time.labels(**label)
        self.prefill_step_duration = prefill_step_duration.labels(**label)
        self.decode_step_duration = decode_step_duration.labels(**label)
        self._finished = {reason: request_success.labels(finish_reason=reason, **label) for reason in FINISH_REASONS}

    def finished(self, reason: str | None, count: int = 1) -> None:
        """Count ``count`` requests finished with ``reason`` (``None`` counts as ``abort``)."""
        child = self._finished.get(reason or "abort")
        if child is None:
            child = self._finished[reason or "abort"] = request_success.labels(
                model_name=self.model_name, finish_reason=reason
            )
        child.inc(count)

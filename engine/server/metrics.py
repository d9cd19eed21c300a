"""Prometheus metrics of the server, under vLLM's names (``vllm:...``), so dashboards and
autoscalers written for vLLM read them unchanged.

Request latencies are observed in the frontend (when a token reaches the request's stream),
but for the inter-token latency, observed as vLLM does: once per engine step and request after
its first token, on the engine's clock (``step_stats``), so its count does not fall when the
frontend falls behind and reads several steps' tokens at once. Engine state (running/waiting,
KV-cache usage, prefix-cache hits, preemptions) is set by the engine thread after each step.
prometheus-client's metrics are thread-safe.

What vLLM has no metric for is named ``replayllm:...`` (so no vLLM dashboard misreads it): the
frontend's tokenizing pool (``engine.server.prompt``), read when scraped.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's buckets for request latencies (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """The server's metrics in their own registry, labelled with the served model's name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets)

        self._ttft = histogram("vllm:time_to_first_token_seconds",
                               "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self._itl = histogram("vllm:inter_token_latency_seconds",
                              "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self._tpot = histogram("vllm:request_time_per_output_token_seconds",
                               "Histogram of time_per_output_token_seconds per request.",
                               ITL_BUCKETS)
        self._e2e = histogram("vllm:e2e_request_latency_seconds",
                              "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        self._queue = histogram("vllm:request_queue_time_seconds",
                                "Histogram of time spent in WAITING phase for request.",
                                REQUEST_BUCKETS)
        self._running = Gauge("vllm:num_requests_running",
                              "Number of requests in model execution batches.", labels,
                              registry=r)
        self._waiting = Gauge("vllm:num_requests_waiting",
                              "Number of requests waiting to be processed.", labels, registry=r)
        self._kv_usage = Gauge("vllm:kv_cache_usage_perc",
                               "KV-cache usage. 1 means 100 percent usage.", labels, registry=r)
        self._prefix_queries = Counter("vllm:prefix_cache_queries",
                                       "Prefix cache queries, in terms of number of queried "
                                       "tokens.", labels, registry=r)
        self._prefix_hits = Counter("vllm:prefix_cache_hits",
                                    "Prefix cache hits, in terms of number of cached tokens.",
                                    labels, registry=r)
        self._preemptions = Counter("vllm:num_preemptions",
                                    "Cumulative number of preemption from the engine.", labels,
                                    registry=r)
        self._prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                      labels, registry=r)
        self._generation_tokens = Counter("vllm:generation_tokens",
                                          "Number of generation tokens processed.", labels,
                                          registry=r)
        self._success = Counter("vllm:request_success", "Count of successfully processed "
                                "requests.", [*labels, "finished_reason"], registry=r)
        self._pool_prompts = Gauge("replayllm:num_prompts_in_tokenizer_pool",
                                   "Long prompts waiting for or being tokenized in the "
                                   "frontend's thread pool.", labels, registry=r)
        self._pool_chars = Gauge("replayllm:num_prompt_chars_in_tokenizer_pool",
                                 "Characters of the prompts in the frontend's tokenizer pool.",
                                 labels, registry=r)
        self.model_name = model_name
        m = model_name
        self.ttft, self.itl, self.tpot = self._ttft.labels(m), self._itl.labels(m), \
            self._tpot.labels(m)
        self.e2e, self.queue = self._e2e.labels(m), self._queue.labels(m)
        self.running, self.waiting = self._running.labels(m), self._waiting.labels(m)
        self.kv_usage = self._kv_usage.labels(m)
        self.prefix_queries, self.prefix_hits = self._prefix_queries.labels(m), \
            self._prefix_hits.labels(m)
        self.preemptions = self._preemptions.labels(m)
        self.prompt_tokens = self._prompt_tokens.labels(m)
        self.generation_tokens = self._generation_tokens.labels(m)

    def watch_prompt_pool(self, prompts: Callable[[], float],
                          chars: Callable[[], float]) -> None:
        """Read the tokenizer pool's prompts and characters (``PromptPreparer.in_pool``,
        ``in_pool_chars``) from these whenever the metrics are rendered."""
        self._pool_prompts.labels(self.model_name).set_function(prompts)
        self._pool_chars.labels(self.model_name).set_function(chars)

    def finished(self, reason: str) -> None:
        """A request completed with an OpenAI finish reason (``stop``, ``length``, ``abort``)."""
        self._success.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

"""Read vLLM's Prometheus `/metrics`: the counters and gauges that explain a trial (its latency histograms:
`histograms`)."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

# servetune name -> vLLM sample name (summed over labels, e.g. over engines)
SAMPLES = {
    "num_preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
}
COUNTERS = ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens")


def parse(text: str) -> dict[str, float]:
    """The SAMPLES found in a Prometheus text exposition, each summed over its label sets."""
    wanted = {v: k for k, v in SAMPLES.items()}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = wanted.get(sample.name)
            if name is not None:
                out[name] = out.get(name, 0.0) + sample.value
    return out


def metrics_text(base_url: str, timeout_s: float = 10.0) -> str:
    """The Prometheus text exposition at `base_url/metrics` (an httpx error when it cannot be read)."""
    response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    return response.text


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The SAMPLES now, from `base_url/metrics`; httpx.HTTPError when it does not answer, or (DecodingError) answers
    something other than Prometheus text: a server that is not vLLM."""
    text = metrics_text(base_url, timeout_s)
    try:
        return parse(text)
    except ValueError as e:
        raise httpx.DecodingError(f"/metrics is not Prometheus text: {e}"[:200]) from None


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What happened between two scrapes: counter increases, and the gauges as they were after."""
    out = {k: after[k] for k in after if k not in COUNTERS}
    out.update({k: after[k] - before.get(k, 0.0) for k in COUNTERS if k in after})
    if out.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0.0) / out["prefix_cache_queries"]
    return out

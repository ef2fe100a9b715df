"""One measured load level: send the requests, derive the metrics, and note what the server counted."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from servetune.engine import scrape
from servetune.errors import ServetuneError
from servetune.loadgen import LoadResult, RequestRecord, Target, run_load_sync
from servetune.metrics import LevelMetrics, summarize
from servetune.workload import RequestSpec


# The default request timeout: a server that spent it on nothing but this level's whole workload at this slow
# a speed would still have answered; a hung server fails each request after it, not after a fixed 600 s.
STALL_FLOOR_S = 30.0
SLOW_TOKENS_PER_S = 1000.0


def default_request_timeout_s(requests: Sequence[RequestSpec]) -> float:
    """Seconds without a byte after which a request of this level fails as `timeout`: STALL_FLOOR_S plus
    every prompt and output token of the level at SLOW_TOKENS_PER_S."""
    return STALL_FLOOR_S + sum(r.prompt_len + r.output_len for r in requests) / SLOW_TOKENS_PER_S


class ServerUnreachable(ServetuneError):
    """The server does not answer, or does not serve the model asked for."""


@dataclass
class LevelResult:
    """A load level's raw records, its metrics, and the server's counters over it (None if unscraped)."""

    load: LoadResult
    metrics: LevelMetrics
    server: dict | None


def check_server(target: Target, timeout_s: float = 10.0) -> None:
    """Raise ServerUnreachable with one clear line unless the server answers and serves `target.model`."""
    try:
        response = httpx.get(target.base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ServerUnreachable(f"cannot reach an OpenAI-compatible server at {target.base_url}: {e}") from None
    try:
        listing = response.json()
    except ValueError as e:  # not JSON: not an OpenAI-compatible server
        raise ServerUnreachable(f"{target.base_url}/v1/models did not answer JSON: {e}") from None
    served = [m["id"] for m in listing.get("data", [])]
    if target.model not in served:
        raise ServerUnreachable(f"{target.base_url} does not serve model {target.model!r}; it serves {served}")


def _scrape(base_url: str) -> dict | None:
    try:
        return scrape.scrape(base_url)
    except httpx.HTTPError:
        return None


def measure_level(
    target: Target,
    requests: Sequence[RequestSpec],
    *,
    request_rate: float,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    warmup_requests: int = 0,
    seed: int = 0,
    goodput_slo: Mapping[str, float] | None = None,
    request_timeout_s: float | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[Sequence[RequestRecord]], bool] | None = None,
) -> LevelResult:
    """Run one level against `target` and summarise it; /metrics is scraped before and after. A request
    fails as `timeout` after `request_timeout_s` without a byte (default: `default_request_timeout_s`)."""
    before = _scrape(target.base_url)
    load = run_load_sync(
        target, requests, request_rate=request_rate, burstiness=burstiness, max_concurrency=max_concurrency,
        warmup_requests=warmup_requests, seed=seed, on_record=on_record, should_stop=should_stop,
        request_timeout_s=request_timeout_s or default_request_timeout_s(requests),
    )
    after = _scrape(target.base_url)
    server = scrape.delta(before, after) if before is not None and after is not None else None
    return LevelResult(load, summarize(load, goodput_slo), server)

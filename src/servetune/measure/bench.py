"""One measured load level: send the requests, derive the metrics, and note what the server counted."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from servetune.engine import scrape
from servetune.errors import ServetuneError
from servetune.loadgen import LoadResult, LoadShape, RequestRecord, Target, run_load_sync
from servetune.measure.metrics import LevelMetrics, summarize
from servetune.measure.slo import good_request
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


def check_server(target: Target, timeout_s: float = 10.0) -> int | None:
    """Raise ServerUnreachable with one clear line unless the server answers and serves `target.model`.
    Returns the model's max-model-len as `/v1/models` lists it (vLLM's `max_model_len`), None when not listed."""
    try:
        response = httpx.get(target.base_url.rstrip("/") + "/v1/models", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ServerUnreachable(f"cannot reach an OpenAI-compatible server at {target.base_url}: {e}") from None
    try:
        listing = response.json()
    except ValueError as e:  # not JSON: not an OpenAI-compatible server
        raise ServerUnreachable(f"{target.base_url}/v1/models did not answer JSON: {e}") from None
    served = {m["id"]: m.get("max_model_len") for m in listing.get("data", [])}
    if target.model not in served:
        raise ServerUnreachable(f"{target.base_url} does not serve model {target.model!r}; it serves {list(served)}")
    return served[target.model] if isinstance(served[target.model], int) else None


def launch_model_len(model: str, engine_args: Mapping[str, object]) -> int | None:
    """The max-model-len a server launched with `engine_args` gets: the `max_model_len` engine arg, else the
    model's context (config.json's max_position_embeddings, as `tune` reads it); None when not known before
    launching (a value such as "8k" is vLLM's to read; the served one is checked once the server is up)."""
    from servetune.engine.memory import ModelShape

    given = engine_args.get("max_model_len")
    if given is not None:
        return given if isinstance(given, int) and not isinstance(given, bool) else None
    try:
        return ModelShape.from_path(model).max_position_embeddings
    except (OSError, ValueError, KeyError):
        return None


def check_context(requests: Sequence[RequestSpec], model_len: int | None, server: str) -> None:
    """Raise ServetuneError, before any request is sent, when a request needs more than `model_len` (the
    server's max-model-len; None: unknown, nothing checked), as `tune` refuses such a workload: vLLM would
    refuse it (HTTP 400) or cut its reply short. A request's need is its `min_model_len` (`workload.fit`)."""
    over = [r for r in requests if r.min_model_len > (model_len or float("inf"))]
    if over:
        longest = max(over, key=lambda r: r.min_model_len)
        raise ServetuneError(
            f"{len(over)} of {len(requests)} requests are longer than the max-model-len of {server} ({model_len}"
            f" tokens): the longest ({longest.prompt_len} prompt + {longest.output_len} output tokens) needs "
            f"{longest.min_model_len}; vLLM would refuse them or cut their replies short: shorten the workload")


def _scrape(base_url: str) -> dict | None:
    try:
        return scrape.scrape(base_url)
    except httpx.HTTPError:
        return None


def measure_level(
    target: Target,
    requests: Sequence[RequestSpec],
    shape: LoadShape,
    goodput_slo: Mapping[str, float] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    should_stop: Callable[[Sequence[RequestRecord]], bool] | None = None,
) -> LevelResult:
    """Run one level against `target` in the load's `shape` and summarise it; /metrics is scraped before and
    after. A request fails as `timeout` after the shape's request timeout without a byte (default:
    `default_request_timeout_s`)."""
    before = _scrape(target.base_url)
    timeout_s = shape.request_timeout_s or default_request_timeout_s(requests)
    load = run_load_sync(target, requests, replace(shape, request_timeout_s=timeout_s), on_record, should_stop)
    after = _scrape(target.base_url)
    server = scrape.delta(before, after) if before is not None and after is not None else None
    return LevelResult(load, summarize(load, good_request(goodput_slo) if goodput_slo else None), server)

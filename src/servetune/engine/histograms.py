"""The server's own latency histograms from vLLM's Prometheus `/metrics`, and quantiles estimated from them.

vLLM times every request itself and counts each time into cumulative buckets: TTFT from the request's arrival at
its engine (after the API server has read and tokenized it) to the step that made the first token, TPOT per
request, ITL per decode step, E2EL to the last token, and the time queued (WAITING). A quantile is estimated as
Prometheus's `histogram_quantile` does: the bucket that holds rank q x count, linear inside it (from 0 in the first
bucket). It is only as fine as the buckets (vLLM 0.32's TTFT buckets near a second are 0.75, 1, 2.5 and 5 s), so
each estimate also carries the bucket that the sample quantile of the same requests must lie in.
"""

import math

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict

from servetune.engine.scrape import metrics_text

# servetune's name -> vLLM's histogram families, the first one exposed wins (before vLLM 0.11 the per-step ITL was
# `time_per_output_token_seconds`, and the per-request TPOT histogram did not exist)
FAMILIES: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2el": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
# What a client may see beyond the server's clock (`Quantile.holds`): the API server's HTTP, tokenizing and streaming,
# and the client's own path; on the 2-core VM a client's mean TTFT is the server's + 2.3 to 5.7 ms
# (docs/results/verify-clients.md, bench-vs-vllm.md)
CLIENT_SLACK_MS = 10.0
CLIENT_SLACK = 0.10  # ... or this fraction of the value, whichever is more


class Quantile(BaseModel):
    """A quantile of a histogram, in ms: `estimate_ms` (linear inside its bucket), and the range [`low_ms`,
    `high_ms`] of the buckets where the sample quantile of the counted times must lie (`high_ms` None: above the
    last finite bound, where `estimate_ms` is that bound)."""

    model_config = ConfigDict(frozen=True)

    estimate_ms: float
    low_ms: float
    high_ms: float | None

    def span(self) -> str:
        """Where the quantile lies, e.g. "100-250 ms" or "over 5,000 ms"."""
        if self.high_ms is None:
            return f"over {self.low_ms:,.0f} ms"
        return f"{self.low_ms:,.0f}-{self.high_ms:,.0f} ms"

    def holds(self, value_ms: float) -> bool:
        """Whether a client's value of this quantile could be the server's: inside its range, each end widened by
        CLIENT_SLACK_MS or CLIENT_SLACK of it, whichever is more."""
        high = math.inf if self.high_ms is None else self.high_ms
        return (self.low_ms - max(CLIENT_SLACK_MS, CLIENT_SLACK * self.low_ms) <= value_ms
                <= high + max(CLIENT_SLACK_MS, CLIENT_SLACK * high))


class Histogram(BaseModel):
    """One histogram family summed over its label sets: the cumulative count of times at or below each finite
    upper bound (seconds, ascending), the count of all, and their sum."""

    model_config = ConfigDict(frozen=True)

    family: str
    bounds_s: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    sum_s: float

    def since(self, before: "Histogram") -> "Histogram":
        """What was counted after `before` (a ValueError when the two have different buckets)."""
        if (before.family, before.bounds_s) != (self.family, self.bounds_s):
            raise ValueError(f"{self.family}: its buckets changed between two scrapes")
        return self.model_copy(update={
            "cumulative": tuple(a - b for a, b in zip(self.cumulative, before.cumulative, strict=True)),
            "count": self.count - before.count, "sum_s": self.sum_s - before.sum_s})

    @property
    def mean_ms(self) -> float | None:
        return 1000 * self.sum_s / self.count if self.count else None

    def quantile(self, q: float) -> Quantile | None:
        """The `q` quantile (0 < q < 1) of the times counted; None when none were. The range holds the order
        statistics a sample quantile interpolates between (ranks floor and ceil of q x (count - 1), as numpy's
        and both clients' percentiles do)."""
        if not self.count or not self.bounds_s:
            return None
        position = q * (self.count - 1)
        low, high = self._bucket(math.floor(position) + 1), self._bucket(math.ceil(position) + 1)
        rank = q * self.count
        at = self._bucket(rank)
        if at == len(self.bounds_s):
            estimate = self.bounds_s[-1]
        else:
            below = self.cumulative[at - 1] if at else 0
            start = self.bounds_s[at - 1] if at else 0.0
            estimate = start + (self.bounds_s[at] - start) * (rank - below) / (self.cumulative[at] - below)
        return Quantile(estimate_ms=1000 * estimate, low_ms=1000 * self.bounds_s[low - 1] if low else 0.0,
                        high_ms=1000 * self.bounds_s[high] if high < len(self.bounds_s) else None)

    def _bucket(self, rank: float) -> int:
        """The index of the first bucket whose cumulative count reaches `rank` (len(bounds_s): the +Inf one)."""
        return next((i for i, n in enumerate(self.cumulative) if n >= rank), len(self.bounds_s))


def parse(text: str) -> dict[str, Histogram]:
    """The FAMILIES found in a Prometheus text exposition, by servetune's name, each summed over its label sets."""
    found: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        buckets: dict[float, float] = {}
        count = total = 0.0
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
        bounds = sorted(b for b in buckets if math.isfinite(b))
        found[family.name] = {"family": family.name, "bounds_s": tuple(bounds), "count": round(count),
                              "cumulative": tuple(round(buckets[b]) for b in bounds), "sum_s": total}
    return {name: Histogram.model_validate(found[chosen])
            for name, families in FAMILIES.items()
            if (chosen := next((f for f in families if f in found), None)) is not None}


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, Histogram]:
    """The FAMILIES now, from `base_url/metrics`."""
    return parse(metrics_text(base_url, timeout_s))


def since(before: dict[str, Histogram], after: dict[str, Histogram]) -> dict[str, Histogram]:
    """Each histogram's counts between two scrapes (those in both)."""
    return {name: after[name].since(before[name]) for name in after if name in before}

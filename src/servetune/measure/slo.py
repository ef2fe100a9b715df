"""The metric vocabulary: every latency servetune bounds, named once. Each has an SLO key (`--slo ttft_p99_ms=...`),
the level metric it bounds (`p99_ttft_ms`, `vllm bench serve`'s field name in `LevelMetrics`), a label, what a
level's statistical test counts (a request's value, or for ITL every inter-token gap), and its key in `servetune
bench --goodput` (`ttft_ms=...`, as `vllm bench serve --goodput` names it); and a study's rates have a unit: req/s,
or for a trace replay its speed-up factor. A study's SLOs are parsed once (`parse_slo`) into `Slos`: each a `Slo`, a
latency and its bound."""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic_core import core_schema

from servetune.errors import ServetuneError
from servetune.loadgen.records import RequestRecord
from servetune.measure.metrics import LevelMetrics, e2el_ms, tpot_ms, ttft_ms


class Objective(StrEnum):
    """What a study maximizes."""

    GOODPUT = "goodput"  # the highest request rate whose levels meet the SLOs
    THROUGHPUT = "throughput"  # the request rate at full load (every request at once)


@dataclass(frozen=True)
class Latency:
    """A latency servetune bounds at its p99."""

    slo: str  # the SLO's key, e.g. ttft_p99_ms
    p99_field: str  # the level metric it bounds, e.g. p99_ttft_ms
    mean_field: str
    label: str  # e.g. TTFT
    per_request: Callable[[RequestRecord], float | None] | None  # a request's value (ms); None: ITL counts gaps
    prefill_bound: bool  # a prefill step stalls it: chunked prefill decides it (the search's chunk ladder)
    goodput_key: str | None  # its `--goodput` key (ms, per request); None: vLLM's goodput does not bound it

    @property
    def counts(self) -> str:
        """What the statistical test counts over the bound."""
        return "requests" if self.per_request is not None else "gaps"

    @property
    def p99_label(self) -> str:
        """Its p99 as a column or axis names it, e.g. "p99 ITL (ms)"."""
        return f"p99 {self.label} (ms)"

    def p99(self, metrics: object) -> float:
        """The level's p99 of this latency (ms), from its `LevelMetrics` or any metrics under their field names."""
        return getattr(metrics, self.p99_field)

    def mean(self, metrics: LevelMetrics) -> float:
        return getattr(metrics, self.mean_field)


TTFT = Latency("ttft_p99_ms", "p99_ttft_ms", "mean_ttft_ms", "TTFT", ttft_ms, prefill_bound=False,
               goodput_key="ttft_ms")
TPOT = Latency("tpot_p99_ms", "p99_tpot_ms", "mean_tpot_ms", "TPOT", tpot_ms, prefill_bound=True,
               goodput_key="tpot_ms")
ITL = Latency("itl_p99_ms", "p99_itl_ms", "mean_itl_ms", "ITL", None, prefill_bound=True, goodput_key=None)
E2EL = Latency("e2el_p99_ms", "p99_e2el_ms", "mean_e2el_ms", "E2EL", e2el_ms, prefill_bound=False,
               goodput_key="e2el_ms")
LATENCIES = (TTFT, TPOT, ITL, E2EL)
_BY_SLO = {latency.slo: latency for latency in LATENCIES}
_BY_GOODPUT_KEY = {latency.goodput_key: latency for latency in LATENCIES if latency.goodput_key}
GOODPUT_KEYS = tuple(_BY_GOODPUT_KEY)  # `servetune bench --goodput`'s keys


def latency(slo: str) -> Latency:
    """The latency an SLO key bounds (KeyError for an unknown one: `parse_slo` checks the user's)."""
    return _BY_SLO[slo]


@dataclass(frozen=True)
class Slo:
    """A p99 bound on one latency."""

    latency: Latency
    bound_ms: float

    @property
    def name(self) -> str:
        """Its key, e.g. ttft_p99_ms."""
        return self.latency.slo

    def __str__(self) -> str:
        return f"p99 {self.latency.label} <= {self.bound_ms:g} ms"


@dataclass(frozen=True)
class Slos:
    """A study's SLOs, in the order given (`parse_slo`); stored and written as {key: bound_ms}."""

    items: tuple[Slo, ...] = ()

    def __iter__(self) -> Iterator[Slo]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, latency: object) -> bool:
        return any(slo.latency is latency for slo in self.items)

    def bound(self, latency: Latency) -> float | None:
        """The bound on `latency` (ms), or None where no SLO bounds it."""
        return next((slo.bound_ms for slo in self.items if slo.latency is latency), None)

    @property
    def step_ms(self) -> float | None:
        """The tightest p99 TPOT / ITL bound (ms): a decode step's ceiling (None: neither is bounded)."""
        steps = [b for b in (self.bound(TPOT), self.bound(ITL)) if b is not None]
        return min(steps) if steps else None

    def as_dict(self) -> dict[str, float]:
        """{'ttft_p99_ms': 1000.0, ...}: as a study, a summary and `--slo` name them."""
        return {slo.name: slo.bound_ms for slo in self.items}

    def __str__(self) -> str:
        return ", ".join(map(str, self.items)) or "no SLO"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        """In a pydantic model: read from {key: bound} (`parse_slo`), written back as one (`as_dict`)."""
        return core_schema.no_info_before_validator_function(
            _validated, core_schema.is_instance_schema(cls),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda slos: slos.as_dict()))


NO_SLO = Slos()


def _validated(value: Any) -> "Slos":
    """`Slos` as a pydantic field reads them: parsed from {key: bound}, a bad one a ValueError naming it."""
    if isinstance(value, Slos):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"SLOs are {{name: ms}}, not {type(value).__name__}")
    try:
        return parse_slo(value)
    except ServetuneError as e:
        raise ValueError(str(e)) from None


def headline_latencies(slo: Slos) -> tuple[Latency, ...]:
    """The latencies a study's results headline: each one its SLOs bound, or TTFT and TPOT when it sets none."""
    return tuple(lat for lat in LATENCIES if lat in slo) or (TTFT, TPOT)


def parse_slo(slo: Mapping[str, Any]) -> Slos:
    """Validate SLO names and values ({'ttft_p99_ms': 1000, ...}) into `Slos`."""
    unknown = sorted(set(slo) - set(_BY_SLO))
    if unknown:
        raise ServetuneError(f"unknown SLO {', '.join(unknown)}; use {', '.join(_BY_SLO)}")
    bad = [k for k, v in slo.items() if isinstance(v, bool) or not (isinstance(v, (int, float)) and v > 0)]
    if bad:
        raise ServetuneError(f"SLO {', '.join(bad)} must be a positive number of ms")
    return Slos(tuple(Slo(_BY_SLO[k], float(v)) for k, v in slo.items()))


def parse_goodput(goodput: Mapping[str, Any]) -> dict[str, float]:
    """Validate `servetune bench --goodput` bounds: {'ttft_ms': 500.0, ...} (GOODPUT_KEYS, ms per request)."""
    for key, bound in goodput.items():
        if key not in _BY_GOODPUT_KEY:
            raise ServetuneError(f"unknown metric {key!r}; use {', '.join(GOODPUT_KEYS)}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise ServetuneError(f"{key}={bound} is not a positive number of ms")
    return {k: float(v) for k, v in goodput.items()}


def good_request(goodput: Mapping[str, float]) -> Callable[[RequestRecord], bool]:
    """Whether a finished request meets every `--goodput` bound (`parse_goodput`), as vLLM counts goodput: a
    one-token reply's TPOT is 0."""
    bounds = []
    for key, bound in goodput.items():
        value = _BY_GOODPUT_KEY[key].per_request
        assert value is not None  # every goodput key's latency is a request's
        bounds.append((value, bound))
    return lambda record: all((value(record) or 0.0) <= bound for value, bound in bounds)

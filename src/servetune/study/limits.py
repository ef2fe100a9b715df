"""Each measured config against the limit of its devices (`engine.roofline`) and what its rate costs, from what the
study's meta holds: the device's name, the model's shape, the workload's work per request, the SLOs, the price."""

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from servetune.engine.memory import ModelShape
from servetune.engine.roofline import Bound, ModelCost, Work, accelerator, bound, cost_per_million_tokens, gpus_of
from servetune.study.outcome import LevelOutcome
from servetune.study.record import StudyMeta
from servetune.workload import RateUnit


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Roofline(_Frozen):
    """What every config's bound assumes (summary.json `roofline`), or why there is none (`note`)."""

    device: str  # as vLLM names it
    accelerator: str | None  # its entry in servetune's table; None: no bound
    bandwidth_tb_s: float | None
    peak_tflops: float | None  # dense, at the model's weights' precision
    step_slo_ms: float | None  # the tightest p99 TPOT / ITL bound: a decode step's ceiling
    work: dict[str, float] | None  # `roofline.Work`: mean reply, prefill and decoding context (tokens)
    gpu_hour_price: float | None
    note: str


class Limit(_Frozen):
    """One config against its bound: the bound's rate and batch, the share of it its goodput rate reaches, the most
    output tokens/s its levels measured against the bound with no SLO, and what a million output tokens cost at its
    goodput rate."""

    bound_rate: float | None
    bound_batch: int | None
    limited_by: str | None
    efficiency: float | None
    output_tokens_per_s: float | None
    peak_tokens_per_s: float | None
    tokens_efficiency: float | None
    cost_per_million_tokens: float | None


NO_LIMIT = Limit(bound_rate=None, bound_batch=None, limited_by=None, efficiency=None, output_tokens_per_s=None,
                 peak_tokens_per_s=None, tokens_efficiency=None, cost_per_million_tokens=None)


class Limits:
    """A study's roofline, read once from its meta; `of` places a config."""

    def __init__(self, meta: StudyMeta):
        self.trace = meta.rate_unit != RateUnit.REQUESTS_PER_S  # rates are speed-up factors: no req/s to bound
        self.work = Work(**meta.work) if meta.work and not self.trace else None
        self.price = meta.gpu_hour_price
        self.device = accelerator(meta.device_name or "") if meta.device != "cpu" else None
        self.shape = ModelShape(**meta.model_shape) if meta.model_shape else None
        self.step_slo_ms = meta.slos.step_ms
        device = self.device if self.bounded else None
        cost = ModelCost.of(self.shape, {}) if device and self.shape else None
        self.roofline = Roofline(
            device=meta.device_name or meta.device, accelerator=device.name if device else None,
            bandwidth_tb_s=device.bandwidth / 1e12 if device else None,
            peak_tflops=device.peak_flops(cost.fp8) / 1e12 if device and cost else None,
            step_slo_ms=self.step_slo_ms, work=self.work.to_dict() if self.work else None, gpu_hour_price=self.price,
            note=self._note(meta))

    @property
    def bounded(self) -> bool:
        return self.device is not None and self.shape is not None and self.work is not None and not self.shape.experts

    def _note(self, meta: StudyMeta) -> str:
        if self.trace:
            return "no bound: a trace's rates are speed-up factors"
        if meta.device == "cpu":
            return "no bound on CPU: servetune's table holds GPUs' datasheet limits (engine/roofline.py)"
        if meta.device_name is None or self.shape is None or self.work is None:
            return ("no bound: the study does not hold its GPU's name, the model's shape and the workload's lengths "
                    "(made by an older servetune, or the model's config.json was not read)")
        if self.device is None:
            return f"no bound: {meta.device_name} is not in servetune's table (engine/roofline.py)"
        if self.shape.experts:
            return "no bound: a mixture-of-experts model (the roofline counts every parameter as read and computed)"
        ceiling = f"a decode step within {self.step_slo_ms:g} ms (the p99 TPOT / ITL SLO)" if self.step_slo_ms else \
            "no TPOT / ITL SLO: the batch is bounded by the KV cache alone"
        return (f"datasheet limits of {self.device.name}; {ceiling}; the prefill's weight reads and stalls, kernels "
                f"below peak and scheduling left out, so no config reaches it (vLLM's configs measured 12-46% of it "
                f"on an H200: docs/results/h200-limit.md)")

    def of(self, config: dict[str, Any], kv_cache_tokens: int | None, goodput_rate: float | None,
           levels: list[LevelOutcome]) -> Limit:
        """Where a config with `config` (as launched), its logged KV cache size, goodput rate and levels stands."""
        measured = max((lv.metrics.output_throughput for lv in levels if lv.metrics.completed), default=None)
        cost = None
        if self.price is not None and self.work is not None and goodput_rate:
            cost = cost_per_million_tokens(self.price, gpus_of(config), goodput_rate * self.work.output)
        if not self.bounded:
            return NO_LIMIT.model_copy(update={"output_tokens_per_s": measured, "cost_per_million_tokens": cost})
        assert self.device is not None and self.shape is not None and self.work is not None  # `bounded`
        model = ModelCost.of(self.shape, config)
        seqs = config.get("max_num_seqs")
        slo: Bound = bound(self.device, model, self.work, self.step_slo_ms, kv_cache_tokens, seqs)
        peak = bound(self.device, model, self.work, None, kv_cache_tokens, seqs)
        return Limit(bound_rate=slo.rate, bound_batch=slo.batch, limited_by=slo.limited_by,
                     efficiency=_share(goodput_rate, slo.rate), output_tokens_per_s=measured,
                     peak_tokens_per_s=peak.output_tokens_per_s,
                     tokens_efficiency=_share(measured, peak.output_tokens_per_s), cost_per_million_tokens=cost)


def _share(value: float | None, of: float) -> float | None:
    return value / of if value is not None and of > 0 and math.isfinite(of) else None

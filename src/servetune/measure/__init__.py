"""Measurement: one load level against a server (`bench`), its vllm-bench-compatible metrics (`metrics`), the SLO
vocabulary (`slo`) and a level's verdict by statistics (`verdict`); `benchrun` is `servetune bench`'s run."""

from servetune.measure.bench import LevelResult, measure_level
from servetune.measure.metrics import LevelMetrics, summarize
from servetune.measure.slo import LATENCIES, Latency, Objective, latency, parse_slo
from servetune.measure.verdict import Decision, LevelTest, SloTest

__all__ = [
    "LATENCIES", "Decision", "Latency", "LevelMetrics", "LevelResult", "LevelTest", "Objective",
    "SloTest", "latency", "measure_level", "parse_slo", "summarize",
]

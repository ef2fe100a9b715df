"""Configs that measured trials already rule out, before launching them.

Under a p99 ITL SLO a prefill step stalls every running decode for as long as it takes. A step that
prefills a typical prompt whole (no chunked prefill), or a chunk of `max_num_batched_tokens`, takes about
tokens / prefill speed; when that is longer than the SLO, the p99 gap between tokens breaks as soon as a
prompt arrives more than once per hundred gaps, which is any useful rate. The prefill speed is read off
the study's own levels: prompt tokens over the median TTFT of each trial's least loaded level that kept up with
its arrivals, the fastest such speed (TTFT also holds queueing, so a level that fell behind, or a slower reading,
is not trusted to rule anything out).
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servetune.measure.slo import ITL, REQUESTS_PER_S
from servetune.measure.verdict import KEEP_UP_FRACTION
from servetune.study.outcome import TrialOutcome


@dataclass(frozen=True)
class PrefillSpeed:
    """Prompt tokens per second of prefill, and where it was measured."""

    tokens_per_s: float
    trial: int
    rate: float
    rate_unit: str = REQUESTS_PER_S

    def step_ms(self, tokens: int) -> float:
        return 1000 * tokens / self.tokens_per_s


def prefill_speed(outcomes: Iterable[tuple[int, TrialOutcome]]) -> PrefillSpeed | None:
    """The fastest prefill speed seen in (trial number, outcome) pairs, or None before any level ran."""
    best = None
    for number, out in outcomes:
        levels = [lv for lv in out.levels if math.isfinite(lv.rate) and lv.metrics.completed
                  and (lv.metrics.keep_up_ratio or 0.0) >= KEEP_UP_FRACTION]
        if not levels:
            continue
        quiet = min(levels, key=lambda lv: lv.rate)
        m = quiet.metrics
        if m.median_ttft_ms <= 0:
            continue
        speed = PrefillSpeed(m.total_input_tokens / m.completed / (m.median_ttft_ms / 1000), number, quiet.rate,
                             out.rate_unit)
        if best is None or speed.tokens_per_s > best.tokens_per_s:
            best = speed
    return best


def prefill_step_tokens(config: Mapping[str, Any], typical_prompt: int) -> int | None:
    """Prompt tokens one step prefills for a typical prompt: all of it without chunked prefill, else at
    most a chunk of max_num_batched_tokens; None when the config leaves the chunk to vLLM."""
    if config.get("enable_chunked_prefill") is False:
        return typical_prompt
    chunk = config.get("max_num_batched_tokens")
    return None if chunk is None else min(typical_prompt, int(chunk))


def ruled_out(config: Mapping[str, Any], slo: Mapping[str, float], speed: PrefillSpeed | None,
              typical_prompt: int) -> str | None:
    """Why measured trials rule `config` out under the p99 ITL SLO, or None."""
    if speed is None or ITL.slo not in slo:
        return None
    tokens = prefill_step_tokens(config, typical_prompt)
    stall = 0.0 if tokens is None else speed.step_ms(tokens)
    if stall <= slo[ITL.slo]:
        return None
    how = "whole-prompt" if config.get("enable_chunked_prefill") is False else f"{tokens}-token chunk"
    return (f"a {how} prefill step of ~{tokens} tokens takes ~{stall:.0f} ms at the {speed.tokens_per_s:,.0f} "
            f"tokens/s measured in trial {speed.trial} (at {speed.rate:.2f} {speed.rate_unit}), over the p99 ITL SLO of "
            f"{slo[ITL.slo]:g} ms")

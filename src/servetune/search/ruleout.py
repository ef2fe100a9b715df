"""Configs that measured trials already rule out, before launching them.

Under a p99 ITL SLO a prefill step stalls every running decode for as long as it takes. A step that
prefills a typical prompt whole (no chunked prefill), or a chunk of `max_num_batched_tokens`, takes at least
tokens x the prefill cost of a token; when that is longer than the SLO, the p99 gap between tokens breaks as
soon as a prompt arrives more than once per hundred gaps, which is any useful rate. The cost per token is
read off the study's own levels: the slope of TTFT over prompt length in each trial's least loaded level
that kept up with its arrivals (TTFT also holds HTTP, scheduling and waiting for the running step, which do
not grow with the prompt: they are the fit's intercept, not its slope). A config is ruled out only on the
slope's lower confidence bound, the least such bound of any trial: prompts of one length (no slope), a
noisy fit, or a level that fell behind (queueing) rule nothing out.
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scipy import stats

from servetune.measure.slo import ITL, Slos
from servetune.measure.steady import KEEP_UP_FRACTION
from servetune.measure.verdict import CONFIDENCE
from servetune.study.outcome import TrialOutcome
from servetune.workload import RateUnit

_Z = float(stats.norm.ppf(CONFIDENCE))  # one-sided


@dataclass(frozen=True)
class PrefillCost:
    """What a prompt token adds to a step [ms], as measured (`slope` +- `se`) in a trial's level at `rate`."""

    slope: float
    se: float
    trial: int
    rate: float
    rate_unit: RateUnit = RateUnit.REQUESTS_PER_S

    @property
    def least_ms(self) -> float:
        """The slope's one-sided lower confidence bound, at least 0."""
        return max(0.0, self.slope - _Z * self.se)

    def step_ms(self, tokens: int) -> float:
        """The least time a step prefilling `tokens` takes, at the stated confidence."""
        return tokens * self.least_ms


def prefill_cost(outcomes: Iterable[tuple[int, TrialOutcome]]) -> PrefillCost | None:
    """The least prefill cost measured in (trial number, outcome) pairs, or None before any slope was measured."""
    least = None
    for number, out in outcomes:
        levels = [lv for lv in out.levels if math.isfinite(lv.rate) and lv.metrics.completed
                  and (lv.metrics.keep_up_ratio or 0.0) >= KEEP_UP_FRACTION]
        if not levels:
            continue
        quiet = min(levels, key=lambda lv: lv.rate)
        m = quiet.metrics
        if m.ttft_ms_per_prompt_token is None or m.ttft_ms_per_prompt_token_se is None:
            continue
        cost = PrefillCost(m.ttft_ms_per_prompt_token, m.ttft_ms_per_prompt_token_se, number, quiet.rate,
                           out.rate_unit)
        if least is None or cost.least_ms < least.least_ms:
            least = cost
    return least


def prefill_step_tokens(config: Mapping[str, Any], typical_prompt: int) -> int | None:
    """Prompt tokens one step prefills for a typical prompt: all of it without chunked prefill, else at
    most a chunk of max_num_batched_tokens; None when the config leaves the chunk to vLLM."""
    if config.get("enable_chunked_prefill") is False:
        return typical_prompt
    chunk = config.get("max_num_batched_tokens")
    return None if chunk is None else min(typical_prompt, int(chunk))


def ruled_out(config: Mapping[str, Any], slo: Slos, cost: PrefillCost | None,
              typical_prompt: int) -> str | None:
    """Why measured trials rule `config` out under the p99 ITL SLO, or None."""
    if cost is None or (itl := slo.bound(ITL)) is None:
        return None
    tokens = prefill_step_tokens(config, typical_prompt)
    stall = 0.0 if tokens is None else cost.step_ms(tokens)
    if stall <= itl:
        return None
    how = "whole-prompt" if config.get("enable_chunked_prefill") is False else f"{tokens}-token chunk"
    return (f"a {how} prefill step of ~{tokens} tokens takes at least ~{stall:.0f} ms: TTFT grows "
            f"{cost.slope:.4f} +- {cost.se:.4f} ms per prompt token in trial {cost.trial} (at {cost.rate:.2f} "
            f"{cost.rate_unit}; at least {cost.least_ms:.4f} at {CONFIDENCE:.0%} confidence), over the p99 ITL SLO of "
            f"{itl:g} ms")

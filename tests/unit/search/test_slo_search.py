"""The search follows the SLO, without servers: the chunk ladder under an ITL/TPOT SLO, and configs that
measured trials rule out (a prefill step longer than the p99 ITL SLO)."""

import optuna
import pytest

from servetune.measure.slo import parse_slo
from servetune.search.ruleout import prefill_cost, ruled_out
from servetune.search.strategies import make_strategy
from servetune.study.record import read_trial, write_trial
from support import outcomes
from support.search import FLAGS, SPACE, _tell


def _ladder_walk(values: dict[int, float]) -> list[int]:
    """The chunk sizes the ladder launches when chunk c measures values[c] (missing: the launch fails)."""
    strategy = make_strategy("optuna", SPACE, budget=10, seed=0, constrained=False, slo=parse_slo({"itl_p99_ms": 50}))
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    walked = []
    for _ in range(10):
        strategy.plan_next(study)
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        if not waiting:
            break
        chunk = read_trial(waiting[0]).planned["max_num_batched_tokens"]
        walked.append(chunk)
        params = _tell(study, values.get(chunk), failed=chunk not in values)
        assert params["enable_chunked_prefill"] is True and params["max_num_seqs"] <= chunk
    return walked


def test_under_a_latency_slo_the_chunk_ladder_comes_first_and_climbs_while_it_pays():
    # SPACE's chunks below max-model-len 1008: 128, 256, 512; the ladder starts at the anchor's 512
    assert _ladder_walk({512: 4.0}) == [512, 256]  # nothing above 512: down; 256 fails to launch: over
    assert _ladder_walk({512: 4.0, 256: 5.0, 128: 4.5}) == [512, 256, 128]  # down while each rung is better
    assert _ladder_walk({512: 4.0, 256: 3.0}) == [512, 256]  # the first step down is worse: over


def test_the_ladder_climbs_from_the_anchor_and_does_not_come_back_down():
    from servetune.engine.installed import InstalledVllm
    from servetune.search.space import build_space

    space = build_space(InstalledVllm("0.24.0", "cuda", FLAGS), 8000)  # chunks 128 .. 4096
    strategy = make_strategy("optuna", space, budget=10, seed=0, constrained=False, slo=parse_slo({"tpot_p99_ms": 50}))
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    walked, values = [], {512: 4.0, 1024: 6.0, 2048: 7.0, 4096: 6.5, 256: 9.0}
    for _ in range(8):
        strategy.plan_next(study)
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        if not waiting:
            break
        chunk = read_trial(waiting[0]).planned["max_num_batched_tokens"]
        walked.append(chunk)
        trial = study.ask()
        assert read_trial(trial).role == "ladder" and f"chunk {chunk}" in read_trial(trial).why
        write_trial(trial, outcome=outcomes.ok())
        study.tell(trial, values[chunk])
    assert walked == [512, 1024, 2048, 4096]  # climbed past the start: 256 is never tried


def test_without_a_latency_slo_the_warm_start_is_the_single_anchor():
    strategy = make_strategy("optuna", SPACE, budget=6, seed=0, constrained=False, slo=parse_slo({"ttft_p99_ms": 500}))
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    strategy.plan_next(study)
    assert [read_trial(t).role for t in study.trials] == ["anchor"]


def _outcome(levels, keep_up: float = 1.0):
    """levels: (rate, TTFT's slope over prompt length in ms per token, its standard error), each keeping up as
    `keep_up` says."""
    return outcomes.ok(levels=[outcomes.level("search", rate, completed=100, ttft_ms_per_prompt_token=slope,
                                              ttft_ms_per_prompt_token_se=se, keep_up_ratio=keep_up)
                               for rate, slope, se in levels])


def test_prefill_cost_is_the_least_lower_bound_of_any_trials_quiet_level():
    # trial 0: the capacity level (inf) and the busier 4 req/s level are ignored; its quietest, 2 req/s: 0.1 +- 0.005
    # -> at least 0.1 - 1.645 x 0.005 ~ 0.0918. trial 1: 0.09 +- 0.002 -> at least ~0.0867, the least.
    cost = prefill_cost([(0, _outcome([(float("inf"), 0.01, 0.001), (4.0, 0.03, 0.001), (2.0, 0.1, 0.005)])),
                         (1, _outcome([(1.0, 0.09, 0.002)]))])
    assert (cost.trial, cost.rate, cost.slope) == (1, 1.0, 0.09) and cost.least_ms == pytest.approx(0.0867, abs=1e-4)
    assert cost.step_ms(1000) == pytest.approx(86.7, abs=0.1)
    # a noisy trial's bound below 0 wins: it rules nothing out
    noisy = prefill_cost([(0, _outcome([(1.0, 0.09, 0.002)])), (1, _outcome([(1.0, 0.2, 0.2)]))])
    assert noisy.trial == 1 and noisy.least_ms == 0.0 and noisy.step_ms(8000) == 0.0
    assert prefill_cost([(0, _outcome([(float("inf"), 0.1, 0.001)]))]) is None
    # no slope measured (prompts of one length), or a level that fell behind its arrivals (its TTFT queued)
    assert prefill_cost([(0, _outcome([(2.0, None, None)]))]) is None
    assert prefill_cost([(0, _outcome([(2.0, 0.1, 0.001)], keep_up=0.8))]) is None


def test_a_prefill_step_longer_than_the_itl_slo_rules_a_config_out():
    cost = prefill_cost([(0, _outcome([(1.0, 0.1, 0.0)]))])  # 0.1 ms per prompt token, exactly
    slo = parse_slo({"itl_p99_ms": 50.0})
    whole = {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    # a typical 4000-token prompt prefilled whole: 400 ms > 50 ms
    assert "whole-prompt prefill step of ~4000 tokens takes at least ~400 ms" in ruled_out(whole, slo, cost, 4000)
    assert "trial 0" in ruled_out(whole, slo, cost, 4000)
    # chunks: 1024 tokens take ~102 ms (out), 256 take ~26 ms (in)
    assert "1024-token chunk" in ruled_out({"enable_chunked_prefill": True, "max_num_batched_tokens": 1024},
                                           slo, cost, 4000)
    assert ruled_out({"enable_chunked_prefill": True, "max_num_batched_tokens": 256}, slo, cost, 4000) is None
    # the lower bound decides: 0.1 +- 0.04 is at least ~0.034 ms per token, 1024 tokens ~35 ms: not ruled out
    unsure = prefill_cost([(0, _outcome([(1.0, 0.1, 0.04)]))])
    assert ruled_out({"enable_chunked_prefill": True, "max_num_batched_tokens": 1024}, slo, unsure, 4000) is None
    # nothing is ruled out without an ITL SLO, without a measurement, or with vLLM's own chunk
    assert ruled_out(whole, parse_slo({"tpot_p99_ms": 50.0}), cost, 4000) is None
    assert ruled_out(whole, slo, None, 4000) is None
    assert ruled_out({"enable_chunked_prefill": True}, slo, cost, 4000) is None

"""The search follows the SLO, without servers: the chunk ladder under an ITL/TPOT SLO, and configs that
measured trials rule out (a prefill step longer than the p99 ITL SLO)."""

import optuna
import outcomes

from servetune.search.ruleout import prefill_speed, ruled_out
from servetune.search.strategies import make_strategy
from servetune.study.record import read_trial, write_trial

from test_search import SPACE, _tell


def _ladder_walk(values: dict[int, float]) -> list[int]:
    """The chunk sizes the ladder launches when chunk c measures values[c] (missing: the launch fails)."""
    strategy = make_strategy("optuna", SPACE, budget=10, seed=0, constrained=False, slo=("itl_p99_ms",))
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
    from test_search import FLAGS

    space = build_space(InstalledVllm("0.24.0", "cuda", FLAGS), 8000)  # chunks 128 .. 4096
    strategy = make_strategy("optuna", space, budget=10, seed=0, constrained=False, slo=("tpot_p99_ms",))
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
    strategy = make_strategy("optuna", SPACE, budget=6, seed=0, constrained=False, slo=("ttft_p99_ms",))
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    strategy.plan_next(study)
    assert [read_trial(t).role for t in study.trials] == ["anchor"]


def _outcome(levels, keep_up: float = 1.0):
    """levels: (rate, completed, total input tokens, median TTFT ms), each keeping up as `keep_up` says."""
    return outcomes.ok(levels=[outcomes.level("search", rate, completed=n, total_input_tokens=tokens,
                                              median_ttft_ms=ttft, keep_up_ratio=keep_up)
                               for rate, n, tokens, ttft in levels])


def test_prefill_speed_is_the_fastest_quiet_level_of_any_trial():
    # trial 0: capacity level (inf) ignored; quietest finite level 2 req/s: 100 requests of 4000 tokens, 400 ms
    # -> 10,000 tokens/s. trial 1: quietest 1 req/s, 2000-token prompts at 100 ms -> 20,000 tokens/s (fastest).
    speed = prefill_speed([(0, _outcome([(float("inf"), 300, 1_200_000, 9000.0), (4.0, 100, 400_000, 900.0),
                                         (2.0, 100, 400_000, 400.0)])),
                           (1, _outcome([(1.0, 50, 100_000, 100.0)]))])
    assert speed.trial == 1 and speed.rate == 1.0 and speed.tokens_per_s == 20_000
    assert prefill_speed([(0, _outcome([(float("inf"), 10, 1000, 5.0)]))]) is None
    # a level that fell behind its arrivals queued: its TTFT is not a prefill time
    assert prefill_speed([(0, _outcome([(2.0, 100, 400_000, 400.0)], keep_up=0.8))]) is None


def test_a_prefill_step_longer_than_the_itl_slo_rules_a_config_out():
    speed = prefill_speed([(0, _outcome([(1.0, 10, 40_000, 400.0)]))])  # 10,000 tokens/s
    slo = {"itl_p99_ms": 50.0}
    whole = {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    # a typical 4000-token prompt prefilled whole: 400 ms > 50 ms
    assert "whole-prompt prefill step of ~4000 tokens takes ~400 ms" in ruled_out(whole, slo, speed, 4000)
    assert "trial 0" in ruled_out(whole, slo, speed, 4000)
    # chunks: 1024 tokens take ~102 ms (out), 256 take ~26 ms (in)
    assert "1024-token chunk" in ruled_out({"enable_chunked_prefill": True, "max_num_batched_tokens": 1024},
                                           slo, speed, 4000)
    assert ruled_out({"enable_chunked_prefill": True, "max_num_batched_tokens": 256}, slo, speed, 4000) is None
    # nothing is ruled out without an ITL SLO, without a measurement, or with vLLM's own chunk
    assert ruled_out(whole, {"tpot_p99_ms": 50.0}, speed, 4000) is None
    assert ruled_out(whole, slo, None, 4000) is None
    assert ruled_out({"enable_chunked_prefill": True}, slo, speed, 4000) is None

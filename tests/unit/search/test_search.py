"""The search, without servers: space, rate bisection, strategies, choosing the winner."""

import math

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servetune.engine.installed import InstalledVllm
from servetune.errors import ServetuneError
from servetune.measure.slo import E2EL, ITL, TPOT, TTFT, parse_slo
from servetune.search.objective import RateSearch
from servetune.search.space import NO_CHUNK_REASON, SearchSpace, batched_tokens_ladder, build_space
from servetune.search.strategies import SeedStrategy, make_strategy
from servetune.study.record import StudyRecord, TrialRecord, read_trial
from servetune.study.results import choose_best, vllm_config_yaml
from support import outcomes
from support.search import CPU, FLAGS, GPU, SPACE, _tell


def test_space_follows_the_procedure():
    space = build_space(CPU, 1000, context=4096)
    assert space.max_model_len == 1008 and space.context == 4096  # rounded up to the block size
    assert space.fixed == {}  # max-model-len is per config: the context unless tightening pays
    mnbt = space.knob("max_num_batched_tokens").choices
    assert mnbt == (128, 256, 512, 1008, 2016, 3024, 4032)
    assert space.knob("cpu_kvcache_space_gib") is not None and space.knob("gpu_memory_utilization") is None
    assert build_space(GPU, 1000).knob("gpu_memory_utilization").choices == (0.85, 0.9, 0.95)


def test_space_drops_flags_vllm_lacks_and_user_fixed_ones():
    old = InstalledVllm("0.1", "cuda", {k: v for k, v in FLAGS.items() if k != "enforce_eager"})
    names = [k.name for k in build_space(old, 512, fixed={"max_num_seqs": 8}).knobs]
    assert "enforce_eager" not in names and "max_num_seqs" not in names
    assert [k.name for k in build_space(GPU, 512, optional=["block_size"]).knobs][-1] == "block_size"
    with pytest.raises(ServetuneError, match="unknown optional knob"):
        build_space(GPU, 512, optional=["warp_speed"])


def test_a_config_keeps_the_models_context_unless_vllm_would_refuse_it():
    space = build_space(CPU, 1000, context=4096)
    chunked = space.config({"enable_chunked_prefill": True, "max_num_batched_tokens": 512})
    assert "max_model_len" not in chunked and space.model_len_reason(chunked) is None  # vLLM's own context
    assert space.violation(space.config({"enable_chunked_prefill": True, "max_num_batched_tokens": 4032})) is None
    # without chunked prefill vLLM needs max_num_batched_tokens >= max_model_len: the workload's need, 1x..4x
    whole = space.config({"enable_chunked_prefill": False, "max_num_batched_tokens": 1008})
    assert whole["max_model_len"] == 1008 and space.violation(whole) is None
    assert space.model_len_reason(whole) == NO_CHUNK_REASON
    assert "needs chunked prefill" in space.violation({"enable_chunked_prefill": False, "max_num_batched_tokens": 1008,
                                                       "max_model_len": 4096})
    # a KV cache that cannot hold one sequence of the context (vLLM would not start): tightened, with the reason
    small = space.config({"enable_chunked_prefill": True, "cpu_kvcache_space_gib": 0.25})
    fitted = space.fit_kv_cache(small, longest_fitting=4095)
    assert fitted["max_model_len"] == 1008 and "max_model_len" not in small  # a new config; the one checked as it was
    assert space.model_len_reason(fitted) == ("its KV cache (cpu_kvcache_space_gib 0.25) cannot hold one sequence "
                                              "of the model's context: vLLM would not start")
    roomy = space.config({"enable_chunked_prefill": True, "cpu_kvcache_space_gib": 1})
    assert "max_model_len" not in space.fit_kv_cache(roomy, longest_fitting=4096)
    assert space.fit_kv_cache(whole, longest_fitting=512)["max_model_len"] == 1008  # tightened already: as it is


def test_a_floor_raises_what_is_tightened_and_a_fixed_max_model_len_is_every_configs():
    from servetune.workload.fit import ModelLenBounds

    floor = ModelLenBounds(need=1008, context=4096, floor=2000)
    space = build_space(CPU, floor.tightened, context=4096)
    assert space.max_model_len == 2000 and space.knob("max_num_batched_tokens").choices[-4:] == (2000, 4000, 6000, 8000)
    assert space.config({"enable_chunked_prefill": False, "max_num_batched_tokens": 2000})["max_model_len"] == 2000
    assert "max_model_len" not in space.config({"enable_chunked_prefill": True, "max_num_batched_tokens": 2000})
    tightened = ModelLenBounds(need=1008, context=4096, floor=9000).tightened
    assert build_space(CPU, tightened, context=4096).max_model_len == 4096
    fixed = build_space(CPU, 1008, context=4096, fixed={"max_model_len": 2048})
    config = fixed.config({"enable_chunked_prefill": True})
    assert config["max_model_len"] == 2048 and fixed.model_len_reason(config) == "set with --engine-arg max-model-len"
    assert fixed.knob("max_num_batched_tokens").choices[-1] == 4 * 2048


def test_constraint_chunked_prefill_off_needs_a_whole_request_per_batch():
    space = build_space(CPU, 1000, context=4096)
    assert "needs chunked prefill" in space.violation(
        {"max_model_len": 1008, "max_num_batched_tokens": 512, "enable_chunked_prefill": False})
    assert space.violation(
        {"max_model_len": 1008, "max_num_batched_tokens": 512, "enable_chunked_prefill": True}) is None
    assert space.violation({"max_num_batched_tokens": 128, "max_num_seqs": 256}) is not None
    assert SearchSpace.from_dict(space.to_dict()) == space
    assert batched_tokens_ladder(100) == (100, 200, 300, 400)


def test_slo_names_and_values_are_checked():
    slos = parse_slo({"ttft_p99_ms": 500, "itl_p99_ms": 35.5})
    assert [(s.latency, s.bound_ms) for s in slos] == [(TTFT, 500.0), (ITL, 35.5)]  # in the order given
    assert slos.as_dict() == {"ttft_p99_ms": 500.0, "itl_p99_ms": 35.5} and str(slos) == (
        "p99 TTFT <= 500 ms, p99 ITL <= 35.5 ms")
    assert (slos.bound(ITL), slos.bound(TPOT), TTFT in slos, E2EL in slos) == (35.5, None, True, False)
    with pytest.raises(ServetuneError, match="unknown SLO ttft_ms"):
        parse_slo({"ttft_ms": 5})
    for bad in (-1, 0, True, "50"):
        with pytest.raises(ServetuneError, match="SLO tpot_p99_ms must be a positive number of ms"):
            parse_slo({"tpot_p99_ms": bad})


def test_a_model_reads_its_slos_as_parsed_and_writes_them_as_given():
    from pydantic import BaseModel, ValidationError

    from servetune.measure.slo import Slos

    class Plan(BaseModel):
        slo: Slos

    plan = Plan.model_validate_json('{"slo": {"itl_p99_ms": 35, "ttft_p99_ms": 1500}}')
    assert plan.slo.bound(ITL) == 35.0 and plan.model_dump_json() == '{"slo":{"itl_p99_ms":35.0,"ttft_p99_ms":1500.0}}'
    assert Plan(slo=plan.slo).slo is plan.slo
    for bad, why in (({"ttft_ms": 5}, "unknown SLO ttft_ms"), ({"itl_p99_ms": 0}, "SLO itl_p99_ms must be a positive"),
                     ([35], "SLOs are {name: ms}, not list")):
        with pytest.raises(ValidationError, match=why):
            Plan(slo=bad)


def _run(search: RateSearch, true_rate: float) -> RateSearch:
    while (rate := search.next_rate()) is not None:
        search.tell(rate, rate <= true_rate)
    return search


def test_rate_search_brackets_the_goodput_rate():
    search = _run(RateSearch(capacity=10.0, resolution=0.05, max_levels=10), true_rate=5.0)
    lo, hi = search.bracket
    assert lo <= 5.0 < hi and (hi - lo) / hi <= 0.05
    assert search.goodput_rate == lo


def test_rate_search_steps_down_from_near_the_capacity_until_a_rate_passes():
    search = RateSearch(capacity=10.0)
    assert search.next_rate() == 9.0
    search.tell(9.0, False)
    assert search.next_rate() == pytest.approx(9.0 * 0.85)  # no margin known: the least step down
    search.tell(9.0 * 0.85, True)
    assert search.next_rate() == pytest.approx((9.0 + 9.0 * 0.85) / 2)  # then bisection


def test_the_next_rate_follows_the_levels_margins():
    # a fail whose p99 is 20% over its bound steps down to 1 / 1.2 of its rate; 5% over, by 15% at least; 3x over,
    # by half at most
    over = RateSearch(capacity=10.0)
    over.tell(9.0, False, margin=math.log(1.2))
    assert over.next_rate() == pytest.approx(9.0 / 1.2)
    near = RateSearch(capacity=10.0)
    near.tell(9.0, False, margin=math.log(1.05))
    assert near.next_rate() == pytest.approx(9.0 * 0.85)
    bigger = RateSearch(capacity=10.0)
    bigger.tell(9.0, False, far=True, margin=math.log(1.5))  # failed by far, but its margin says how far
    assert bigger.next_rate() == pytest.approx(9.0 / 1.5)
    far = RateSearch(capacity=10.0)
    far.tell(9.0, False, margin=math.log(3.0))
    assert far.next_rate() == pytest.approx(4.5)
    # a pass at half its bound steps up by at most half (where the search's start is no higher); one near its bound
    # by a little
    room = RateSearch(capacity=6.0)
    room.tell(4.0, True, margin=math.log(0.5))
    assert room.next_rate() == pytest.approx(6.0)
    close = RateSearch(capacity=10.0)
    close.tell(4.0, True, margin=math.log(0.95))
    assert close.next_rate() == pytest.approx(4.0 * 1.1)
    # inside a bracket: the root of the line through the two margins, a little below it
    both = RateSearch(capacity=10.0)
    both.tell(6.0, True, margin=-0.3)
    both.tell(9.0, False, margin=0.3)
    assert both.next_rate() == pytest.approx(7.5 * (1 - 0.05 / 2))
    # held to the bracket's middle half where the line's root lies near an end
    edge = RateSearch(capacity=10.0)
    edge.tell(6.0, True, margin=-0.01)
    edge.tell(9.0, False, margin=0.5)
    assert edge.next_rate() == pytest.approx(6.75)


def test_a_race_passed_with_room_far_below_the_capacity_goes_on_where_the_search_starts():
    # The simulated seed 72 (b910c69): a candidate with a capacity of 14.4 req/s passed its race at 1.93, then
    # climbed 2.16, 3.24, 4.86, 7.30 (1.5x a level, every one passed) and ran out of levels at 0.60x its truth;
    # seed 55's climbed 1.3x a level from 3.42 to 14.57 (0.55x), its p99 ITL ~0.6-0.7x its bound at every rate.
    far = RateSearch(capacity=14.4, max_levels=5)
    far.tell(1.93, True, margin=math.log(0.3))
    far.tell(2.16, True, margin=math.log(0.3))
    assert far.next_rate() == pytest.approx(0.9 * 14.4)
    far.tell(0.9 * 14.4, False, margin=math.log(1.2))
    assert 2.16 < far.next_rate() < 0.9 * 14.4  # inside the bracket
    near = RateSearch(capacity=14.4)  # a race passed near its bound: by its margin
    near.tell(1.93, True, margin=math.log(0.9))
    assert near.next_rate() == pytest.approx(1.93 * 1.1)
    flat = RateSearch(capacity=26.0)  # a p99 flat in the rate at 0.7x its bound (seed 55): to the start as well
    flat.tell(3.42, True, margin=math.log(0.7))
    assert flat.next_rate() == pytest.approx(0.9 * 26.0)
    close = RateSearch(capacity=89.45)  # two steps by its margin reach the start (seed 22): by its margin
    close.tell(51.91, True, margin=math.log(0.67))
    assert close.next_rate() == pytest.approx(51.91 * 0.67**-0.7)
    above = RateSearch(capacity=14.4)  # past the start: by at most step_up
    above.tell(13.0, True, margin=math.log(0.3))
    assert above.next_rate() == pytest.approx(13.0 * 1.5)


def test_a_climb_whose_margin_hardly_grows_goes_on_where_its_line_reaches_zero():
    # The simulated seed 321 (33633ba): a candidate passed 8.46 and 16.92 req/s, its p99 ~0.8x its bound at both,
    # then climbed 1.15x a level and ended at 19.47, 0.23x its truth (97.8; capacity 98.11)
    flat = RateSearch(capacity=98.11)
    flat.tell(8.46, True, margin=-0.26)
    flat.tell(16.92, True, margin=-0.20)
    assert flat.next_rate() == pytest.approx(0.9 * 98.11)  # the line's root lies past the start: capped there
    flat.tell(0.9 * 98.11, False, margin=0.4)
    assert 16.92 < flat.next_rate() < 0.9 * 98.11  # a fail there: levels left to close the bracket
    # seed 277: a margin that grows slowly, -0.17 at 27.06 and -0.15 at 29.32: where its line reaches zero
    slow = RateSearch(capacity=74.11)
    slow.tell(27.06, True, margin=-0.17)
    slow.tell(29.32, True, margin=-0.15)
    assert slow.next_rate() == pytest.approx(29.32 * math.exp(0.15 * math.log(29.32 / 27.06) / 0.02))
    # seed 329: flat, but its p99 at 0.93-0.96x its bound, and its answer a step above: by its margin
    near = RateSearch(capacity=13.29)
    near.tell(3.85, True, margin=-0.063)
    near.tell(4.24, True, margin=-0.042)
    assert near.next_rate() == pytest.approx(4.24 * 1.1)
    # a margin that grows as a latency proportional to the rate would: by its margin
    steep = RateSearch(capacity=50.0)
    steep.tell(10.0, True, margin=-0.4)
    steep.tell(13.0, True, margin=-0.15)
    assert steep.next_rate() == pytest.approx(13.0 * math.exp(0.7 * 0.15))
    # a margin that grew by a hair: its line reaches zero far past the start, not past the floats (simulated seed
    # 558 crashed its tune there: OverflowError)
    hair = RateSearch(capacity=50.0)
    hair.tell(10.0, True, margin=-0.2)
    hair.tell(11.0, True, margin=-0.2 + 1e-6)
    assert hair.next_rate() == pytest.approx(0.9 * 50.0)


def test_rate_search_stops_after_max_levels_and_when_nothing_passes():
    assert len(_run(RateSearch(10.0, max_levels=3), 5.0).tried) == 3
    never = _run(RateSearch(10.0, max_levels=20), 0.0)
    assert never.goodput_rate is None and min(r for r, _ in never.tried) >= 10.0 / 32
    easy = _run(RateSearch(10.0, max_levels=20), 100.0)  # a capacity that measured low: it climbs past it
    low, high = easy.bracket
    assert low <= 100.0 < high and (high - low) / high <= 0.05


def test_a_pass_above_the_measured_capacity_searches_on_above_it():
    # The H200 decode-heavy tune (2026-12-03): chunk 512's burst measured 13.89 req/s, then it passed its race at
    # 12.37 and the defaults' 15.46; the search stopped there with the bracket [15.46, 13.89].
    search = RateSearch(capacity=13.89)
    search.tell(12.37, True)
    search.tell(15.46, True)
    assert search.next_rate() == pytest.approx(15.46 / 0.85)
    assert search.bracket == (15.46, None)  # no rate above it was measured: none is said not to pass
    search.tell(15.46 / 0.85, False)
    assert search.next_rate() == pytest.approx((15.46 + 15.46 / 0.85) / 2)  # then bisection


@given(capacity=st.floats(1, 100), true_rate=st.floats(0, 300), race=st.floats(0.1, 1.2),
       max_levels=st.integers(1, 8))
def test_a_search_started_anywhere_brackets_the_rate_it_can_show(capacity, true_rate, race, max_levels):
    """A race at `race` x the capacity, then the search: its bracket never inverts, its upper end is a rate it
    measured, and unless it ran out of levels it ends within the resolution of the true rate."""
    search = RateSearch(capacity=capacity, max_levels=max_levels)
    search.tell(race * capacity, race * capacity <= true_rate)
    _run(search, true_rate)
    low, high = search.bracket
    assert low <= true_rate and (high is None or (low < high and high in [r for r, _ in search.tried]))
    if not search.spent and search.goodput_rate is not None:
        assert high is not None and true_rate < high and (high - low) / high <= search.resolution


def _row(trial, role, value, bracket, status="ok"):
    return outcomes.row(trial, role, status=status, value=value, goodput_rate=value, goodput_bracket=bracket,
                        request_throughput=value)


def test_best_must_beat_the_default_beyond_the_resolution():
    default = _row(0, "default", 5.0, [5.0, 5.5])
    close = _row(1, "search", 5.2, [5.2, 5.6])
    clear = _row(2, "search", 6.0, [6.0, 6.4])
    assert choose_best([default, close], "goodput") == (default, default, False)
    assert choose_best([default, close, clear], "goodput") == (default, clear, True)
    assert choose_best([default, _row(3, "search", 9.0, None, status="failed")], "goodput")[1] is default
    assert choose_best([default, _row(4, "search", 5.1, None)], "throughput")[2] is False


def test_best_yaml_uses_vllm_flag_names():
    text = vllm_config_yaml("/m", {"max_num_batched_tokens": 512, "enable_prefix_caching": False,
                                   "kv_cache_memory_bytes": 1024})
    assert text.splitlines() == ["model: /m", "max-num-batched-tokens: 512", "enable-prefix-caching: false",
                                 "kv-cache-memory-bytes: 1024"]


def test_seed_strategy_walks_the_chunk_ladder_and_stops_at_preemptions():
    strategy = SeedStrategy(SPACE, budget=10, seed=0, constrained=False)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    StudyRecord(study).enqueue({}, TrialRecord(role="default", planned={}))
    _tell(study, 5.0)
    assert strategy.plan_next(study)
    first = _tell(study, 6.0)
    assert first == {"enable_chunked_prefill": True, "max_num_batched_tokens": 128}  # the model's context
    strategy.plan_next(study)
    second = _tell(study, 7.0, preemptions=3)  # the ladder stops here
    assert second["max_num_batched_tokens"] == 256
    strategy.plan_next(study)
    third = _tell(study, 4.0)  # next ladder (whole prompts), on top of the best so far (256)
    assert third["enable_chunked_prefill"] is False and third["max_num_batched_tokens"] == 1008
    assert third["max_model_len"] == 1008  # tightened: vLLM needs a whole max-model-len per batch


def test_seed_strategy_tries_enforce_eager_only_after_an_oom():
    strategy = SeedStrategy(SPACE, budget=50, seed=0, constrained=False)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    StudyRecord(study).enqueue({}, TrialRecord(role="default", planned={}))
    _tell(study, 5.0)
    configs = []
    while strategy.plan_next(study) and len(configs) < 40:
        configs.append(_tell(study, failed=True))
    assert configs and not any("enforce_eager" in c for c in configs[:-1])
    assert configs[-1].get("enforce_eager") is True


@pytest.mark.parametrize("name", ["optuna", "grid"])
def test_sampler_strategies_sample_every_knob(name):
    strategy = make_strategy(name, SPACE, budget=6, seed=1, constrained=False)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    for value in range(4):
        assert strategy.plan_next(study)
        config = _tell(study, float(value))
        tightened = {"max_model_len"} if config["enable_chunked_prefill"] is False else set()
        assert set(config) == tightened | {k.name for k in SPACE.knobs}
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("annealing", SPACE, 6, 0, False)


def test_optuna_starts_from_the_procedures_first_rung():
    strategy = make_strategy("optuna", SPACE, budget=6, seed=0, constrained=False)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler())
    strategy.plan_next(study)
    first = _tell(study, 1.0)
    assert first["enable_chunked_prefill"] is True and first["max_num_batched_tokens"] == 512
    assert first["max_num_seqs"] == 128 and first["cpu_kvcache_space_gib"] == 1
    strategy.plan_next(study)
    assert read_trial(study.ask()).role != "anchor"  # only once


def test_every_slo_names_a_metric_a_level_has():
    from servetune.measure.metrics import LevelMetrics
    from servetune.measure.slo import LATENCIES, latency

    for each in LATENCIES:
        assert {each.p99_field, each.mean_field} <= set(LevelMetrics.model_fields)
        assert latency(each.slo) is each and parse_slo({each.slo: 1}).as_dict() == {each.slo: 1.0}
    assert [t.slo for t in LATENCIES if t.counts == "gaps"] == ["itl_p99_ms"]
    assert [t.slo for t in LATENCIES if t.prefill_bound] == ["tpot_p99_ms", "itl_p99_ms"]


def test_a_strategy_registers_itself_and_the_cli_offers_it(monkeypatch):
    from servetune.search import strategies
    from servetune.search.strategies import REGISTRY, register, strategy_help

    monkeypatch.setattr(strategies, "REGISTRY", dict(REGISTRY))

    @register("annealing", help="simulated annealing", why="the annealer's next step")
    class Annealing(strategies.GridStrategy):
        pass

    assert isinstance(make_strategy("annealing", SPACE, 6, 0, False), Annealing)
    assert strategies.REGISTRY["annealing"].why == "the annealer's next step"
    assert "annealing (simulated annealing)" in strategy_help() and list(REGISTRY) == ["optuna", "grid", "seed"]


def test_a_knob_is_declared_once_for_the_space_the_procedure_and_the_memory_model():
    from servetune.engine.memory import Device, GiB, ModelShape, resolve_engine_args
    from servetune.knobs import KNOBS, OPTIONAL, first_rung, knob

    gpu = build_space(InstalledVllm("0.24.0", "cuda", FLAGS), 1000, optional=["block_size"])
    assert [k.name for k in SPACE.knobs] == [k.arg for k in KNOBS if k.option is None and k.values(True, 1008)]
    assert gpu.knob("block_size").choices == knob("block_size").gpu and gpu.knob("cpu_kvcache_space_gib") is None
    assert list(OPTIONAL) == ["block_size", "kv_cache_dtype", "cudagraph_capture", "performance_mode",
                              "stream_interval", "tensor_parallel_size"]
    with pytest.raises(ServetuneError, match="choose from block_size, kv_cache_dtype"):
        build_space(CPU, 1000, optional=["colour"])
    assert first_rung()["max_num_batched_tokens"] == 512
    tiny = ModelShape.from_config({"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4,
                                   "num_key_value_heads": 2, "intermediate_size": 768, "vocab_size": 4096,
                                   "max_position_embeddings": 4096, "torch_dtype": "float32"})
    resolved = resolve_engine_args(tiny, Device(64 * GiB, kind="cpu"), {})
    assert resolved["block_size"] == knob("block_size").default_cpu == 128

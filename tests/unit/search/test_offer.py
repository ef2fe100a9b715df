"""The knobs a GPU tune searches besides the procedure's: chosen by the workload and the roofline's batch, and only
what the installed vLLM's engine arguments have (an older and a newer argument set, as vLLM's parser lists them)."""

import pytest

from servetune.engine.installed import InstalledVllm
from servetune.engine.roofline import Bound, Work
from servetune.errors import ServetuneError
from servetune.knobs import knob
from servetune.search.offer import offer
from servetune.search.space import build_space
from servetune.testing.installed import FLAGS

_VALUE = {"kind": "value", "default": None, "choices": None}
OLDER = FLAGS | {"kv_cache_dtype": _VALUE | {"default": "auto", "choices": ["auto", "bfloat16", "float16"]}}
NEWER = FLAGS | {"performance_mode": _VALUE | {"default": "balanced", "choices": ["balanced", "interactivity",
                                                                                     "throughput"]},
                 "stream_interval": _VALUE | {"default": 1}}
LONG = Work(output=256, prefill=19000, context=19500)
SHORT = Work(output=700, prefill=700, context=1200)


def limit(slo_batch: int | None, kv_batch: int | None) -> Bound:
    batch = min(b for b in (slo_batch, kv_batch) if b is not None)
    return Bound(rate=1.0, output_tokens_per_s=1.0, batch=batch, step_ms=10.0, slo_batch=slo_batch,
                 kv_batch=kv_batch, limited_by="")


def test_long_contexts_offer_an_fp8_kv_cache_where_vllm_lists_it():
    newer = offer(NEWER, limit(60, 40), LONG, itl_bounded=False)
    assert newer.values["kv_cache_dtype"] == ("auto", "fp8")
    assert "decoding contexts average 19,500 tokens" in newer.why["kv_cache_dtype"]
    assert "kv_cache_dtype" not in offer(OLDER, limit(60, 40), LONG, itl_bounded=False).values  # no fp8 listed


def test_a_kv_cache_that_limits_the_batch_offers_fp8_and_one_that_does_not_offers_nothing():
    limited = offer(NEWER, limit(400, 100), SHORT, itl_bounded=False)
    assert limited.why["kv_cache_dtype"] == "the KV cache holds a batch of 100, below the 400 the SLO allows"
    assert "kv_cache_dtype" not in offer(NEWER, limit(100, 400), SHORT, itl_bounded=False).values
    assert "kv_cache_dtype" not in offer(NEWER, limit(None, 100), SHORT, itl_bounded=False).values  # no step SLO


def test_the_slo_batch_sets_a_max_num_seqs_rung_and_capture_sizes_that_cover_it():
    wide = offer(NEWER, limit(700, 900), SHORT, itl_bounded=False)
    assert wide.values["max_num_seqs"] == (64, 128, 256, 512, 688, 1024)
    assert wide.values["max_cudagraph_capture_size"] == (512, 1024)
    narrow = offer(NEWER, limit(300, 900), SHORT, itl_bounded=False)
    assert "max_cudagraph_capture_size" not in narrow.values and 288 in narrow.values["max_num_seqs"]
    huge = offer(NEWER, limit(50_000, 90_000), SHORT, itl_bounded=False)  # a tiny model on a large GPU
    assert huge.values["max_num_seqs"][-1] == huge.values["max_cudagraph_capture_size"][-1] == 2048


def test_knobs_vllm_lacks_are_not_offered():
    older = offer(OLDER, limit(300, 900), SHORT, itl_bounded=True)
    assert set(older.values) == {"max_num_seqs"}
    newer = offer(NEWER, limit(300, 900), SHORT, itl_bounded=True)
    assert set(newer.values) == {"max_num_seqs", "performance_mode", "stream_interval"}
    assert newer.values["performance_mode"] == ("balanced", "interactivity", "throughput")
    assert "stream_interval" not in offer(NEWER, limit(300, 900), SHORT, itl_bounded=False).values
    assert str(offer(NEWER, None, None, itl_bounded=False)) == "performance-mode balanced/interactivity/throughput " \
                                                               "(this vLLM has it)"


def test_the_space_searches_what_is_offered_and_refuses_a_named_knob_vllm_lacks():
    newer = InstalledVllm("0.32.0", "cuda", NEWER)
    space = build_space(newer, 1000, offered={"performance_mode": ("balanced", "throughput"),
                                              "max_num_seqs": (64, 400)})
    assert space.knob("performance_mode").choices == ("balanced", "throughput")
    assert space.knob("max_num_seqs").choices == (64, 400)
    assert build_space(newer, 1000, optional=["performance_mode"]).knob("performance_mode").choices == \
        knob("performance_mode").gpu
    older = InstalledVllm("0.24.0", "cuda", OLDER)
    with pytest.raises(ServetuneError, match="--knob performance_mode: vLLM 0.24.0 has no --performance-mode"):
        build_space(older, 1000, optional=["performance_mode"])
    assert build_space(older, 1000, optional=["kv_cache_dtype"]).knob("kv_cache_dtype") is None  # no fp8 listed

"""The SLO-aware roofline and the cost of a rate, against cases computed by hand."""

import pytest

from servetune.engine.memory import ModelShape
from servetune.engine.roofline import (
    Accelerator,
    ModelCost,
    Work,
    accelerator,
    bound,
    cost_per_million_tokens,
    gpus_of,
)
from support.shapes import LLAMA3_8B

H200 = Accelerator("H200 SXM", 4.8e12, 989e12, 1979e12)
# Llama-3-8B's shape as the anchors count it: 16 GB of weights read a step, 128 KiB of BF16 KV per token.
EIGHT_B = ModelCost(read=16e9, kv=131072, flops=16e9, fp8=False)


def test_a_decode_step_reads_the_weights_and_every_sequences_kv_cache():
    # batch 128 at a mean context of 1,500: (16e9 + 128 x 1500 x 131072) / 4.8e12 = 8.576 ms, 14,925 tokens/s
    b = bound(H200, EIGHT_B, Work(output=700, prefill=0, context=1500), kv_cache_tokens=128 * 1500)
    assert b.batch == b.kv_batch == 128 and b.slo_batch is None
    assert b.step_ms == pytest.approx(8.576, abs=1e-3)
    assert b.output_tokens_per_s == pytest.approx(14925, rel=1e-3)
    assert b.limited_by == "memory bandwidth at the KV cache's batch"


def test_the_step_slo_caps_the_batch():
    # (0.020 x 4.8e12 - 16e9) / (1500 x 131072) = 406.9: batch 406, (16e9 + 406 x 196,608,000) / 4.8e12 = 19.96 ms
    b = bound(H200, EIGHT_B, Work(output=700, prefill=0, context=1500), step_slo_ms=20, kv_cache_tokens=10**7)
    assert (b.slo_batch, b.kv_batch, b.batch) == (406, 6666, 406)
    assert b.step_ms == pytest.approx(19.96, abs=0.01) and b.step_ms <= 20
    assert b.output_tokens_per_s == pytest.approx(406 / 0.019963, rel=1e-3)
    assert b.rate == pytest.approx(b.output_tokens_per_s / 700)
    assert b.limited_by == "memory bandwidth at the SLO's batch"


def test_a_configs_max_num_seqs_caps_the_batch():
    b = bound(H200, EIGHT_B, Work(output=700, prefill=0, context=1500), step_slo_ms=20, kv_cache_tokens=10**7,
              max_seqs=128)
    assert b.batch == 128 and b.limited_by == "memory bandwidth at its max-num-seqs"
    assert b.output_tokens_per_s == pytest.approx(14925, rel=1e-3)  # batch 128's step, as above


def test_long_prompts_are_bound_by_compute():
    # 16,000 prompt tokens and 200 reply tokens a request at 16 GFLOP a token: 989e12 / (16e9 x 16,200) = 3.816 req/s
    b = bound(H200, EIGHT_B, Work(output=200, prefill=16000, context=16100), step_slo_ms=50, kv_cache_tokens=10**6)
    assert b.rate == pytest.approx(3.816, abs=1e-3) and b.limited_by == "compute"


def test_attention_over_a_long_context_lowers_the_compute_ceiling():
    # 4 x 32 layers x 32 heads x 128 = 524,288 FLOPs per attended token; a 16,000-token prompt attends to 16,000^2 / 2
    # and its 200-token reply to 200 x 16,100: 989e12 / (16e9 x 16,200 + 524,288 x 131.22e6) = 3.015 req/s
    cost = ModelCost(read=16e9, kv=131072, flops=16e9, fp8=False, attention=524288)
    work = Work(output=200, prefill=16000, context=16100, attended=16000**2 / 2 + 200 * 16100)
    assert bound(H200, cost, work, step_slo_ms=50, kv_cache_tokens=10**6).rate == pytest.approx(3.015, abs=1e-3)


def test_an_slo_below_one_step_at_batch_one_holds_no_rate():
    b = bound(H200, EIGHT_B, Work(output=700, prefill=700, context=1500), step_slo_ms=3)  # a step takes 3.37 ms
    assert (b.batch, b.rate) == (0, 0.0) and b.step_ms == pytest.approx(3.374, abs=1e-3)


def test_without_a_step_slo_or_a_kv_size_decode_tends_to_the_kv_reads_alone():
    b = bound(H200, EIGHT_B, Work(output=100, prefill=0, context=1000))
    assert b.batch is None and b.rate == pytest.approx(4.8e12 / (100 * 1000 * 131072))


def test_fp8_weights_compute_at_the_fp8_peak_where_the_device_has_one():
    assert H200.peak_flops(fp8=True) == 1979e12 and H200.peak_flops(fp8=False) == 989e12
    assert Accelerator("A100", 2e12, 312e12).peak_flops(fp8=True) == 312e12


def test_a_configs_cost_per_gpu_follows_its_dtype_kv_dtype_and_sharding():
    shape = ModelShape.from_config(LLAMA3_8B, param_count=8_030_261_248)
    embedding = 128256 * 4096
    one = ModelCost.of(shape, {})
    assert one.read == (8_030_261_248 - embedding) * 2 and one.flops == 2 * (8_030_261_248 - embedding)
    assert one.kv == 32 * 2 * 8 * 128 * 2 == 131072 and one.attention == 4 * 32 * 32 * 128 and not one.fp8
    two = ModelCost.of(shape, {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8"})
    assert (two.read, two.flops, two.kv, two.attention) == (one.read / 2, one.flops / 2, 32 * 2 * 4 * 128 * 1,
                                                             one.attention / 2)
    tied = ModelCost.of(ModelShape.from_config({**LLAMA3_8B, "tie_word_embeddings": True}, param_count=100), {})
    assert tied.read == 200  # a tied embedding is the output layer: read every step


def test_work_averages_the_requests_and_weights_context_by_reply():
    # (100, 10), (300, 30): replies 20 on average, prompts 200, context (10 x 105 + 30 x 315) / 40 = 262.5
    # attended: (10 x 105 + 30 x 315 + 100^2 / 2 + 300^2 / 2) / 2 = 30,250 context tokens a request
    assert Work.of([(100, 10), (300, 30)]) == Work(output=20, prefill=200, context=262.5, attended=30250)
    # a shared 50-token prefix is neither prefilled nor held per sequence; a session's history may be cached
    assert Work.of([(100, 10), (300, 30)], shared=50) == Work(output=20, prefill=150, context=212.5, attended=20500)
    assert Work.of([(100, 10)], cached_prompts=True).prefill == 0
    with pytest.raises(ValueError, match="no request with a reply"):
        Work.of([])


@pytest.mark.parametrize("name, found", [
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"), ("NVIDIA A10", "A10"), ("NVIDIA B200", "B200"), ("AMD Instinct MI300X", "MI300X"),
    ("NVIDIA A10G", None), ("NVIDIA GeForce RTX 4090", None), ("", None)])
def test_a_device_is_found_by_the_words_of_its_name(name, found):
    acc = accelerator(name)
    assert (acc.name if acc else None) == found


def test_a_million_tokens_cost_the_gpu_hours_they_take():
    # 2 GPUs at $2.50 an hour serving 1,000 tokens/s: 1e6 tokens take 1,000 s, 2 x 2.50 x 1000 / 3600 = $1.389
    assert cost_per_million_tokens(2.5, 2, 1000) == pytest.approx(1.3889, abs=1e-4)
    assert cost_per_million_tokens(2.5, 1, 0) is None
    assert gpus_of({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4 and gpus_of({}) == 1

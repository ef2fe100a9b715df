"""How long a request is as vLLM counts it (`workload.fit`), without servers: the token bound with a real
128k BPE tokenizer and its chat template, the character bound with a word-level vocabulary."""

import math

from conftest import word_level_tokenizer_dir
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.fit import (
    ModelLenBounds,
    budget_is_whole_context,
    max_chars_per_token,
    model_len_for,
    refused_beyond,
    served_prompt,
)


def spec(endpoint: str = "completions", input_len=(300, 600), output_len: int = 20) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"num_requests": 20, "seed": 3, "endpoint": endpoint,
                                        "input_len": {"type": "uniform", "min": input_len[0], "max": input_len[1]},
                                        "output_len": {"type": "fixed", "value": output_len}})


def test_bpe_completions_need_prompt_tokens_plus_output(llama3_tokenizer_dir):
    tokenizer = load_tokenizer(llama3_tokenizer_dir)
    assert len(tokenizer) >= 128_256 and max_chars_per_token(tokenizer) >= 16
    for r in build_requests(spec(), tokenizer):
        ids = tokenizer(r.prompt).input_ids
        assert ids[0] == tokenizer.bos_token_id and len(ids) == r.prompt_len  # what the server counts
        assert r.min_model_len == r.prompt_len + r.output_len  # BPE: the token bound binds


def test_bpe_chat_counts_the_rendered_template(llama3_tokenizer_dir):
    tokenizer = load_tokenizer(llama3_tokenizer_dir)
    for r in build_requests(spec("chat"), tokenizer):
        text = tokenizer.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True,
                                             tokenize=False)
        tokens = len(tokenizer(text, add_special_tokens=False).input_ids)
        assert served_prompt(tokenizer, r, "chat") == (tokens, len(text))
        assert r.min_model_len == tokens + r.output_len and tokens > r.prompt_len  # the template's own tokens


def test_word_level_prompts_are_bound_by_characters(tmp_path):
    # "w123456 " is 8 characters for one token whose longest string is 7 ("w128255"): vLLM's character guard
    # (prompt characters <= budget * 7) refuses prompts that fit by their token count
    tokenizer = load_tokenizer(word_level_tokenizer_dir(tmp_path / "tok"))
    assert max_chars_per_token(tokenizer) == 7
    for r in build_requests(spec(output_len=16), tokenizer):
        assert len(r.prompt) > 7 * r.prompt_len
        assert r.min_model_len == math.ceil(len(r.prompt) / 7) + 16 > r.prompt_len + 16


def test_model_len_leaves_headroom_on_the_block_size():
    assert model_len_for(1000) == 1024  # 1000 + 16, rounded up to 16
    assert model_len_for(7300) == 7376  # 7300 + 73
    assert model_len_for(7376) % 16 == 0 and model_len_for(7376) >= 7376 + 73


def test_a_tightened_max_model_len_is_the_need_at_least_the_floor_at_most_the_context():
    assert ModelLenBounds(need=1024, context=4096).tightened == 1024
    assert ModelLenBounds(need=1024, context=4096, floor=2048).tightened == 2048
    assert ModelLenBounds(need=1024, context=4096, floor=100_000).tightened == 4096
    assert ModelLenBounds(need=1024, floor=2048).tightened == 2048  # the context unread: no cap


def test_what_a_tightened_max_model_len_refuses_in_each_vllm_budget():
    # vLLM 0.32: the character budget is max-model-len itself (renderers/params.py max_input_tokens)
    assert budget_is_whole_context("0.32.0") and budget_is_whole_context("1.0.0rc1+cpu")
    assert refused_beyond(7440, 16, "0.32.0").startswith(
        "requests over 7440 tokens (prompt + max_tokens), or prompts over 119040 characters, will be refused")
    # vLLM 0.24: max-model-len less the request's max_tokens, so a bound per request
    assert not budget_is_whole_context("0.24.0") and not budget_is_whole_context("dev")
    assert refused_beyond(7440, 16, "0.24.0") == (
        "requests over 7440 tokens (prompt + max_tokens), or prompts over 16 x (7440 - max_tokens) characters, "
        "will be refused")
    assert refused_beyond(7440, 0, "0.24.0") == "requests over 7440 tokens (prompt + max_tokens) will be refused"

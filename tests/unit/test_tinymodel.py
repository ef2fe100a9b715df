import hashlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from servetune import tinymodel
from servetune.tinymodel import write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_bytes_every_write(model_dir, tmp_path):
    again = write_tiny_model(tmp_path / "again")
    assert digests(again) == digests(model_dir)
    assert set(digests(model_dir)) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_loads_in_transformers_and_runs_forward(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert model.config.num_key_value_heads == tinymodel.NUM_KV_HEADS
    assert sum(p.numel() for p in model.parameters()) > 1_000_000
    with torch.no_grad():
        logits = model(torch.tensor([[6, 7, 8, 9, 10]])).logits
    assert logits.shape == (1, 5, tinymodel.VOCAB_SIZE)
    assert torch.isfinite(logits).all()


def test_tokenizer_one_token_per_word_and_exact_round_trip(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    words = tinymodel.vocabulary()[len(tinymodel.SPECIAL_TOKENS) :]
    assert len(tokenizer) == tinymodel.VOCAB_SIZE == len(set(tinymodel.vocabulary()))
    text = " ".join(words[i] for i in range(0, len(words), 7))
    ids = tokenizer(text).input_ids  # as vLLM's completions endpoint encodes: no BOS is added
    assert len(ids) == len(text.split())
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(tokenizer.decode(list(range(6, 4096))), add_special_tokens=False) == list(range(6, 4096))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (1, 2, 0)


def test_chat_template_wraps_messages_in_role_tokens(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    messages = [{"role": "user", "content": "kobu azfe"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|user|> kobu azfe <|assistant|>"
    assert len(tokenizer(text).input_ids) == 2 + 2

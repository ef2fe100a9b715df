"""Multi-turn sessions: conversations whose every turn resends the history plus a new user message."""

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from servetune.workload.datasets import sample_conversations
from servetune.workload.fit import served_prompt
from servetune.workload.request import RequestSpec
from servetune.workload.spec import WorkloadSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from servetune.workload.text import TextSampler


def build_session_turns(
    spec: WorkloadSpec, tokenizer: "PreTrainedTokenizerBase", texts: "TextSampler", rng: np.random.Generator,
    count: int,
) -> list[RequestSpec]:
    """`count` turns, session after session (the last one cut short to make up `count`), in session order.

    Synthetic: each turn's new message has `input_len` tokens and its reply `output_len`; the history holds
    placeholder replies of that length, replaced by the model's own when sent. ShareGPT: the dataset's human
    messages, reply lengths and (`history: dataset`) reply texts. `prompt_len` is the rendered conversation.
    """
    sessions = spec.sessions
    assert sessions is not None  # a session workload's turns (build_requests)
    conversations = _conversations(spec, tokenizer, texts, rng)
    turns: list[RequestSpec] = []
    for number in range(count):
        conversation = next(conversations)
        history: list[str] = []
        for k, (message, reply, reply_len) in enumerate(conversation):
            turn = RequestSpec(message, 0, reply_len, session=number, history=tuple(history),
                               think_s=sessions.think_time_s if k else 0.0, model_replies=sessions.history == "model")
            turns.append(replace(turn, prompt_len=served_prompt(tokenizer, turn, "chat")[0]))
            if len(turns) == count:
                return turns
            history += [message, reply]
    return turns


def _conversations(
    spec: WorkloadSpec, tokenizer: "PreTrainedTokenizerBase", texts: "TextSampler", rng: np.random.Generator
) -> Iterator[list[tuple[str, str, int]]]:
    """Endless (message, planned reply, reply tokens) conversations, from the dataset or synthetic lengths."""
    dataset = sample_conversations(spec.dataset, tokenizer, rng) if spec.dataset is not None else None
    assert spec.sessions is not None  # a session workload's (build_session_turns)
    while True:
        k = int(spec.sessions.turns.sample(rng, 1)[0])
        if dataset is not None:
            yield next(dataset)[:k]
            continue
        assert spec.input_len is not None and spec.output_len is not None  # required without a dataset
        inputs, outputs = spec.input_len.sample(rng, k).tolist(), spec.output_len.sample(rng, k).tolist()
        yield [(texts.exact(i), texts.exact(o), o) for i, o in zip(inputs, outputs)]

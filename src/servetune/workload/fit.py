"""How long a request is as vLLM counts it, the smallest `--max-model-len` that serves it, and what a
max-model-len below the model's context refuses.

A request needs its prompt tokens plus `max_tokens` within max-model-len: vLLM 0.24 refuses it otherwise
(HTTP 400), vLLM 0.32 silently cuts `max_tokens` down (the reply comes back short; a prompt itself over
max-model-len is refused). Before tokenizing, vLLM also refuses a prompt with more characters than its
input budget times the longest token string of the vocabulary (`max_chars_per_token`). The budget is
max-model-len less `max_tokens` in vLLM 0.24, and max-model-len itself in vLLM 0.32
(`TokenizeParams.max_input_tokens` in `vllm/renderers/params.py` no longer subtracts the output; servetune
assumes the 0.24 budget below 0.32). With a word-level vocabulary, where the spaces between words belong to
no token, that character bound is the tighter one, so a workload sized by token counts alone is partly
refused; `vllm bench serve`'s random prompts carry more characters per token than servetune's too. Chat
counts the rendered template.
"""

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, cast

from pydantic import BaseModel, ConfigDict

from servetune.workload.request import RequestSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BLOCK_SIZE = 16


def max_chars_per_token(tokenizer: "PreTrainedTokenizerBase") -> int:
    """The longest token string in the vocabulary, as vLLM computes it for its character bound."""
    return max(len(token) for token in tokenizer.get_vocab())


def served_prompt(
    tokenizer: "PreTrainedTokenizerBase", request: RequestSpec, endpoint: Literal["completions", "chat"]
) -> tuple[int, int]:
    """(tokens, characters) of the prompt the server tokenizes: the text itself with the tokenizer's special
    tokens (completions), or the chat template rendered around the request's messages (chat)."""
    return served_prompts(tokenizer, [request], endpoint)[0]


def served_prompts(
    tokenizer: "PreTrainedTokenizerBase", requests: list[RequestSpec], endpoint: Literal["completions", "chat"]
) -> list[tuple[int, int]]:
    """`served_prompt` of each request, tokenized in one batch."""
    if endpoint == "completions":
        texts = [r.prompt for r in requests]
    else:
        texts = [cast(str, tokenizer.apply_chat_template(r.messages(), add_generation_prompt=True, tokenize=False))
                 for r in requests]
    ids = tokenizer(texts, add_special_tokens=endpoint == "completions", verbose=False).input_ids
    return [(len(tokens), len(text)) for tokens, text in zip(ids, texts)]


def with_min_model_len(
    requests: list[RequestSpec], tokenizer: "PreTrainedTokenizerBase", endpoint: Literal["completions", "chat"]
) -> list[RequestSpec]:
    """`requests` with `min_model_len` set: the smallest max-model-len that passes both of vLLM's checks,
    whichever version's budget applies."""
    per_token = max_chars_per_token(tokenizer)
    return [replace(r, min_model_len=max(tokens, -(-chars // per_token)) + r.output_len)
            for r, (tokens, chars) in zip(requests, served_prompts(tokenizer, requests, endpoint))]


def model_len_for(longest: int) -> int:
    """The max-model-len servetune launches with for a workload whose longest request needs `longest`:
    1% (at least 16 tokens) of headroom, rounded up to vLLM's block size."""
    need = longest + max(16, longest // 100)
    return -(-need // BLOCK_SIZE) * BLOCK_SIZE


class ModelLenBounds(BaseModel):
    """What a study's configs may launch with as max-model-len: what the workload's longest request needs
    (`need`, `model_len_for`), the model's own context (`context`: config.json's max_position_embeddings;
    0 when unread), the user's floor (`floor`: `--min-model-len`; 0 for none) and the vocabulary's longest
    token string (`max_chars_per_token`, for vLLM's character bound; 0 when unknown). A config launches
    with the context unless tightening pays (`search.space`), and then with `tightened`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    need: int
    context: int = 0
    floor: int = 0
    max_chars_per_token: int = 0

    @property
    def tightened(self) -> int:
        """The workload's need, at least the floor, at most the context."""
        value = max(self.need, self.floor)
        return min(value, self.context) if self.context else value


def budget_is_whole_context(vllm_version: str) -> bool:
    """Whether vLLM's character bound is max-model-len (0.32 on) rather than max-model-len less max_tokens
    (0.24; assumed for every version below 0.32 and for a version string that does not parse)."""
    match = re.match(r"(\d+)\.(\d+)", vllm_version)
    return match is not None and (int(match.group(1)), int(match.group(2))) >= (0, 32)


def refused_beyond(max_model_len: int, max_chars_per_token: int, vllm_version: str) -> str:
    """What vLLM refuses with `max_model_len`, in the words of best.yaml's comment: requests over it in
    tokens, and prompts over its character bound (a number from 0.32 on; before, per request: the longest
    token string times max-model-len less max_tokens). Without `max_chars_per_token` the tokens alone."""
    n, per = max_model_len, max_chars_per_token
    if budget_is_whole_context(vllm_version):
        chars = f", or prompts over {n * per} characters," if per else ""
        return (f"requests over {n} tokens (prompt + max_tokens){chars} will be refused (vLLM {vllm_version} "
                f"cuts the reply short instead where the prompt alone fits)")
    chars = f", or prompts over {per} x ({n} - max_tokens) characters," if per else ""
    return f"requests over {n} tokens (prompt + max_tokens){chars} will be refused"

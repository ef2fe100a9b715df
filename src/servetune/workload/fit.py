"""How long a request is as vLLM counts it, and so the smallest `--max-model-len` that serves it.

A request needs its prompt tokens plus `max_tokens` within max-model-len: vLLM 0.24 refuses it otherwise
(HTTP 400), vLLM 0.32 silently cuts `max_tokens` down (the reply comes back short). Before tokenizing,
vLLM also refuses a prompt with more characters than its input budget times the longest token string of
the vocabulary (`max_chars_per_token`; the budget is max-model-len less `max_tokens` in vLLM 0.24). With
a word-level vocabulary, where the spaces between words belong to no token, that character bound is the
tighter one, so a workload sized by token counts alone is partly refused. Chat counts the rendered template.
"""

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

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
    if endpoint == "completions":
        return len(tokenizer(request.prompt, verbose=False).input_ids), len(request.prompt)
    text = tokenizer.apply_chat_template(request.messages(), add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False, verbose=False).input_ids), len(text)


def with_min_model_len(
    requests: list[RequestSpec], tokenizer: "PreTrainedTokenizerBase", endpoint: Literal["completions", "chat"]
) -> list[RequestSpec]:
    """`requests` with `min_model_len` set: the smallest max-model-len that passes both of vLLM's checks,
    whichever version's budget applies."""
    per_token = max_chars_per_token(tokenizer)
    result = []
    for r in requests:
        tokens, chars = served_prompt(tokenizer, r, endpoint)
        result.append(replace(r, min_model_len=max(tokens, -(-chars // per_token)) + r.output_len))
    return result


def model_len_for(longest: int) -> int:
    """The max-model-len servetune launches with for a workload whose longest request needs `longest`:
    1% (at least 16 tokens) of headroom, rounded up to vLLM's block size."""
    need = longest + max(16, longest // 100)
    return -(-need // BLOCK_SIZE) * BLOCK_SIZE

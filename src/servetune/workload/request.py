"""The unit of work the load generator sends: one prompt with an exact output length."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: the prompt text, its length in the model's tokens, and the tokens to generate.

    `min_model_len` is the smallest `--max-model-len` with which vLLM serves it (`workload.fit`); 0 when
    not worked out."""

    prompt: str
    prompt_len: int
    output_len: int
    min_model_len: int = 0

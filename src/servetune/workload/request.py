"""The unit of work the load generator sends: one prompt with an exact output length."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: the prompt text, its length in the model's tokens, and the tokens to generate."""

    prompt: str
    prompt_len: int
    output_len: int

"""The unit of work the load generator sends: one prompt with an exact output length."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: the prompt text, its length in the model's tokens, and the tokens to generate.

    `min_model_len` is the smallest `--max-model-len` with which vLLM serves it (`workload.fit`); 0 when
    not worked out. A turn of a multi-turn session (`workload.sessions`) also has `session` (its number in
    the level), `history` (the earlier user messages and replies, alternating; a planned reply is as long as
    the model's will be), `think_s` (the wait after the previous reply before sending) and `model_replies`
    (the history's replies are replaced by the model's own when sent). `prompt_len` then counts the whole
    rendered conversation. A request replayed from a trace has its `arrival_s` (s after the trace's first).
    """

    prompt: str
    prompt_len: int
    output_len: int
    min_model_len: int = 0
    session: int | None = None
    history: tuple[str, ...] = ()
    think_s: float = 0.0
    model_replies: bool = False
    arrival_s: float | None = None

    @property
    def turn(self) -> int:
        """0 for a first (or single) message, k for the k-th follow-up."""
        return len(self.history) // 2

    def messages(self, replies: tuple[str, ...] | list[str] = ()) -> list[dict[str, str]]:
        """Chat messages: the history, with its first `len(replies)` replies replaced by `replies`, then the prompt."""
        texts = list(self.history)
        for k, reply in enumerate(replies[: self.turn]):
            texts[2 * k + 1] = reply
        roles = ("user", "assistant")
        return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)] + [
            {"role": "user", "content": self.prompt}]

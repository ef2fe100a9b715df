"""Random text of an exact token count: the prompts, prefixes and session messages that servetune builds."""

from typing import TYPE_CHECKING

import numpy as np

from servetune.workload.spec import WorkloadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MAX_ATTEMPTS = 20


class TextSampler:
    """Random text of an exact token count, built from the tokenizer's ordinary (non-special) tokens."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", rng: np.random.Generator) -> None:
        if not tokenizer.is_fast:
            raise WorkloadError(f"{tokenizer.name_or_path}: token-exact prompts need a fast (tokenizers) tokenizer")
        self._tokenizer = tokenizer
        self._rng = rng
        self._special = set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)
        self._ordinary = np.array(sorted(set(tokenizer.get_vocab().values()) - self._special))

    def exact(self, length: int, head: str = "") -> str:
        """Text starting with `head`'s tokens that encodes to exactly `length` tokens, added special tokens aside.

        Random token ids are decoded to text, which is cut at a token boundary of its re-encoding.
        """
        head_ids = self._encode(head)
        for _ in range(_MAX_ATTEMPTS):
            text = self._tokenizer.decode(head_ids + self.random_ids(length + length // 4 + 8 - len(head_ids)))
            prompt = self._cut(text, length, head_ids)
            if prompt is not None:
                return prompt
        raise WorkloadError(f"{self._tokenizer.name_or_path}: cannot build a prompt of exactly {length} tokens")

    def _cut(self, text: str, length: int, head_ids: list[int]) -> str | None:
        """A prefix of `text` that encodes to `length` tokens beginning with `head_ids`, or None.

        Cutting can merge or split tokens at the cut; a cut that misses moves by the miss, a few times.
        """
        encoding = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ends = [end for _, end in encoding["offset_mapping"]]
        boundary = length
        for _ in range(4):
            if not len(head_ids) < boundary <= len(ends):
                return None
            candidate = text[: ends[boundary - 1]]
            ids = self._encode(candidate)
            if len(ids) == length and ids[: len(head_ids)] == head_ids and not self._special.intersection(ids):
                return candidate
            boundary += length - len(ids)
        return None

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False, verbose=False)

    def random_ids(self, count: int) -> list[int]:
        """`count` random ordinary token ids."""
        return self._rng.choice(self._ordinary, count).tolist()

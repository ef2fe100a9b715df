"""Random text of an exact token count: the prompts, prefixes and session messages that servetune builds."""

from collections.abc import Sequence
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
        """Text starting with `head`'s tokens that encodes to exactly `length` tokens, added special tokens aside."""
        return self.exact_many([length], [head])[0]

    def exact_many(self, lengths: Sequence[int], heads: Sequence[str]) -> list[str]:
        """`exact` of each (length, head), tokenized in batches (a fast tokenizer spreads a batch over the cores).

        Random token ids are decoded to text, which is cut at a token boundary of its re-encoding; a text that
        cannot be cut to its length is drawn again.
        """
        head_ids = {head: self._encode([head])[0] for head in set(heads)}
        out: list[str | None] = [None] * len(lengths)
        pending = list(range(len(lengths)))
        for _ in range(_MAX_ATTEMPTS):
            if not pending:
                break
            heads_ids = [head_ids[heads[i]] for i in pending]
            texts = self._tokenizer.batch_decode([ids + self.random_ids(lengths[i] + lengths[i] // 4 + 8 - len(ids))
                                                  for i, ids in zip(pending, heads_ids)])
            for i, prompt in zip(pending, self._cut(texts, [lengths[i] for i in pending], heads_ids)):
                out[i] = prompt
            pending = [i for i in pending if out[i] is None]
        if pending:
            raise WorkloadError(f"{self._tokenizer.name_or_path}: cannot build a prompt of exactly "
                                f"{lengths[pending[0]]} tokens")
        return [text for text in out if text is not None]

    def _cut(self, texts: list[str], lengths: list[int], head_ids: list[list[int]]) -> list[str | None]:
        """For each text, a prefix that encodes to its length beginning with its head ids, or None.

        Cutting can merge or split tokens at the cut; a cut that misses moves by the miss, a few times.
        """
        encodings = self._tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ends = [[end for _, end in offsets] for offsets in encodings["offset_mapping"]]
        boundary = list(lengths)
        out: list[str | None] = [None] * len(texts)
        live: Sequence[int] = range(len(texts))
        for _ in range(4):
            live = [k for k in live if len(head_ids[k]) < boundary[k] <= len(ends[k])]
            if not live:
                break
            candidates = [texts[k][: ends[k][boundary[k] - 1]] for k in live]
            missed = []
            for k, candidate, ids in zip(live, candidates, self._encode(candidates)):
                head = head_ids[k]
                if len(ids) == lengths[k] and ids[: len(head)] == head and not self._special.intersection(ids):
                    out[k] = candidate
                else:
                    boundary[k] += lengths[k] - len(ids)
                    missed.append(k)
            live = missed
        return out

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self._tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def random_ids(self, count: int) -> list[int]:
        """`count` random ordinary token ids."""
        return self._rng.choice(self._ordinary, count).tolist()

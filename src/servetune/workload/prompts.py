"""Turn a workload spec into concrete requests whose prompts are exactly as long as intended, in the model's tokens."""

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servetune.workload.datasets import sample_dataset
from servetune.workload.fit import with_min_model_len
from servetune.workload.request import RequestSpec
from servetune.workload.sessions import build_session_turns
from servetune.workload.spec import WorkloadError, WorkloadSpec
from servetune.workload.trace import build_trace_requests

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MAX_ATTEMPTS = 20


def load_tokenizer(path_or_name: str | Path) -> "PreTrainedTokenizerBase":
    """The tokenizer of a local model directory or of a model in the local Hugging Face cache; never downloads."""
    from transformers import AutoTokenizer  # here, not at the top: it imports torch (seconds)

    try:
        return AutoTokenizer.from_pretrained(str(path_or_name), local_files_only=True)
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(
            f"{path_or_name}: cannot load tokenizer (not a model directory or cached model name): {reason}"
        ) from None


def build_requests(
    spec: WorkloadSpec, tokenizer: "PreTrainedTokenizerBase", *, seed: int | None = None, count: int | None = None
) -> list[RequestSpec]:
    """`count` (default `spec.num_requests`) requests drawn with `seed` (default `spec.seed`).

    The same seed gives the same list; another seed gives fresh prompts and prefixes, so the server's
    prefix cache cannot recognise them. `prompt_len` is what the completions endpoint counts (the special
    tokens the tokenizer adds included); the chat endpoint adds the chat template's tokens on top.
    Request i starts with shared prefix i % prefix.groups. With `sessions`, the requests are the turns of
    conversations (`workload.sessions`); with a `trace`, the trace's first `count` rows (`workload.trace`).
    Each request's `min_model_len` is set (`fit`).
    """
    rng = np.random.default_rng(spec.seed if seed is None else seed)
    count = spec.num_requests if count is None else count
    if spec.trace is not None:
        return with_min_model_len(build_trace_requests(spec.trace, tokenizer, TextSampler(tokenizer, rng), count),
                                  tokenizer, spec.endpoint)
    if spec.sessions is not None:
        return with_min_model_len(build_session_turns(spec, tokenizer, TextSampler(tokenizer, rng), rng, count),
                                  tokenizer, spec.endpoint)
    if spec.dataset is not None:
        return with_min_model_len(sample_dataset(spec.dataset, tokenizer, count, rng), tokenizer, spec.endpoint)
    texts = TextSampler(tokenizer, rng)
    input_lens = spec.input_len.sample(rng, count)
    output_lens = spec.output_len.sample(rng, count)
    prefix_len = spec.prefix.length if spec.prefix else 0
    prefixes = [texts.exact(prefix_len) for _ in range(spec.prefix.groups)] if spec.prefix else [""]
    added = tokenizer.num_special_tokens_to_add()
    requests = []
    for i, (input_len, output_len) in enumerate(zip(input_lens.tolist(), output_lens.tolist())):
        if input_len - added <= prefix_len:
            raise WorkloadError(
                f"input_len {input_len} leaves no text after the {added} special token(s) and {prefix_len}-token prefix"
            )
        prompt = texts.exact(input_len - added, head=prefixes[i % len(prefixes)])
        requests.append(RequestSpec(prompt, input_len, output_len))
    return with_min_model_len(requests, tokenizer, spec.endpoint)


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

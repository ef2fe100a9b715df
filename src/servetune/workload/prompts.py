"""Turn a workload spec into concrete requests whose prompts are exactly as long as intended, in the model's tokens."""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servetune.workload.datasets import mean_output_tokens, sample_dataset
from servetune.workload.fit import with_min_model_len
from servetune.workload.request import RequestSpec
from servetune.workload.sessions import build_session_turns
from servetune.workload.spec import WorkloadError, WorkloadSpec
from servetune.workload.text import TextSampler
from servetune.workload.trace import build_trace_requests, read_trace

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# How many requests one run may build. Every prompt is built (tokenizer-exact, ~3,000 short or ~200 1k-token
# prompts a second on a 2-core CPU) and held before the first is sent, and each request then holds its record.
MAX_REQUESTS = 1_000_000  # minutes of building at the least: a longer run is better split into several
MEMORY_SHARE = 0.5  # of the memory available when building starts; the rest is for the tokenizer, client, OS
# What a request costs while a run holds it: its RequestSpec and RequestRecord with the metrics' per-request
# values (~1 KiB), its prompt text (a random token's characters, up to 4 bytes each for non-ASCII text) and
# one chunk timestamp per output token in its record (a list slot and an int).
BYTES_PER_REQUEST = 1024
BYTES_PER_PROMPT_TOKEN = 16
BYTES_PER_OUTPUT_TOKEN = 48


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
    check_size(spec, count)
    if spec.trace is not None:
        return with_min_model_len(build_trace_requests(spec.trace, tokenizer, TextSampler(tokenizer, rng), count),
                                  tokenizer, spec.endpoint)
    if spec.sessions is not None:
        return with_min_model_len(build_session_turns(spec, tokenizer, TextSampler(tokenizer, rng), rng, count),
                                  tokenizer, spec.endpoint)
    if spec.dataset is not None:
        return with_min_model_len(sample_dataset(spec.dataset, tokenizer, count, rng), tokenizer, spec.endpoint)
    texts = TextSampler(tokenizer, rng)
    assert spec.input_len is not None and spec.output_len is not None  # required without a dataset or trace
    input_lens = spec.input_len.sample(rng, count)
    output_lens = spec.output_len.sample(rng, count)
    prefix_len = spec.prefix.length if spec.prefix else 0
    prefixes = [texts.exact(prefix_len) for _ in range(spec.prefix.groups)] if spec.prefix else [""]
    added = tokenizer.num_special_tokens_to_add()
    if count and (shortest := int(input_lens.min())) - added <= prefix_len:
        raise WorkloadError(
            f"input_len {shortest} leaves no text after the {added} special token(s) and {prefix_len}-token prefix"
        )
    prompts = texts.exact_many([n - added for n in input_lens.tolist()],
                               [prefixes[i % len(prefixes)] for i in range(count)])
    requests = [RequestSpec(prompt, input_len, output_len)
                for prompt, input_len, output_len in zip(prompts, input_lens.tolist(), output_lens.tolist())]
    return with_min_model_len(requests, tokenizer, spec.endpoint)


@dataclass(frozen=True)
class MorePrompts:
    """More requests of a workload than its pool holds, for a level at a rate the pool cannot fill (a fast
    config's level counts thousands): built in the trial's own process from the tokenizer's path, each level's from
    a seed of its own (level k of every trial gets the same ones), none longer than the pool's longest (the
    max-model-len the configs launch with was fitted to it). Picklable: it travels with the trial's plan."""

    workload: WorkloadSpec
    tokenizer: str
    seed: int
    longest: int  # the pool's largest `min_model_len`
    build: Callable[..., list[RequestSpec]] = build_requests

    def __call__(self, count: int, level: int) -> list[RequestSpec]:
        fresh: list[RequestSpec] = []
        for attempt in range(4):  # a heavy tail beyond the pool's longest is drawn again, on another seed
            drawn = self.build(self.workload, _tokenizer(self.tokenizer), seed=self.seed + 7919 * attempt + level,
                               count=count + count // 8 + 8)
            fresh += [r for r in drawn if r.min_model_len <= self.longest]
            if len(fresh) >= count:
                break
        return fresh[:count]


@functools.cache
def _tokenizer(path_or_name: str) -> "PreTrainedTokenizerBase":
    return load_tokenizer(path_or_name)


def check_size(spec: WorkloadSpec, count: int) -> None:
    """Refuse (WorkloadError, one line with the limit) to build `count` requests of `spec` when they are more
    than MAX_REQUESTS, or would take more than MEMORY_SHARE of the memory available now (`request_bytes`
    each). Cheap: nothing is built or tokenized (a trace's or dataset's file is read, as building would)."""
    if spec.trace is not None:
        count = min(count, len(read_trace(spec.trace.path)))
    each = request_bytes(spec, count)
    available = available_memory_bytes()
    limit = min(MAX_REQUESTS, int(MEMORY_SHARE * available // each) if available else MAX_REQUESTS)
    if count <= limit:
        return
    if limit == MAX_REQUESTS:
        raise WorkloadError(f"{count:,} requests to build: at most {MAX_REQUESTS:,} in one run (every prompt is "
                            "built before the first is sent, ~3,000 short ones a second on a 2-core CPU); "
                            "split the run")
    assert available is not None  # the limit came from it
    raise WorkloadError(
        f"{count:,} requests to build: about {_size(count * each)} in memory ({_size(each)} each), more than "
        f"{MEMORY_SHARE:.0%} of the {_size(available)} available; at most {limit:,} requests of this workload")


def request_bytes(spec: WorkloadSpec, count: int) -> int:
    """About the bytes one of `count` requests of `spec` takes while a run holds it (BYTES_PER_*): a dataset's
    prompts are its file's own strings, shared; a session turn holds its new message and planned reply."""
    if spec.trace is not None:
        rows = read_trace(spec.trace.path)[:count]
        prompt = sum(r.input_tokens for r in rows) / len(rows)
        output = sum(r.output_tokens for r in rows) / len(rows)
    elif spec.dataset is not None:
        prompt, output = 0.0, mean_output_tokens(spec.dataset)
    else:
        assert spec.input_len is not None and spec.output_len is not None  # required without a dataset or trace
        prompt, output = spec.input_len.mean_len, spec.output_len.mean_len
        if spec.sessions is not None:
            prompt += output
    return int(BYTES_PER_REQUEST + BYTES_PER_PROMPT_TOKEN * prompt + BYTES_PER_OUTPUT_TOKEN * output)


def available_memory_bytes() -> int | None:
    """Memory this process can still take: Linux's MemAvailable, less where a cgroup's limit leaves less;
    None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            left = int(Path(limit).read_text()) - int(Path(usage).read_text())
        except (OSError, ValueError):  # no such cgroup file, or "max": no limit
            continue
        available = min(available, max(left, 0))
    return available


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:,.0f} TiB"

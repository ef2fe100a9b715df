"""Requests from dataset files: ShareGPT conversations (JSON) or explicit prompts (JSONL)."""

import itertools
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter, ValidationError

from servetune.workload.request import RequestSpec
from servetune.workload.spec import DatasetSpec, WorkloadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class _Turn(BaseModel):
    speaker: str = Field(alias="from")
    value: str


class _Conversation(BaseModel):
    conversations: list[_Turn]


class _JsonlLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str
    max_tokens: PositiveInt


_SHAREGPT = TypeAdapter(list[_Conversation])


def sample_dataset(
    spec: DatasetSpec, tokenizer: "PreTrainedTokenizerBase", count: int, rng: np.random.Generator
) -> list[RequestSpec]:
    """`count` requests drawn in random order; entries repeat only when the file has fewer usable ones.

    ShareGPT: the prompt is the first human turn and output_len the token count of the gpt reply after it;
    entries outside `spec`'s length limits are skipped, as `vllm bench serve` does. JSONL lines are used as given.
    A file with no entries, or (ShareGPT) no human turn answered by gpt, is refused saying so.
    `prompt_len` counts the special tokens the tokenizer adds, as the completions endpoint does.
    """
    path = Path(spec.path)
    entries = _entries(spec)
    requests = []
    for i in rng.permutation(len(entries)):
        prompt, output = entries[i]
        prompt_len = len(tokenizer(prompt, verbose=False).input_ids)
        if isinstance(output, str):
            output_len = len(tokenizer(output, add_special_tokens=False, verbose=False).input_ids)
            if not _within_limits(spec, prompt_len, output_len):
                continue
        else:
            output_len = output
        requests.append(RequestSpec(prompt, prompt_len, output_len))
        if len(requests) == count:
            return requests
    if not requests:
        raise WorkloadError(f"{path}: no usable entries (none within the length limits)")
    return requests + [requests[i] for i in rng.integers(len(requests), size=count - len(requests))]


def mean_output_tokens(spec: DatasetSpec) -> float:
    """About the mean output length of the dataset's entries (tokens), without tokenizing: JSONL's max_tokens,
    or a ShareGPT reply's characters over 4 (English text's usual characters per token)."""
    outputs = [output if isinstance(output, int) else len(output) / 4 for _, output in _entries(spec)]
    return sum(outputs) / len(outputs)


def _entries(spec: DatasetSpec) -> tuple[tuple[str, str | int], ...]:
    path = Path(spec.path)
    try:
        return _read(path, spec.format, path.stat().st_mtime_ns)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text") from None


def sample_conversations(
    spec: DatasetSpec, tokenizer: "PreTrainedTokenizerBase", rng: np.random.Generator
) -> Iterator[list[tuple[str, str, int]]]:
    """ShareGPT conversations in random order (repeating when the file runs out), each as its (human message,
    gpt reply, reply tokens) turns, cut before the first turn outside `spec`'s length
    limits or that takes the conversation past `max_total_len` tokens; conversations with no usable turn are
    skipped."""
    path = Path(spec.path)
    try:
        conversations = _read_turns(path, path.stat().st_mtime_ns)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text") from None
    if not conversations:
        raise WorkloadError(f"{path}: no conversation has a human turn followed by a gpt reply")
    found = False
    while True:
        for i in rng.permutation(len(conversations)):
            turns, total = [], 0
            for human, gpt in conversations[i]:
                prompt_len = len(tokenizer(human, verbose=False).input_ids)
                reply_len = len(tokenizer(gpt, add_special_tokens=False, verbose=False).input_ids)
                total += prompt_len + reply_len
                if not _within_limits(spec, prompt_len, reply_len) or total > spec.max_total_len:
                    break
                turns.append((human, gpt, reply_len))
            if turns:
                found = True
                yield turns
        if not found:
            raise WorkloadError(f"{path}: no usable conversation (none within the length limits)")


@lru_cache(maxsize=2)
def _read_turns(path: Path, mtime_ns: int) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Every conversation's consecutive (human, gpt) pairs, from its first human turn."""
    conversations = _parse_sharegpt(path)
    result = []
    for conversation in conversations:
        turns, pairs = conversation.conversations, []
        for turn, reply in itertools.pairwise(turns):
            if turn.speaker == "human" and reply.speaker == "gpt":
                pairs.append((turn.value, reply.value))
        if pairs:
            result.append(tuple(pairs))
    return tuple(result)


def _within_limits(spec: DatasetSpec, prompt_len: int, output_len: int) -> bool:
    return (
        prompt_len >= spec.min_len
        and output_len >= spec.min_len
        and prompt_len <= spec.max_prompt_len
        and prompt_len + output_len <= spec.max_total_len
    )


@lru_cache(maxsize=2)
def _read(path: Path, format: str, mtime_ns: int) -> tuple[tuple[str, str | int], ...]:
    """(prompt, reply text or max_tokens) pairs; cached by path and mtime, as every load level samples the file."""
    return _read_sharegpt(path) if format == "sharegpt" else _read_jsonl(path)


def _read_sharegpt(path: Path) -> tuple[tuple[str, str], ...]:
    exchanges = tuple(filter(None, (_first_exchange(c.conversations) for c in _parse_sharegpt(path))))
    if not exchanges:
        raise WorkloadError(f"{path}: no conversation has a human turn followed by a gpt reply")
    return exchanges


def _parse_sharegpt(path: Path) -> list[_Conversation]:
    """The file's conversations; WorkloadError for an empty file, invalid JSON or entries, or an empty list."""
    data = path.read_bytes()
    if not data.strip():
        raise WorkloadError(f"{path}: the file is empty")
    try:
        conversations = _SHAREGPT.validate_json(data)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            raise WorkloadError(f"{path}: {first['msg']}") from None
        where = [f"entry {first['loc'][0]}", ".".join(map(str, first["loc"][1:]))] if first["loc"] else []
        raise WorkloadError(": ".join([str(path), *filter(None, where), first["msg"]])) from None
    if not conversations:
        raise WorkloadError(f"{path}: no conversations (the file holds an empty list)")
    return conversations


def _first_exchange(turns: list[_Turn]) -> tuple[str, str] | None:
    """The first human turn and the first gpt reply after it, if the conversation has both."""
    for i, turn in enumerate(turns):
        if turn.speaker == "human":
            reply = next((later.value for later in turns[i + 1 :] if later.speaker == "gpt"), None)
            return None if reply is None else (turn.value, reply)
    return None


def _read_jsonl(path: Path) -> tuple[tuple[str, int], ...]:
    """(prompt, max_tokens) of every line; WorkloadError naming file:line for a bad line or an empty prompt, and
    for a file with no lines."""
    pairs = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = _JsonlLine.model_validate_json(line)
            except ValidationError as e:
                first = e.errors()[0]
                field = ".".join(map(str, first["loc"]))
                raise WorkloadError(f"{path}:{number}: {field + ': ' if field else ''}{first['msg']}") from None
            if not record.prompt.strip():
                raise WorkloadError(f"{path}:{number}: prompt: empty{' (only whitespace)' if record.prompt else ''}")
            pairs.append((record.prompt, record.max_tokens))
    if not pairs:
        raise WorkloadError(f"{path}: the file is empty (no JSON lines)")
    return tuple(pairs)

"""The engine arguments servetune tunes, each declared once: the values the search tries (on CPU and on a GPU, in
ladder order), the kind of value it takes, vLLM's own default where the memory model needs it, whether it is searched
by default or added with `--knob NAME`, its part in the manual procedure (the seed strategy's ladders, the first rung
every warm start begins with). The search space (`search.space`), the strategies, the CLI's `--knob` and
`--engine-arg` and the memory model read it."""

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# Not a vLLM flag: servetune's name for the CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE), launched
# as --kv-cache-memory-bytes so that fractions of a GiB work and a config file carries it.
CPU_KVCACHE_SPACE = "cpu_kvcache_space_gib"
CHUNK_BASE = 128  # the procedure: with chunked prefill, start near 128 and double


def batched_tokens_ladder(max_model_len: int) -> tuple[int, ...]:
    """Chunk sizes 128 * 2^k below 4x max_model_len, and whole multiples 1x..4x max_model_len."""
    chunks = [CHUNK_BASE * 2**k for k in range(12) if CHUNK_BASE * 2**k < max_model_len]
    return tuple(sorted(set(chunks + [m * max_model_len for m in (1, 2, 3, 4)])))


# The kinds of value an engine argument takes, and how a bad one is told.
Kind = Literal["count", "number", "fraction", "bool", "text"]
_TAKES = {"count": "a whole number above 0", "number": "a number above 0", "fraction": "a number above 0 and at most 1",
          "bool": "true or false", "text": "a name"}


@dataclass(frozen=True)
class KnobSpec:
    """An engine argument the search sets or reads."""

    arg: str  # the engine argument, snake_case
    help: str
    kind: Kind = "count"
    readable: bool = False  # a count vLLM also reads as 8k (8,000) or 8K (8,192)
    cpu: tuple = ()  # the values tried on CPU, in ladder order (none: not searched there)
    gpu: tuple = ()  # ... on a GPU
    from_model_len: Callable[[int], tuple] | None = None  # values that follow the tightened max-model-len instead
    default_cpu: Any = None  # vLLM's default, where the memory model fills it in (None: derived, or not needed)
    default_gpu: Any = None
    option: str | None = None  # `--knob NAME` adds it to the search; None: searched by default
    ladder: bool = False  # the seed procedure walks its values as a ladder of its own
    first_rung: Any = None  # its value in the procedure's first rung (None: its first value)

    def values(self, on_cpu: bool, max_model_len: int) -> tuple:
        if self.from_model_len is not None:
            return self.from_model_len(max_model_len)
        return self.cpu if on_cpu else self.gpu

    def vllm_default(self, on_cpu: bool) -> Any:
        return self.default_cpu if on_cpu else self.default_gpu


KNOBS = (
    KnobSpec("max_num_batched_tokens", "tokens per engine step: the prefill chunk with chunked prefill "
             "(128 x 2^k below max-model-len), else 1x..4x max-model-len", readable=True,
             from_model_len=batched_tokens_ladder, first_rung=512),
    KnobSpec("enable_chunked_prefill", "prefill long prompts in chunks between decode steps", kind="bool",
             cpu=(True, False), gpu=(True, False), first_rung=True),
    KnobSpec("enable_prefix_caching", "reuse the KV cache of shared prompt prefixes", kind="bool",
             cpu=(True, False), gpu=(True, False), ladder=True, first_rung=True),
    KnobSpec("max_num_seqs", "requests decoded at once", cpu=(16, 32, 64, 128, 256), gpu=(64, 128, 256, 512, 1024),
             ladder=True, first_rung=128),
    KnobSpec("enforce_eager", "no CUDA graphs (less memory, slower decode); the seed procedure tries it after an OOM",
             kind="bool", cpu=(False, True), gpu=(False, True), default_cpu=False, default_gpu=False,
             first_rung=False),
    KnobSpec(CPU_KVCACHE_SPACE, "CPU: the KV cache size in GiB", kind="number", cpu=(0.25, 0.5, 1, 2), ladder=True,
             first_rung=1),
    KnobSpec("gpu_memory_utilization", "GPU: the share of its memory vLLM takes (chosen by the memory model when "
             "it can read the model)", kind="fraction", gpu=(0.85, 0.9, 0.95), default_cpu=0.9, default_gpu=0.9,
             ladder=True, first_rung=0.9),
    KnobSpec("block_size", "tokens per KV cache block", cpu=(16, 32, 128), gpu=(16, 32, 64), default_cpu=128,
             default_gpu=16, option="block_size"),
    KnobSpec("kv_cache_dtype", "the KV cache's data type", kind="text", cpu=("auto", "fp8"), gpu=("auto", "fp8"),
             default_cpu="auto", default_gpu="auto", option="kv_cache_dtype"),
    KnobSpec("max_cudagraph_capture_size", "the largest batch captured as a CUDA graph", cpu=(128, 256, 512),
             gpu=(128, 256, 512), option="cudagraph_capture"),
    KnobSpec("performance_mode", "GPU: vLLM's preset of scheduling for throughput or interactivity (where vLLM has "
             "it)", kind="text", gpu=("balanced", "throughput", "interactivity"), default_gpu="balanced",
             option="performance_mode"),
    KnobSpec("stream_interval", "GPU: tokens a streamed chunk carries (offered only under an ITL SLO, which measures "
             "each chunk's gap)", gpu=(1, 8), default_gpu=1, option="stream_interval"),
    KnobSpec("tensor_parallel_size", "GPUs a config shards the model over", cpu=(1, 2, 4, 8), gpu=(1, 2, 4, 8),
             default_cpu=1, default_gpu=1, option="tensor_parallel_size"),
    KnobSpec("max_model_len", "tokens of context a config serves: the model's, tightened where that pays "
             "(`search.space`); not searched", readable=True),
)
OPTIONAL = {knob.option: knob for knob in KNOBS if knob.option is not None}  # by --knob name
_BY_ARG = {knob.arg: knob for knob in KNOBS}


def knob(arg: str) -> KnobSpec:
    """The declaration of engine argument `arg` (KeyError: not a knob)."""
    return _BY_ARG[arg]


_READABLE = re.compile(r"(\d+(?:\.\d+)?)([kmgt])|(\d+)([KMGT])")  # vLLM's human_readable_int


def checked(arg: str, value: Any) -> Any:
    """`value` of engine argument `arg` as servetune uses it: a readable count (8k, 8K) as its number; ValueError
    saying what `arg` takes when `value` is not of its kind. Arguments not declared here are vLLM's to check."""
    spec = _BY_ARG.get(arg)
    if spec is None or value is None:
        return value
    if spec.readable and isinstance(value, str) and (match := _READABLE.fullmatch(value.strip())):
        decimal, suffix, binary, binary_suffix = match.groups()
        value = (int(float(decimal) * 1000 ** ("kmgt".index(suffix) + 1)) if decimal
                 else int(binary) * 1024 ** ("KMGT".index(binary_suffix) + 1))
    if not _is_kind(spec.kind, value):
        readable = " (vLLM also reads 8k as 8,000 and 8K as 8,192)" if spec.readable else ""
        shown = value if isinstance(value, str) else json.dumps(value)
        raise ValueError(f"{arg.replace('_', '-')}={shown}: not {_TAKES[spec.kind]}{readable}")
    return value


def _is_kind(kind: Kind, value: Any) -> bool:
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    if kind == "text":
        return isinstance(value, str) and value != ""
    if kind == "count":
        return isinstance(value, int) and value > 0
    number = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return number and (kind == "number" or value <= 1)


def first_rung() -> dict[str, Any]:
    """The procedure's first rung as a whole config: chunked prefill at a small chunk, the rest as vLLM has it."""
    return {k.arg: k.first_rung for k in KNOBS if k.first_rung is not None}


def optional_help() -> str:
    """`--knob`'s help: each optional knob and what it is."""
    return "; ".join(f"{name} ({spec.help})" for name, spec in OPTIONAL.items())

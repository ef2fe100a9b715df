"""The search space: vLLM knobs with ladders of values, derived from the workload and the installed vLLM."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servetune.engine.installed import InstalledVllm
from servetune.errors import ServetuneError
from servetune.knobs import CPU_KVCACHE_SPACE, KNOBS, OPTIONAL, batched_tokens_ladder

__all__ = ["BLOCK_SIZE", "NO_CHUNK_REASON", "Knob", "SearchSpace", "batched_tokens_ladder", "build_space", "round_up"]

BLOCK_SIZE = 16
NO_CHUNK_REASON = "without chunked prefill vLLM needs max-num-batched-tokens >= max-model-len"


@dataclass(frozen=True)
class Knob:
    """One engine argument and the values the search may give it, in ladder order."""

    name: str
    choices: tuple


@dataclass(frozen=True)
class SearchSpace:
    """Knobs to search, args every searched config gets (`fixed`), the max-model-len a config gets where
    tightening pays (`max_model_len`: what the workload's longest request needs, at least the user's floor,
    at most the model's context) and the model's own context (`context`; 0 when unread).

    A searched config launches with the model's own context (no --max-model-len: vLLM derives it from the
    model, as it does for vLLM's defaults) unless tightening pays, that is unless vLLM would refuse the
    config at the context: without chunked prefill (`config`: max-num-batched-tokens must hold a whole
    max-model-len), or with a KV cache that cannot hold one sequence of the context (`fit_kv_cache`).
    Elsewhere tightening buys nothing: vLLM V1 allocates the KV cache in blocks out of its whole budget, so
    the KV tokens do not depend on max-model-len, nor do the start-up plan's other terms (weights,
    activations, CUDA graphs). `model_len_reason` says why a config was tightened."""

    knobs: tuple[Knob, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = 0
    context: int = 0

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)

    def config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Engine args of a searched trial: the fixed args plus the sampled knob values, and max_model_len
        where chunked prefill is off (vLLM needs max_num_batched_tokens >= max_model_len there)."""
        config = {**self.fixed, **params}
        if "max_model_len" not in config and config.get("enable_chunked_prefill") is False:
            config["max_model_len"] = self.max_model_len
        return config

    def fit_kv_cache(self, config: Mapping[str, Any], longest_fitting: int) -> dict[str, Any]:
        """`config`, tightened to max_model_len when its KV cache holds one sequence of at most `longest_fitting`
        tokens (the memory model's prediction), less than the model's context: vLLM would refuse to start with
        the context. A new dict; `config` is left as it is."""
        if "max_model_len" not in config and self.context and longest_fitting < self.context:
            return {**config, "max_model_len": self.max_model_len}
        return dict(config)

    def model_len_reason(self, config: Mapping[str, Any]) -> str | None:
        """Why a config (`config`'s, or tightened by `fit_kv_cache`) launches with a max-model-len below the
        model's context; None when it launches with the context."""
        mml = config.get("max_model_len")
        if mml is None or (self.context and mml >= self.context):
            return None
        if "max_model_len" in self.fixed:
            return "set with --engine-arg max-model-len"
        if config.get("enable_chunked_prefill") is False:
            return NO_CHUNK_REASON
        kv = {k: config[k] for k in (CPU_KVCACHE_SPACE, "gpu_memory_utilization") if config.get(k) is not None}
        size = f" ({', '.join(f'{k} {v}' for k, v in kv.items())})" if kv else ""
        return f"its KV cache{size} cannot hold one sequence of the model's context: vLLM would not start"

    def violation(self, config: Mapping[str, Any]) -> str | None:
        """Why vLLM would refuse `config` at start-up, or None. Checked before launching anything."""
        mnbt, mml = config.get("max_num_batched_tokens"), config.get("max_model_len", self.context or None)
        if config.get("enable_chunked_prefill") is False and mnbt is not None and mml is not None and mnbt < mml:
            return f"max_num_batched_tokens ({mnbt}) < max_model_len ({mml}) needs chunked prefill"
        seqs = config.get("max_num_seqs")
        if mnbt is not None and seqs is not None and mnbt < seqs:
            return f"max_num_batched_tokens ({mnbt}) < max_num_seqs ({seqs})"
        return None

    def to_dict(self) -> dict:
        return {"knobs": {k.name: list(k.choices) for k in self.knobs}, "fixed": self.fixed,
                "max_model_len": self.max_model_len, "context": self.context}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchSpace":
        knobs = tuple(Knob(name, tuple(choices)) for name, choices in data["knobs"].items())
        return cls(knobs, dict(data["fixed"]), data["max_model_len"], data.get("context", 0))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build_space(
    vllm: InstalledVllm,
    max_model_len: int,
    *,
    context: int = 0,
    optional: Iterable[str] = (),
    fixed: Mapping[str, Any] | None = None,
    offered: Mapping[str, tuple] | None = None,
) -> SearchSpace:
    """The procedure's knobs for a workload whose configs get `max_model_len` where tightening pays (what
    its longest request needs, at least the user's floor: `workload.fit.ModelLenBounds.tightened`), for a
    model whose own context is `context` (0: unread).

    max_model_len is rounded up to the block size (at most the context); the ladder of
    max_num_batched_tokens takes it as the whole-prompt size. Knobs the installed vLLM does not accept are
    dropped; knobs named in `fixed` (the user's --engine-arg) are not searched, and a fixed max_model_len
    is every config's. `offered` (`search.offer.Offer.values`): knobs to search with these values, optional ones
    added as if named, searched ones with their values replaced.
    """
    fixed = dict(fixed or {})
    mml = round_up(max_model_len, BLOCK_SIZE)
    mml = fixed.get("max_model_len") or (min(mml, context) if context else mml)
    optional = list(optional)
    for name in optional:
        if name not in OPTIONAL:
            raise ServetuneError(f"unknown optional knob {name!r}; choose from {', '.join(OPTIONAL)}")
        if OPTIONAL[name].arg != CPU_KVCACHE_SPACE and not vllm.accepts(OPTIONAL[name].arg):
            raise ServetuneError(f"--knob {name}: vLLM {vllm.version} has no --{OPTIONAL[name].arg.replace('_', '-')}")
    offered = dict(offered or {})
    declared = [k for k in KNOBS if k.option is None] + [OPTIONAL[name] for name in optional]
    declared += [k for k in KNOBS if k.arg in offered and k not in declared]
    knobs = [Knob(k.arg, _listed(vllm, k.arg, offered.get(k.arg) or k.values(vllm.on_cpu, mml))) for k in declared]
    knobs = [k for k in knobs if k.choices]
    kept = tuple(k for k in knobs if k.name not in fixed and (k.name == CPU_KVCACHE_SPACE or vllm.accepts(k.name)))
    return SearchSpace(kept, fixed, mml, context)


def _listed(vllm: InstalledVllm, arg: str, values: tuple) -> tuple:
    """`values` that vLLM lists among the choices of `arg` (all of them where it lists none); none where fewer than two
    of several are left (nothing to search)."""
    choices = vllm.flags.get(arg, {}).get("choices")
    listed = tuple(v for v in values if not choices or v in choices)
    return listed if len(listed) == len(values) or len(listed) > 1 else ()

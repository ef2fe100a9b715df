"""How close a config comes to the hardware: an SLO-aware roofline of serving, and what a rate costs.

Per GPU of a config that shards a dense model over `gpus` (all sizes in bytes, rates per second):

    read      = weight bytes per GPU, less the input embedding where untied (a step reads only its rows)
    kv        = layers x 2 x kv_heads_per_gpu x head_dim x kv_dtype_bytes          per token of context
    flops     = 2 x (parameters - the input embedding where untied) / gpus            per token
    attention = 4 x layers x heads_per_gpu x head_dim                    per token and context token it attends to
    step(B)   = max((read + B x C x kv) / bandwidth, B x (flops + attention x C) / peak_flops)     at batch B
    slo_batch = the largest B with step(B) <= the p99 TPOT / ITL bound (a p99 is at least the mean step)
    kv_batch  = the KV cache's tokens / C
    rate     <= B x bandwidth / (L_out x (read + B x C x kv)),  B = min(slo_batch, kv_batch, max-num-seqs)
    rate     <= peak_flops / (flops x (L_prefill + L_out) + attention x A)                     all tokens' compute

C is the mean context of a decoding sequence (its unshared part) weighted by reply length, L_out the mean reply,
L_prefill the mean prompt tokens that must be computed (a shared prefix and a session's history left out: a cache
may hold them), A the mean context tokens a request's computed tokens attend to (causal: P^2 / 2 for a prompt of P).
Every term left out (the prefill's own weight reads and its stall of decode, attention's softmax, schedulers, the
client, kernels below their peak) would lower the limit, so the bound is one no config reaches (vLLM's configs on an
H200 measured 12-46% of it: docs/results/h200-limit.md). The device table holds datasheet figures (dense, no
sparsity); a device not in it has no bound, and says so.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servetune.engine.memory import ModelShape, kv_dtype_bytes, serving_dtype_bytes

TB, TFLOPS = 1e12, 1e12


@dataclass(frozen=True)
class Accelerator:
    """One device's datasheet limits."""

    name: str
    bandwidth: float  # memory bytes/s
    bf16_flops: float  # dense 16-bit tensor FLOP/s
    fp8_flops: float | None = None  # dense FP8 tensor FLOP/s (None: no FP8 tensor cores)

    def peak_flops(self, fp8: bool) -> float:
        """The peak a model computes at: FP8 where its weights are quantized and the device has FP8, else 16-bit."""
        return self.fp8_flops if fp8 and self.fp8_flops else self.bf16_flops


# vLLM's device names (torch's), matched by their words in order, the most specific first.
ACCELERATORS: tuple[tuple[tuple[str, ...], Accelerator], ...] = (
    (("B200",), Accelerator("B200", 8.0 * TB, 2250 * TFLOPS, 4500 * TFLOPS)),
    (("H200", "NVL"), Accelerator("H200 NVL", 4.8 * TB, 835 * TFLOPS, 1671 * TFLOPS)),
    (("H200",), Accelerator("H200 SXM", 4.8 * TB, 989 * TFLOPS, 1979 * TFLOPS)),
    (("H100", "NVL"), Accelerator("H100 NVL", 3.9 * TB, 835 * TFLOPS, 1671 * TFLOPS)),
    (("H100", "PCIE"), Accelerator("H100 PCIe", 2.0 * TB, 756 * TFLOPS, 1513 * TFLOPS)),
    (("H100",), Accelerator("H100 SXM", 3.35 * TB, 989 * TFLOPS, 1979 * TFLOPS)),
    (("A100", "80GB", "PCIE"), Accelerator("A100 80GB PCIe", 1.935 * TB, 312 * TFLOPS)),
    (("A100", "80GB"), Accelerator("A100 80GB SXM", 2.039 * TB, 312 * TFLOPS)),
    (("A100",), Accelerator("A100 40GB", 1.555 * TB, 312 * TFLOPS)),
    (("L40S",), Accelerator("L40S", 0.864 * TB, 362 * TFLOPS, 733 * TFLOPS)),
    (("L4",), Accelerator("L4", 0.3 * TB, 121 * TFLOPS, 242 * TFLOPS)),
    (("A10",), Accelerator("A10", 0.6 * TB, 125 * TFLOPS)),
    (("MI300X",), Accelerator("MI300X", 5.3 * TB, 1307 * TFLOPS, 2615 * TFLOPS)),
)


def accelerator(device_name: str) -> Accelerator | None:
    """The table's entry for a device as vLLM names it ("NVIDIA H100 80GB HBM3"), or None: not in the table."""
    words = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    return next((acc for tags, acc in ACCELERATORS if all(tag in words for tag in tags)), None)


@dataclass(frozen=True)
class Work:
    """What the workload asks of a server per request, averaged over its requests (tokens)."""

    output: float  # the mean reply
    prefill: float  # the mean prompt tokens to compute (a shared prefix, a session's history left out)
    context: float  # the mean unshared context of a decoding sequence, weighted by reply length
    attended: float = 0.0  # the mean context tokens a request's computed tokens attend to, summed over its tokens

    @classmethod
    def of(cls, lengths: Iterable[tuple[int, int]], shared: int = 0, cached_prompts: bool = False) -> "Work":
        """From (prompt, reply) token counts; `shared`: a prefix every prompt starts with (its KV cache and prefill
        shared); `cached_prompts`: a session's turns, whose history the prefix cache may hold (no prefill counted)."""
        pairs = [(max(prompt - shared, 0), out) for prompt, out in lengths]
        if not pairs or not any(out for _, out in pairs):
            raise ValueError("no request with a reply")
        replies = sum(out for _, out in pairs)
        decoded = [out * (p + out / 2) for p, out in pairs]  # a reply's tokens attend to the prompt and each other
        prefilled = [0.0 if cached_prompts else p * p / 2 for p, _ in pairs]
        return cls(output=replies / len(pairs),
                   prefill=0.0 if cached_prompts else sum(p for p, _ in pairs) / len(pairs),
                   context=sum(decoded) / replies, attended=(sum(decoded) + sum(prefilled)) / len(pairs))

    def to_dict(self) -> dict[str, float]:
        return {"output": self.output, "prefill": self.prefill, "context": self.context, "attended": self.attended}


def gpus_of(config: Mapping[str, Any]) -> int:
    """The devices a config runs on: tensor x pipeline x data parallel."""
    n = 1
    for arg in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        n *= int(config.get(arg) or 1)
    return n


@dataclass(frozen=True)
class ModelCost:
    """What one decode step costs each GPU of a config (bytes, FLOPs)."""

    read: float  # weight bytes read per step
    kv: float  # KV-cache bytes per token of context
    flops: float  # FLOPs per token
    fp8: bool  # quantized weights (computed at FP8 where the device has it)
    attention: float = 0.0  # FLOPs per token and context token it attends to

    @classmethod
    def of(cls, shape: ModelShape, config: Mapping[str, Any]) -> "ModelCost":
        """For `config` (engine args, snake_case: its dtype, KV-cache dtype, tensor parallelism)."""
        tp, pp = (int(config.get(arg) or 1) for arg in ("tensor_parallel_size", "pipeline_parallel_size"))
        dtype = serving_dtype_bytes(shape.dtype, config.get("dtype") or "auto")
        kv_dtype = kv_dtype_bytes(config.get("kv_cache_dtype") or "auto", dtype)
        computed = shape.param_count - (0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size)
        kv_heads = max(shape.num_kv_heads // tp, 1)
        return cls(read=(computed * dtype + shape.packed_weight_bytes) / (tp * pp),
                   kv=shape.num_layers / pp * 2 * kv_heads * shape.head_dim * kv_dtype,
                   flops=2 * computed / (tp * pp), fp8=shape.packed_weight_bytes > 0,
                   attention=4 * shape.num_layers / pp * max(shape.num_attention_heads // tp, 1) * shape.head_dim)


@dataclass(frozen=True)
class Bound:
    """The most a config can serve on its devices: a request rate and the output tokens/s it means, at a decode batch
    (None: not limited by the SLO nor a known KV cache) and its step, and what limits it."""

    rate: float
    output_tokens_per_s: float
    batch: int | None
    step_ms: float | None
    slo_batch: int | None  # the largest batch whose step meets the step SLO (None: no TPOT / ITL SLO)
    kv_batch: int | None  # the largest batch the KV cache holds (None: its size unknown)
    limited_by: str  # "compute", "memory bandwidth at the SLO's batch", "memory bandwidth at the KV cache's batch"

    def efficiency(self, rate: float | None) -> float | None:
        """A measured rate as a share of the bound."""
        return rate / self.rate if rate is not None and self.rate > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "output_tokens_per_s": self.output_tokens_per_s, "batch": self.batch,
                "step_ms": self.step_ms, "slo_batch": self.slo_batch, "kv_batch": self.kv_batch,
                "limited_by": self.limited_by}


def bound(device: Accelerator, cost: ModelCost, work: Work, step_slo_ms: float | None = None,
          kv_cache_tokens: int | None = None, max_seqs: int | None = None) -> Bound:
    """The SLO-aware roofline (the module's docstring) of one config: `step_slo_ms`, the tightest p99 TPOT / ITL
    bound; `kv_cache_tokens`, the KV cache vLLM logged (or the memory model predicts) for it; `max_seqs`, the
    max-num-seqs it sets (None: the hardware's batch, whatever the config)."""
    peak = device.peak_flops(cost.fp8)
    per_seq = work.context * cost.kv  # KV bytes a decoding sequence adds to a step

    per_token = cost.flops + cost.attention * work.context  # FLOPs a decoding sequence adds to a step

    def step_s(batch: float) -> float:
        return max((cost.read + batch * per_seq) / device.bandwidth, batch * per_token / peak)

    slo_batch = kv_batch = None
    if step_slo_ms is not None:
        t = step_slo_ms / 1000
        slo_batch = max(int(min((t * device.bandwidth - cost.read) / per_seq, t * peak / per_token)), 0)
    if kv_cache_tokens is not None:
        kv_batch = int(kv_cache_tokens // work.context)
    limits = [b for b in (slo_batch, kv_batch, max_seqs) if b is not None]
    batch = min(limits) if limits else None
    compute = peak / (cost.flops * (work.prefill + work.output) + cost.attention * work.attended)
    if batch == 0:
        decode, step = 0.0, step_s(1)
    elif batch is None:  # the batch grows without a limit: decode's memory time tends to the KV reads alone
        decode, step = device.bandwidth / (work.output * per_seq), None
    else:
        decode, step = batch * device.bandwidth / (work.output * (cost.read + batch * per_seq)), step_s(batch)
    if compute < decode:
        limited_by = "compute"
    else:
        limited_by = ("memory bandwidth at the SLO's batch" if batch is not None and batch == slo_batch
                      else "memory bandwidth at the KV cache's batch" if batch is not None and batch == kv_batch
                      else "memory bandwidth at its max-num-seqs" if batch is not None
                      else "memory bandwidth (the KV cache's reads)")
    rate = min(decode, compute)
    return Bound(rate=rate, output_tokens_per_s=rate * work.output, batch=batch,
                 step_ms=None if step is None else step * 1000, slo_batch=slo_batch, kv_batch=kv_batch,
                 limited_by=limited_by)


def cost_per_million_tokens(price_per_gpu_hour: float, gpus: int, output_tokens_per_s: float) -> float | None:
    """What a million output tokens cost at a rate (None: no tokens)."""
    if output_tokens_per_s <= 0:
        return None
    return price_per_gpu_hour * gpus / (output_tokens_per_s * 3600) * 1e6


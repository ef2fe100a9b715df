"""Which optional knobs a GPU tune searches besides the procedure's, chosen by the workload and the roofline's batch
(`engine.roofline.Bound`), never all at once: each offer names why. A knob the installed vLLM lacks, or a value it
does not list among its choices, is not offered (`search.space.build_space` drops them)."""

import math
from dataclasses import dataclass, field

from servetune.engine.roofline import Bound, Work
from servetune.knobs import knob

# Tokens of decoding context from which an fp8 KV cache pays: break-even near 7k reported on an H100; +11% capacity
# at ~19k on the H200 (docs/results/h200-limit.md).
LONG_CONTEXT = 8000
CAPTURE_CEILING = 512  # vLLM's largest CUDA-graph batch by default (1024 on Blackwell)
MOST_SEQS = 2048  # the largest batch offered: twice vLLM's largest default max-num-seqs


@dataclass(frozen=True)
class Offer:
    """Knobs to search with their values (engine argument -> values, in ladder order), and why each is offered."""

    values: dict[str, tuple] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return "; ".join(f"{arg.replace('_', '-')} {'/'.join(map(str, self.values[arg]))} ({why})"
                         for arg, why in self.why.items())


def offer(flags: dict[str, dict], bound: Bound | None, work: Work | None, itl_bounded: bool) -> Offer:
    """The knobs worth searching for a workload of `work` whose config-independent bound is `bound` (vLLM's defaults'
    KV cache), on a vLLM with engine arguments `flags` (`InstalledVllm.flags`); `itl_bounded`: an SLO bounds ITL."""
    values: dict[str, tuple] = {}
    why: dict[str, str] = {}
    batch = bound.batch if bound is not None else None
    kv_limited = (bound is not None and bound.kv_batch is not None and bound.slo_batch is not None
                  and bound.kv_batch < bound.slo_batch)
    if work is not None and (work.context >= LONG_CONTEXT or kv_limited):
        values["kv_cache_dtype"] = knob("kv_cache_dtype").gpu
        why["kv_cache_dtype"] = (f"decoding contexts average {work.context:,.0f} tokens" if work.context >= LONG_CONTEXT
                                 else f"the KV cache holds a batch of {bound.kv_batch if bound else 0}, below the "
                                      f"{bound.slo_batch if bound else 0} the SLO allows")
    if batch is not None and batch > CAPTURE_CEILING:
        values["max_cudagraph_capture_size"] = (CAPTURE_CEILING, 2 ** math.ceil(math.log2(min(batch, MOST_SEQS))))
        why["max_cudagraph_capture_size"] = f"the roofline's batch ({batch:,}) is above vLLM's {CAPTURE_CEILING}"
    if batch is not None and batch >= 16:
        rung = min(batch, MOST_SEQS) // 16 * 16
        ladder = tuple(sorted({*knob("max_num_seqs").gpu, rung}))
        values["max_num_seqs"] = ladder
        why["max_num_seqs"] = f"a rung at the roofline's batch, {rung}"
    if "performance_mode" in flags:
        choices = flags["performance_mode"].get("choices") or knob("performance_mode").gpu
        values["performance_mode"] = tuple(choices)
        why["performance_mode"] = "this vLLM has it"
    if itl_bounded:
        values["stream_interval"] = knob("stream_interval").gpu
        why["stream_interval"] = "ITL is measured per streamed chunk, so fewer chunks cannot hide a gap"
    listed = {arg: tuple(v for v in values[arg] if not (c := flags[arg].get("choices")) or v in c)
              for arg in values if arg in flags}
    kept = [arg for arg, v in listed.items() if len(v) > 1]
    return Offer({arg: listed[arg] for arg in kept}, {arg: why[arg] for arg in kept})

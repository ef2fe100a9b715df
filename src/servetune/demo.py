"""The demo (`servetune demo`, `make demo`): the embedded tiny model tuned on this machine within a time limit.

It measures the machine first: it launches vLLM's defaults once (on a fresh machine this launch also fills vLLM's
compile caches, the slowest of all), sends the demo's longest prompt a few times, one at a time, and reads the decode
step and the prefill speed off the replies. The demo's SLO follows from them: p99 ITL within 40 ms on a machine as
fast as the one it was written for (this project's VM on a usual day), where a decode step beside the prefill of a
256-token chunk takes ~5 ms, and within as much more on a slower one: the stall that decides the demo (vLLM's
defaults prefill whole prompts of 256-768 tokens between decode steps, a small chunk does not) and the client's
share of the machine both grow with it, so a fixed 40 ms held no rate of either config on a day 2x slower. On a
machine SLOW times slower or more, every level takes as much longer, and the demo measures vLLM's defaults and a
128-token chunk (a reference config, budget 2) instead of searching. The tune is then the one any user runs, with
what is left of the demo's time limit.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

from servetune.engine import Engine, launched
from servetune.loadgen import LoadShape, Target
from servetune.measure.bench import measure_level
from servetune.measure.metrics import itls_ms, ttft_ms
from servetune.workload import build_requests, load_tokenizer, load_workload

WORKLOAD = Path(__file__).parent / "demo_workload.yaml"
BASE_ITL_MS = 40.0  # the demo's SLO on the machine it was written for
CHUNK = 256  # the chunk whose prefill stall the SLO leaves room for
WRITTEN_FOR = (1.3, 66_000.0)  # the decode step (ms) and prefill speed (tokens/s) the probe measured on the slowest
# usual day of this project's VM (docs/results/demo/: 1.3-1.4 ms and 66-78k tokens/s on usual days, 1.8-1.9 ms and
# 48-54k on slow days, 3.5-4.4 ms and 37-41k on the slowest)
SLOW = 3.0  # a machine this many times slower measures the defaults and one small chunk instead of searching
SMALL_CHUNK = {"enable_chunked_prefill": True, "max_num_batched_tokens": 128}
PROBES = 3  # the longest prompt, sent one at a time after a warm-up request


@dataclass(frozen=True)
class MachineSpeed:
    """How fast this machine serves the tiny model, measured with vLLM's defaults and one request at a time."""

    decode_ms: float  # the median gap between tokens
    prefill_tokens_per_s: float

    @property
    def stall_ms(self) -> float:
        """A decode step beside the prefill of a CHUNK-token chunk."""
        return self.decode_ms + CHUNK / self.prefill_tokens_per_s * 1000

    @property
    def slowdown(self) -> float:
        """How many times slower than the machine the demo was written for (its stall, `stall_ms`)."""
        return self.stall_ms / MachineSpeed(*WRITTEN_FOR).stall_ms

    @property
    def slow(self) -> bool:
        """Too slow for the demo's search in a few minutes: every level takes SLOW times as long or more."""
        return self.slowdown >= SLOW

    @property
    def itl_slo_ms(self) -> float:
        """The demo's p99 ITL bound here (the module's docstring)."""
        return float(round(BASE_ITL_MS * max(1.0, self.slowdown)))

    def describe(self) -> str:
        why = (f"the {BASE_ITL_MS:g} ms it was written for" if self.itl_slo_ms == BASE_ITL_MS
               else f"{BASE_ITL_MS:g} ms x {self.slowdown:.1f}: this machine is that much slower than the one it was "
                    f"written for")
        text = (f"this machine: a decode step takes ~{self.decode_ms:.1f} ms and prefill runs at "
                f"~{self.prefill_tokens_per_s:,.0f} tokens/s (vLLM's defaults, one request at a time), so a decode "
                f"step beside a {CHUNK}-token prefill chunk takes ~{self.stall_ms:.0f} ms: the demo's SLO is p99 ITL "
                f"<= {self.itl_slo_ms:g} ms ({why})")
        if self.slow:
            text += (f". It is ~{self.slowdown:.0f}x slower than the machine the demo was written for, where its "
                     f"search takes a few minutes: it measures vLLM's defaults and a "
                     f"{SMALL_CHUNK['max_num_batched_tokens']}-token chunk instead (budget 2)")
        return text


def measure_machine(model: Path, out: Path) -> MachineSpeed:
    """Launch vLLM's defaults with the tiny model at `model`, time the demo's longest prompt, stop it. EngineFailed
    when vLLM does not start."""
    model = model.resolve()  # vLLM takes a relative path for a model hub name
    spec = load_workload(WORKLOAD)
    requests = build_requests(spec, load_tokenizer(model), count=50)
    longest = max(requests, key=lambda r: r.prompt_len)
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine(str(model), {}, out / "machine.log")
    with launched(engine):
        shape = LoadShape(max_concurrency=1, warmup_requests=1)
        result = measure_level(Target(engine.base_url, str(model), spec.endpoint), [longest] * (1 + PROBES), shape)
    timed = [r for r in result.load.records if r.ok and not r.warmup]
    if not timed:
        raise RuntimeError(f"none of the demo's probe requests came back: {result.metrics.errors}")
    decode = statistics.median(gap for r in timed for gap in itls_ms(r))
    prefill_s = max(1e-3, (statistics.median(ttft_ms(r) for r in timed) - decode) / 1000)
    return MachineSpeed(decode_ms=decode, prefill_tokens_per_s=longest.prompt_len / prefill_s)


REFERENCE = "small-chunk.yaml"  # the demo's reference config on a slow machine, in its output directory


def write_small_chunk(out: Path) -> Path:
    """The 128-token chunk as a reference config file in `out` (`tune --reference-config`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / REFERENCE
    path.write_text("".join(f"{key.replace('_', '-')}: {str(value).lower()}\n" for key, value in SMALL_CHUNK.items()))
    return path

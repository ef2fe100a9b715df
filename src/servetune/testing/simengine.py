"""A simulated engine on a simulated clock: the real tuner, time plan, trials and verdicts run against it, so a tune
with a 15-minute limit runs in about a second and hundreds of scenarios can be checked (`tests/test_simulated.py`,
`bench/simulate.py`). Vidur and BestServe show that simulators of LLM serving plan well enough; this one is far
simpler: it needs only to make configs differ the ways real ones do.

A scenario (`Scenario`) fixes the machine and the physics. Launches take `launch_s` (the first on a machine
`cold_s`, filling the compile caches), and a config may fail to start (`fail_share`). Each config is a queueing
model (`ConfigModel`):
- capacity: requests per second completed at full load. Prefill in chunks costs steps, so capacity grows with the
  chunk (`chunk_cost`: capacity x C / (C + chunk_cost) for a mean chunk C), and every other knob value scales it
  by a factor of its own (`effects`);
- latency grows with load rho = rate / capacity: TTFT by (1 + 2 rho^2), a decode gap by (1 + rho), each
  lognormal; the server holds capacity x latency requests at once (its batch), and a request arriving while all
  are busy waits in a FIFO queue, so past capacity the queue and TTFT grow without end;
- prefill stalls: a decode gap that shares its step with a prefill chunk also takes the chunk's prefill time.
  Whole prompts (the defaults' large steps) stall long and seldom, small chunks briefly and often.
A level's requests get timestamps drawn from that model and are handed to the trial's own `should_stop` in
completion order, the clock at each completion (and every WATCH_S between): the tuner decides as it would against a
real server. `true_goodput` finds a model's goodput rate from long simulated runs, for judging the tuner's answers.
"""

import hashlib
import heapq
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from servetune.engine import EngineFailed, InstalledVllm, LaunchFailure, StartupFacts
from servetune.engine.logfacts import FailureKind
from servetune.executors import Job
from servetune.loadgen import LoadShape, RequestRecord
from servetune.loadgen.arrival import ArrivalProcess, schedule_ns
from servetune.loadgen.records import LoadResult
from servetune.measure.bench import LevelResult
from servetune.measure.metrics import summarize
from servetune.study.outcome import Failure, TrialOutcome
from servetune.study.results import Results, write_outputs
from servetune.testing.installed import VLLM_CPU, VLLM_H200
from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions, TrialPlan, run_trial
from servetune.tuner.loop import OUT_OF_TIME, Runtime, TuneOptions, tune
from servetune.workload import RequestSpec, WorkloadSpec

START = 1_800_000_000.0  # the simulated clock's epoch seconds at the start of a scenario
WATCH_S = 2.0  # between completions, `should_stop` is asked this often (the real runner: every 0.25 s)
LEVEL_OVERHEAD_S = 0.3  # emptying the prefix cache, opening connections
STOP_S = 4.0  # stopping a server
WHOLE = 1 << 30  # a chunk that holds any prompt


class SimClock:
    """Epoch seconds that pass only when the simulated engine says so."""

    def __init__(self, start: float = START):
        self.now = start

    def time(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


@dataclass(frozen=True)
class ConfigModel:
    """How one config serves the scenario's workload (see the module's docstring)."""

    capacity: float  # req/s at full load
    itl_ms: float  # an unloaded decode gap
    prefill_ms_per_token: float
    chunk: int  # prefill tokens per step (WHOLE: whole prompts)
    ttft_noise: float = 0.25  # lognormal sigmas
    gap_noise: float = 0.15


@dataclass(frozen=True)
class Scenario:
    """A machine, a workload and its physics, SLOs and a tune's options; `model` gives any config's `ConfigModel`."""

    seed: int
    workload: dict[str, Any]
    slo: dict[str, float]
    device: str = "cpu"  # cpu | gpu: the installed vLLM (its knobs) and the launch times
    cold_s: float = 120.0  # the first launch
    launch_s: float = 50.0  # later launches (lognormal, sigma 0.15)
    capacity: float = 20.0  # req/s of the best chunking at full load
    itl_ms: float = 5.0
    prefill_ms_per_token: float = 0.1
    chunk_cost: float = 64.0  # tokens of prefill a step's overhead is worth
    default_chunk: int = 4096  # the defaults' max-num-batched-tokens
    seqs_needed: int = 64  # max-num-seqs below this cuts capacity
    effects: dict[str, float] = field(default_factory=dict)  # "knob=value" -> capacity factor
    fail_share: float = 0.0  # configs (not the defaults, unless 1: all) that fail to start
    budget: int = 4
    limit_s: float | None = 900.0
    strategy: str = "optuna"
    references: tuple[dict[str, Any], ...] = ()  # configs measured as given, after the defaults
    level_requests: int = 600
    max_levels: int = 6

    @property
    def vllm(self) -> InstalledVllm:
        return VLLM_CPU if self.device == "cpu" else VLLM_H200

    def model(self, config: dict[str, Any], mean_prompt: float) -> ConfigModel:
        """The queueing model of `config` on prompts of `mean_prompt` tokens."""
        chunked = config.get("enable_chunked_prefill", True)
        chunk = int(config.get("max_num_batched_tokens") or self.default_chunk)
        chunk = chunk if chunked else WHOLE
        step = min(chunk, mean_prompt)
        capacity = self.capacity * step / (step + self.chunk_cost)
        seqs = config.get("max_num_seqs")
        if seqs is not None:
            capacity *= min(1.0, (seqs / self.seqs_needed) ** 0.5)
        for knob, value in config.items():
            capacity *= self.effects.get(f"{knob}={value}", 1.0)
        return ConfigModel(capacity=capacity, itl_ms=self.itl_ms, prefill_ms_per_token=self.prefill_ms_per_token,
                           chunk=chunk)

    def fails(self, config: dict[str, Any]) -> bool:
        """Whether `config` fails to start: a seeded share of the configs, not the defaults (unless all fail)."""
        if self.fail_share >= 1:
            return True
        if not config or not self.fail_share:
            return False
        return _unit(self.seed, "fail", config) < self.fail_share

    def launch_time(self, config: dict[str, Any], nth: int) -> float:
        """Seconds the `nth` launch (0: the first on this machine) takes to be ready."""
        base = self.cold_s if nth == 0 else self.launch_s
        return base * math.exp(0.15 * _normal(self.seed, "launch", config, nth))


def _digest(*parts: Any) -> int:
    return int.from_bytes(hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(),
                                          digest_size=8).digest(), "big")


def _unit(*parts: Any) -> float:
    """A seeded uniform number in [0, 1) for these parts."""
    return _digest(*parts) / 2**64


def _normal(*parts: Any) -> float:
    return float(np.random.default_rng(_digest(*parts)).standard_normal())


# -- one level --------------------------------------------------------------------------------------------------


@dataclass
class Draws:
    """One level's requests as the model serves them (ms after the level's origin): when each is due, its first
    token and when it ends, and every decode gap (`gaps`, request by request: `counts` each)."""

    due_ms: np.ndarray
    first_ms: np.ndarray
    end_ms: np.ndarray
    gaps: np.ndarray
    counts: np.ndarray

    def tpot_ms(self) -> np.ndarray:
        sums = np.bincount(np.repeat(np.arange(len(self.counts)), self.counts), self.gaps, len(self.counts))
        return sums / np.maximum(self.counts, 1)


def serve(model: ConfigModel, rate: float, prompts: np.ndarray, outputs: np.ndarray, due_ms: np.ndarray,
          rng: np.random.Generator) -> Draws:
    """Timestamps of requests due at `due_ms` (ms) with these prompt and output lengths, at offered `rate` req/s."""
    n = len(prompts)
    rho = min(1.0, rate / model.capacity) if math.isfinite(rate) else 1.0
    offered = rate if math.isfinite(rate) else model.capacity
    steps = np.minimum(prompts, model.chunk)
    stall_ms = model.itl_ms * (1 + rho) + steps * model.prefill_ms_per_token
    chunks = np.ceil(prompts / np.maximum(steps, 1))
    stalled = min(0.95, offered * float(np.mean(chunks * stall_ms)) / 1000) if n else 0.0
    ttft = ((prompts * model.prefill_ms_per_token + model.itl_ms) * (1 + 2 * rho ** 2)
            * np.exp(model.ttft_noise * rng.standard_normal(n)))
    counts = np.maximum(outputs - 1, 0).astype(np.int64)
    gaps = model.itl_ms * (1 + rho) * np.exp(model.gap_noise * rng.standard_normal(int(counts.sum())))
    owner = np.repeat(np.arange(n), counts)
    stall = rng.random(len(gaps)) < stalled
    gaps[stall] += (stall_ms[owner[stall]] - model.itl_ms * (1 + rho)) * np.exp(0.1 * rng.standard_normal(
        int(stall.sum())))
    alone = ttft + np.bincount(owner, gaps, n)
    slots = max(1, round(model.capacity * float(np.mean(alone)) / 1000)) if n else 1
    free = [0.0] * slots  # when each batch slot frees up: a request waits only when every slot is busy
    start = np.empty(n)
    for i in np.argsort(due_ms, kind="stable"):
        start[i] = max(due_ms[i], heapq.heappop(free))
        heapq.heappush(free, start[i] + alone[i])
    return Draws(due_ms, start + ttft, start + alone, gaps, counts)


class SimServer:
    """A launched config of a scenario on the simulated clock (`servetune.trial.server.Server`)."""

    def __init__(self, scenario: Scenario, clock: SimClock, launches: list[int], plan: TrialPlan,
                 engine_args: dict[str, Any], log_path: Path, startup_timeout_s: float):
        self.scenario, self.clock, self.launches = scenario, clock, launches
        self.engine_args, self.log_path, self.startup_timeout_s = dict(engine_args), log_path, startup_timeout_s
        prompts = [r.prompt_len for s in plan.level_sets for r in s]
        self.model = scenario.model(self.engine_args, float(np.mean(prompts)))
        self.levels = 0
        self.up = False

    def start(self) -> StartupFacts:
        ready_s = self.scenario.launch_time(self.engine_args, len(self.launches))
        self.launches.append(1)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"simulated server {self.engine_args}\n")
        if ready_s > self.startup_timeout_s:
            self.clock.advance_to(self.clock.now + self.startup_timeout_s)
            raise EngineFailed(LaunchFailure(FailureKind.TIMEOUT, f"not ready after {self.startup_timeout_s:.0f} s",
                                             str(self.log_path)))
        if self.scenario.fails(self.engine_args):
            self.clock.advance_to(self.clock.now + ready_s / 3)
            raise EngineFailed(LaunchFailure(FailureKind.OOM, "CUDA out of memory (simulated)", str(self.log_path)))
        self.clock.advance_to(self.clock.now + ready_s)
        self.up = True
        return StartupFacts(ready_s=ready_s)

    def preflight(self, requests: Sequence[RequestSpec]) -> Failure | None:
        return None

    def alive(self) -> bool:
        return self.up

    def stop(self) -> None:
        if self.up:
            self.clock.advance_to(self.clock.now + STOP_S)
        self.up = False

    def level(self, requests: Sequence[RequestSpec], shape: LoadShape,
              on_record: Callable[[RequestRecord], None] | None,
              should_stop: Callable[[Sequence[RequestRecord]], bool]) -> LevelResult:
        self.levels += 1
        rng = np.random.default_rng(_digest(self.scenario.seed, self.engine_args, self.levels, shape.seed))
        self.clock.advance_to(self.clock.now + LEVEL_OVERHEAD_S)
        warm = list(requests[: shape.warmup_requests])
        records: list[RequestRecord] = []
        if warm:
            draws = serve(self.model, math.inf, *_lengths(warm), np.zeros(len(warm)), rng)
            records += _records(warm, draws, self.clock.now, range(len(warm)), warmup=True)
            self.clock.advance_to(self.clock.now + float(draws.end_ms.max()) / 1000)
        timed = list(requests[len(warm):])
        origin = self.clock.now
        due = np.array(schedule_ns(ArrivalProcess(shape.request_rate, shape.burstiness, shape.seed), len(timed))) / 1e6
        draws = serve(self.model, shape.request_rate, *_lengths(timed), due, rng)
        made = _records(timed, draws, origin, range(len(warm), len(requests)))
        stopped_at = self._feed(made, origin, on_record, should_stop)
        end = stopped_at if stopped_at is not None else max((r.end_ns for r in made), default=0) / 1e9
        self.clock.advance_to(end)
        if stopped_at is not None:
            made = _cut(made, int(stopped_at * 1e9))
        records += made
        load = LoadResult(records, shape.request_rate, shape.burstiness, shape.max_concurrency, int(origin * 1e9),
                          int(self.clock.now * 1e9), stopped_at is not None)
        return LevelResult(load, summarize(load), {"num_preemptions": 0.0})

    def _feed(self, made: list[RequestRecord], origin: float, on_record: Callable | None,
              should_stop: Callable[[Sequence[RequestRecord]], bool]) -> float | None:
        """Hand the timed records to `should_stop` in completion order with the clock at each completion, asking
        every WATCH_S between completions too; the time it said stop (None: it never did)."""
        finished: list[RequestRecord] = []
        asked = origin
        for record in sorted(made, key=lambda r: r.end_ns):
            done = record.end_ns / 1e9
            while done - asked > WATCH_S:
                asked += WATCH_S
                self.clock.advance_to(asked)
                if should_stop(finished):
                    return asked
            self.clock.advance_to(done)
            asked = done
            finished.append(record)
            if on_record is not None:
                on_record(record)
            if should_stop(finished):
                return done
        return None


def _lengths(requests: Sequence[RequestSpec]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r.prompt_len for r in requests], dtype=float),
            np.array([r.output_len for r in requests], dtype=float))


def _records(requests: Sequence[RequestSpec], draws: Draws, origin: float, indices: range,
             warmup: bool = False) -> list[RequestRecord]:
    base = int(origin * 1e9)
    offsets = np.concatenate([[0], np.cumsum(draws.counts)])
    made = []
    for k, (spec, index) in enumerate(zip(requests, indices)):
        due = base + int(draws.due_ms[k] * 1e6)
        first = base + int(draws.first_ms[k] * 1e6)
        gaps = draws.gaps[offsets[k]:offsets[k + 1]]
        chunks = [first] + (first + (np.cumsum(gaps) * 1e6).astype(np.int64)).tolist()
        made.append(RequestRecord(index, spec.prompt_len, spec.output_len, warmup, due, start_ns=due, chunk_ns=chunks,
                                  end_ns=chunks[-1], output_tokens=spec.output_len, prompt_tokens=spec.prompt_len))
    return made


def _cut(made: list[RequestRecord], at_ns: int) -> list[RequestRecord]:
    """The records of a level stopped at `at_ns`: those not yet due were never sent, those in flight cancelled."""
    kept = []
    for r in made:
        if r.start_ns > at_ns:
            continue
        if r.end_ns > at_ns:
            r = replace(r, chunk_ns=[c for c in r.chunk_ns if c <= at_ns], end_ns=at_ns, output_tokens=None,
                        error="cancelled")
        kept.append(r)
    return kept


class SimExecutor:
    """Runs each trial of a tune on the scenario's simulated engine, one at a time (`servetune.executors.Executor`)."""

    slots = 1

    def __init__(self, scenario: Scenario, clock: SimClock):
        self.scenario, self.clock = scenario, clock
        self.launches: list[int] = []

    def probe(self) -> InstalledVllm:
        return self.scenario.vllm

    def misfit(self, job: Job) -> str | None:
        return None

    def _launch(self, plan: TrialPlan, engine_args: dict[str, Any], log_path: Path, timeout_s: float) -> SimServer:
        return SimServer(self.scenario, self.clock, self.launches, plan, engine_args, log_path, timeout_s)

    def submit(self, job: Job) -> Future[TrialOutcome]:
        future: Future[TrialOutcome] = Future()
        future.set_result(run_trial(job.plan, job.config, job.out_dir, budget=job.budget,
                                    launch=self._launch, clock=self.clock))
        return future

    def close(self) -> None:
        pass


# -- a whole tune -----------------------------------------------------------------------------------------------


def lengths_only(spec: WorkloadSpec, tokenizer: Any, *, seed: int | None = None,
                 count: int | None = None) -> list[RequestSpec]:
    """Requests with the workload's prompt and reply lengths and a placeholder for the text: all the simulated
    engine reads of a request (`build_requests` makes each prompt token-exact, which takes seconds)."""
    rng = np.random.default_rng(spec.seed if seed is None else seed)
    count = spec.num_requests if count is None else count
    prompts, outputs = spec.input_len.sample(rng, count), spec.output_len.sample(rng, count)
    return [RequestSpec("", int(p), int(o), min_model_len=int(p + o)) for p, o in zip(prompts, outputs)]


@dataclass(frozen=True)
class SimResult:
    """A simulated tune: its summary, its measured trials' rows, and how long it took on the simulated clock."""

    summary: Any  # results.Summary
    rows: list[Any]  # results.TrialRow, every launched trial
    elapsed_s: float
    budget: int

    @property
    def ended_by(self) -> str:
        """What ended it: the `budget` (every launch made), the `search` (the strategy had nothing left), or the
        `time` limit (launches left that no longer fit)."""
        if any(f"trials {OUT_OF_TIME}:" in item for item in self.summary.not_done):
            return "time"
        return "budget" if len(self.rows) >= self.budget else "search"


def simulate(scenario: Scenario, model: Path, out: Path, hooks: Hooks = Hooks()) -> SimResult:
    """Run a whole tune of `scenario` (the tiny model at `model` gives the tokenizer's context) on the simulated
    engine, with the real tuner, plan and verdicts; its outputs (summary.json and the rest, not the report's charts)
    in `out`."""
    clock = SimClock()
    opts = TuneOptions(model=str(model), workload=WorkloadSpec.model_validate(scenario.workload), out=out,
                       slo=dict(scenario.slo), strategy=scenario.strategy, budget=scenario.budget,
                       time_limit_s=scenario.limit_s, seed=scenario.seed, references=list(scenario.references),
                       levels=LevelOptions(requests=scenario.level_requests, max_levels=scenario.max_levels))
    published: list[Results] = []

    def outputs(results: Results, out: Path) -> None:
        published.append(results)
        out.mkdir(parents=True, exist_ok=True)
        write_outputs(results, out)

    runtime = Runtime(clock=clock, publish=outputs, build_requests=lengths_only,
                      storage=optuna.storages.InMemoryStorage())
    summary = tune(opts, hooks, SimExecutor(scenario, clock), runtime)
    return SimResult(summary, published[-1].rows, clock.now - START, scenario.budget)


# -- judging answers --------------------------------------------------------------------------------------------


TRUE_REQUESTS = 2000


def true_goodput(model: ConfigModel, slo: dict[str, float], workload: WorkloadSpec, seed: int = 7) -> float:
    """The highest rate (req/s) at which `model` holds every p99 SLO in `slo` and keeps up, from runs of
    TRUE_REQUESTS Poisson arrivals (bisection to 2%)."""
    rng = np.random.default_rng(seed)
    prompts = workload.input_len.sample(rng, TRUE_REQUESTS).astype(float)
    outputs = workload.output_len.sample(rng, TRUE_REQUESTS).astype(float)

    def holds(rate: float) -> bool:
        due = np.cumsum(rng.exponential(1000 / rate, TRUE_REQUESTS))
        draws = serve(model, rate, prompts, outputs, due, np.random.default_rng(seed))
        e2el = draws.end_ms - draws.due_ms
        steady = draws.end_ms[-1] - draws.due_ms[-1] < 2 * float(np.median(e2el)) + 1000 / rate * 20
        values = _latencies(draws)
        return steady and all(np.percentile(values[name], 99) <= bound for name, bound in slo.items())

    low, high = 0.0, model.capacity
    if not holds(high * 0.01):
        return 0.0
    low = high * 0.01
    while (high - low) / high > 0.02:
        mid = (low + high) / 2
        low, high = (mid, high) if holds(mid) else (low, mid)
    return low


# -- scenarios --------------------------------------------------------------------------------------------------


WORKLOADS = {
    "demo": {"input_len": {"type": "uniform", "min": 256, "max": 768},
             "output_len": {"type": "uniform", "min": 16, "max": 32}},
    "chat": {"input_len": {"type": "lognormal", "mean": 300, "std": 300, "min": 32, "max": 1500},
             "output_len": {"type": "uniform", "min": 32, "max": 96}},
    "long-prompt": {"input_len": {"type": "uniform", "min": 1024, "max": 3000},
                    "output_len": {"type": "uniform", "min": 16, "max": 48}},
    "decode-heavy": {"input_len": {"type": "uniform", "min": 64, "max": 256},
                     "output_len": {"type": "uniform", "min": 96, "max": 160}},
}


def draw_scenario(seed: int, limit_s: float | None = 900.0, **fixed: Any) -> Scenario:
    """A random scenario (seeded): a CPU or GPU machine from very slow to fast, one of WORKLOADS, a budget of 3-6,
    a share of configs that fail to start, and one SLO or two. An ITL bound sits between a small chunk's prefill
    stall and a whole prompt's (chunking decides it, as in the demo); other bounds are the p99 that a reference
    config (the defaults, or a chunk of the ladder) shows at 30-90% of its capacity, raised by 15-50% (a bound the
    p99 only grazes at every rate is not decided by any level)."""
    rng = np.random.default_rng([seed, 2026])

    def log_uniform(low: float, high: float) -> float:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))

    device = "gpu" if rng.random() < 0.3 else "cpu"
    workload = {"num_requests": 400, "seed": int(seed % 1000)} | WORKLOADS[str(rng.choice(list(WORKLOADS)))]
    spec = WorkloadSpec.model_validate(workload)
    prompt = spec.input_len.mean_len
    effects = {f"enable_prefix_caching={v}": float(rng.uniform(0.9, 1.05)) for v in (True, False)}
    effects |= {f"enforce_eager={v}": float(rng.uniform(0.6, 1.0) if v else 1.0) for v in (True, False)}
    effects |= {f"cpu_kvcache_space_gib={v}": float(rng.uniform(0.75, 1.05)) for v in (0.25, 0.5, 1, 2)}
    cold, later = ((log_uniform(60, 240), log_uniform(25, 90)) if device == "cpu"
                   else (log_uniform(120, 240), log_uniform(50, 120)))
    scenario = Scenario(
        seed=seed, workload=workload, slo={}, device=device, cold_s=cold, launch_s=later,
        capacity=log_uniform(0.3, 60) if device == "cpu" else log_uniform(2, 100), itl_ms=log_uniform(3, 30),
        prefill_ms_per_token=log_uniform(5, 400) / prompt, chunk_cost=log_uniform(16, 256),
        default_chunk=4096 if device == "cpu" else 8192, seqs_needed=int(rng.choice([16, 32, 64, 128, 256])),
        effects=effects, fail_share=float(rng.choice([0.0, 0.1, 0.3])), budget=int(rng.integers(3, 7)),
        limit_s=limit_s, level_requests=int(rng.choice([400, 600])), max_levels=int(rng.integers(4, 7)))
    kinds = [["itl_p99_ms"], ["tpot_p99_ms"], ["ttft_p99_ms"], ["ttft_p99_ms", "itl_p99_ms"], ["e2el_p99_ms"]]
    names = kinds[int(rng.integers(len(kinds)))]
    reference = {} if rng.random() < 0.5 else {"enable_chunked_prefill": True,
                                                "max_num_batched_tokens": int(rng.choice([128, 256, 512, 1024]))}
    p99 = _p99s(scenario.model(reference, prompt), float(rng.uniform(0.3, 0.9)), spec, rng)
    chunk = float(rng.choice([128, 256, 512]))
    itl_bound = 2 * scenario.itl_ms + chunk * scenario.prefill_ms_per_token
    slo = {name: round(itl_bound if name == "itl_p99_ms" else p99[name] * float(rng.uniform(1.15, 1.5)), 1)
           for name in names}
    return replace(scenario, **({"slo": slo} | fixed))


def _p99s(model: ConfigModel, rho: float, workload: WorkloadSpec, rng: np.random.Generator) -> dict[str, float]:
    """Each latency SLO's p99 of `model` at `rho` of its capacity."""
    prompts = workload.input_len.sample(rng, TRUE_REQUESTS).astype(float)
    outputs = workload.output_len.sample(rng, TRUE_REQUESTS).astype(float)
    rate = rho * model.capacity
    draws = serve(model, rate, prompts, outputs, np.cumsum(rng.exponential(1000 / rate, TRUE_REQUESTS)), rng)
    return {name: float(np.percentile(values, 99)) for name, values in _latencies(draws).items()}


def _latencies(draws: Draws) -> dict[str, np.ndarray]:
    """Each latency SLO's values (ITL: every gap)."""
    return {"ttft_p99_ms": draws.first_ms - draws.due_ms, "e2el_p99_ms": draws.end_ms - draws.due_ms,
            "itl_p99_ms": draws.gaps if len(draws.gaps) else np.zeros(1), "tpot_p99_ms": draws.tpot_ms()}


LADDER = (128, 256, 512, 1024, 2048)  # the chunks `judge` finds the best config among
CLEAR_GAIN = 1.3  # a config this much better than the defaults is one a tune must name
DECIDABLE_RATE = 5.0  # req/s: a deciding level (300 requests) of a config this fast takes at most a minute


@dataclass(frozen=True)
class Judged:
    """A simulated tune held against the model's truth: the true goodput rate (req/s) of vLLM's defaults, of the
    config it recommends and of the best config of the chunk ladder (chunked prefill at each of LADDER)."""

    defaults: float
    recommended: float | None
    best: float
    recommends_defaults: bool

    @property
    def clear_gain(self) -> bool:
        """A config of the ladder beats the defaults by CLEAR_GAIN (or holds a rate where they hold none)."""
        return self.best > 0 and self.best >= CLEAR_GAIN * self.defaults

    @property
    def decidable(self) -> bool:
        """The clearly better config is fast enough that a deciding level of it takes at most a minute."""
        return self.clear_gain and self.best >= DECIDABLE_RATE

    @property
    def named(self) -> bool:
        """The tune recommends a config (not the defaults) that truly beats the defaults by CLEAR_GAIN."""
        return (not self.recommends_defaults and bool(self.recommended)
                and self.recommended >= CLEAR_GAIN * self.defaults)


def judge(scenario: Scenario, result: SimResult) -> Judged:
    """`result`'s recommendation against the model's truth (`true_goodput`)."""
    workload = WorkloadSpec.model_validate(scenario.workload)
    prompt = workload.input_len.mean_len

    def truth(config: dict[str, Any]) -> float:
        return true_goodput(scenario.model(config, prompt), scenario.slo, workload)

    summary = result.summary
    best = summary.best
    defaults = summary.default is not None and best is not None and best.trial == summary.default.trial
    return Judged(defaults=truth({}), recommended=truth(best.config) if best is not None else None,
                  best=max(truth({"enable_chunked_prefill": True, "max_num_batched_tokens": c}) for c in LADDER),
                  recommends_defaults=defaults or best is None)

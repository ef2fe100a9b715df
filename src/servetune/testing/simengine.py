"""A simulated engine on a simulated clock: the real tuner, time plan, trials and verdicts run against it, so a tune
with a 15-minute limit runs in seconds and hundreds of scenarios can be checked
(`tests/integration/test_simulated.py`, `bench/simulate.py`). Vidur and BestServe show that simulators of LLM
serving plan well enough; this one needs only to serve the way a continuous-batching engine does, and to know its
own truth.

A scenario (`Scenario`) fixes the machine, the workload, the SLOs and the tune's options. Launches take `launch_s`
(the first on a machine `cold_s`, filling the compile caches), and a config may fail to start (`fail_share`). Each
config runs on `servetune.testing.batching`: vLLM's scheduler step by step (a step's time from the requests it
decodes and the prompt tokens it prefills, `max_num_seqs`, the token budget `max_num_batched_tokens`, the KV
cache, a FIFO queue past them, preemption), with the machine's noise and stalls. A level's requests get their
timestamps from it and are handed to the trial's own `should_stop` in completion order, the clock at each
completion (and every WATCH_S between): the tuner decides as it would against a real server.

Each scenario knows its truth (`true_goodput`): the highest rate at which a config holds every p99 SLO over long
steady runs pooled (TRUE_RUNS of them) and does not exceed its saturated throughput; `judge` holds every trial's
measured goodput and the recommendation against it.
"""

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from servetune.device import DeviceKind
from servetune.engine import EngineFailed, InstalledVllm, LaunchFailure, StartupFacts
from servetune.engine.logfacts import FailureKind
from servetune.executors import Job
from servetune.loadgen import LoadShape, RequestRecord
from servetune.loadgen.records import LoadResult
from servetune.loadgen.runner import due_times
from servetune.measure.bench import LevelResult
from servetune.measure.metrics import summarize
from servetune.measure.slo import parse_slo
from servetune.study.outcome import Failure, TrialOutcome
from servetune.study.results import Results, write_outputs
from servetune.testing.batching import Physics, Served, serve
from servetune.testing.installed import VLLM_CPU, VLLM_H200
from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions, TrialPlan, run_trial
from servetune.tuner.loop import Runtime, TuneOptions, tune
from servetune.workload import RequestSpec, WorkloadSpec
from servetune.workload.spec import LogNormal, Normal, Uniform

START = 1_800_000_000.0  # the simulated clock's epoch seconds at the start of a scenario
WATCH_S = 2.0  # between completions, `should_stop` is asked this often (the real runner: every 0.25 s)
LEVEL_OVERHEAD_S = 0.3  # emptying the prefix cache, opening connections
FIRST_PASS = 0.4  # of a level's arrivals served first: most levels stop within them (causality keeps it exact)
STOP_S = 4.0  # stopping a server
DEFAULTS = {DeviceKind.CPU: (2048, 128), DeviceKind.GPU: (8192, 1024)}  # vLLM's max-num-batched-tokens and max-num-seqs


class SimClock:
    """Epoch seconds that pass only when the simulated engine says so."""

    def __init__(self, start: float = START):
        self.now = start

    def time(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


@dataclass(frozen=True)
class Scenario:
    """A machine, a workload, SLOs and a tune's options; `physics` gives any config's engine."""

    seed: int
    workload: dict[str, Any]
    slo: dict[str, float]
    device: DeviceKind = DeviceKind.CPU  # the installed vLLM (its knobs), vLLM's defaults and the launch times
    cold_s: float = 120.0  # the first launch
    launch_s: float = 50.0  # later launches (lognormal, sigma 0.15)
    step_ms: float = 2.0  # the machine with vLLM's defaults: a step's fixed cost,
    decode_ms: float = 0.1  # per request decoded,
    prefill_ms_per_token: float = 0.02  # per prompt token prefilled
    kv_tokens: int = 1 << 19  # the defaults' KV cache
    noise: float = 0.08  # lognormal sigma of a step
    stall_share: float = 0.0  # steps that stall (a busy machine), and for how long
    stall_ms: float = 0.0
    effects: dict[str, float] = field(default_factory=dict)  # "knob=value" -> factor on a step's time (KV knobs: size)
    fail_share: float = 0.0  # configs (not the defaults, unless 1: all) that fail to start
    budget: int = 4
    limit_s: float | None = 900.0
    strategy: str = "optuna"
    references: tuple[dict[str, Any], ...] = ()  # configs measured as given, after the defaults
    level_requests: int = 600
    max_levels: int = 6

    @property
    def vllm(self) -> InstalledVllm:
        return VLLM_CPU if self.device == DeviceKind.CPU else VLLM_H200

    def physics(self, config: dict[str, Any]) -> Physics:
        """The engine that serves `config` here: vLLM's defaults where it sets nothing (max-num-seqs at most the
        token budget, as vLLM defaults it); a knob's effect scales a step's time (the KV cache knobs: the cache's
        size, never below what the workload's longest request needs, as vLLM refuses to start without it)."""
        chunk, seqs = DEFAULTS[self.device]
        chunk = int(config.get("max_num_batched_tokens") or chunk)
        slower, kv = 1.0, float(self.kv_tokens)
        for knob, value in config.items():
            effect = self.effects.get(f"{knob}={value}", 1.0)
            if knob in ("cpu_kvcache_space_gib", "gpu_memory_utilization"):
                kv *= effect
            else:
                slower *= effect
        spec = WorkloadSpec.model_validate(self.workload)
        bounded = (Uniform, Normal, LogNormal)  # the scenarios' lengths (WORKLOADS): none is Fixed
        assert isinstance(spec.input_len, bounded) and isinstance(spec.output_len, bounded)
        longest = (spec.input_len.max or spec.input_len.low) + (spec.output_len.max or spec.output_len.low)
        return Physics(step_ms=self.step_ms * slower, decode_ms=self.decode_ms * slower,
                       prefill_ms_per_token=self.prefill_ms_per_token * slower,
                       max_num_seqs=int(config.get("max_num_seqs") or min(seqs, chunk)), max_batched_tokens=chunk,
                       kv_tokens=int(max(kv, 2 * longest)), noise=self.noise, stall_share=self.stall_share,
                       stall_ms=self.stall_ms)

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


class SimServer:
    """A launched config of a scenario on the simulated clock (`servetune.trial.server.Server`)."""

    def __init__(self, scenario: Scenario, clock: SimClock, launches: list[int], plan: TrialPlan,
                 engine_args: dict[str, Any], log_path: Path, startup_timeout_s: float):
        self.scenario, self.clock, self.launches = scenario, clock, launches
        self.engine_args, self.log_path, self.startup_timeout_s = dict(engine_args), log_path, startup_timeout_s
        self.physics = scenario.physics(self.engine_args)
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
        return StartupFacts(ready_s=ready_s, kv_cache_tokens=self.physics.kv_tokens)

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
        key = _digest(self.scenario.seed, self.engine_args, self.levels, shape.seed)
        rng = np.random.default_rng(key)
        self.clock.advance_to(self.clock.now + LEVEL_OVERHEAD_S)
        warm = list(requests[: shape.warmup_requests])
        records: list[RequestRecord] = []
        began = self.clock.now
        if warm:
            served = serve(self.physics, np.zeros(len(warm)), *_lengths(warm), rng,
                           max_concurrency=shape.max_concurrency)
            records += [_record(warm[i], i, served, i, self.clock.now, warmup=True) for i in range(len(warm))]
            stopped = self._wait(self.clock.now + float(np.nanmax(served.end_ms)) / 1000, should_stop)
            if stopped is not None:  # the warm-up outlasted the level's deadline
                load = LoadResult(records, shape.request_rate, shape.burstiness, shape.max_concurrency,
                                  int(began * 1e9), int(stopped * 1e9), True)
                return LevelResult(load, summarize(load), {"num_preemptions": 0.0})
        timed = list(requests[len(warm):])
        origin = self.clock.now
        due_ms = np.array(due_times(timed, 0, shape.request_rate, shape.burstiness, shape.seed)[0]) / 1e6
        finished: list[RequestRecord] = []
        first_pass = float(due_ms[int(len(due_ms) * FIRST_PASS)]) if len(due_ms) else 0.0
        for horizon_ms in ((first_pass, math.inf) if first_pass > 0 else (math.inf,)):
            served = serve(self.physics, due_ms, *_lengths(timed), np.random.default_rng(key + 1), horizon_ms,
                           max_concurrency=shape.max_concurrency)  # the same up to the horizon, whatever follows
            stopped_at = self._feed(timed, served, origin, len(warm), on_record, should_stop, finished, horizon_ms)
            if stopped_at is not None:  # a level stopped early needs only its first part served
                break
        if stopped_at is not None:
            records += finished + self._cancelled(timed, served, origin, len(warm), finished, stopped_at)
        else:
            records += finished
        ends = [r.end_ns for r in finished]
        self.clock.advance_to(stopped_at if stopped_at is not None else max(ends, default=0) / 1e9)
        records.sort(key=lambda r: r.index)
        load = LoadResult(records, shape.request_rate, shape.burstiness, shape.max_concurrency,
                          int(origin * 1e9), int(self.clock.now * 1e9), stopped_at is not None)
        return LevelResult(load, summarize(load), {"num_preemptions": 0.0})

    def _wait(self, until: float, should_stop: Callable[[Sequence[RequestRecord]], bool]) -> float | None:
        """Let the clock run to `until` (epoch s), asking `should_stop` every WATCH_S; when it said stop (None:
        never)."""
        while self.clock.now < until:
            self.clock.advance_to(min(until, self.clock.now + WATCH_S))
            if should_stop([]):
                return self.clock.now
        return None

    def _feed(self, timed: list[RequestSpec], served: Served, origin: float, first: int, on_record: Callable | None,
              should_stop: Callable[[Sequence[RequestRecord]], bool], finished: list[RequestRecord],
              horizon_ms: float) -> float | None:
        """Hand the timed records that end before `horizon_ms` (those `finished` holds already skipped) to
        `should_stop` in completion order with the clock at each completion, asking every WATCH_S between
        completions too; the time it said stop (None: not before the horizon)."""
        asked = origin + float(finished[-1].end_ns - int(origin * 1e9)) / 1e9 if finished else origin
        for k in np.argsort(served.end_ms, kind="stable")[len(finished):]:  # nan (never ended) last
            end_ms = float(served.end_ms[k])
            if math.isnan(end_ms) or end_ms >= horizon_ms:
                break
            done = origin + end_ms / 1000
            while done - asked > WATCH_S:
                asked += WATCH_S
                self.clock.advance_to(asked)
                if should_stop(finished):
                    return asked
            self.clock.advance_to(done)
            asked = done
            record = _record(timed[k], first + int(k), served, int(k), origin)
            finished.append(record)
            if on_record is not None:
                on_record(record)
            if should_stop(finished):
                return done
        return None

    @staticmethod
    def _cancelled(timed: list[RequestSpec], served: Served, origin: float, first: int,
                   finished: list[RequestRecord], stopped_at: float) -> list[RequestRecord]:
        """The requests sent before the level stopped at `stopped_at` that had not finished: cancelled then."""
        cut = int(stopped_at * 1e9)
        ended = {r.index for r in finished}
        return [_record(timed[k], first + k, served, k, origin, cancel_ns=cut) for k in range(len(timed))
                if first + k not in ended and origin + served.sent_ms[k] / 1000 <= stopped_at]


def _lengths(requests: Sequence[RequestSpec]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r.prompt_len for r in requests], dtype=np.int64),
            np.array([r.output_len for r in requests], dtype=np.int64))


def _record(spec: RequestSpec, index: int, served: Served, k: int, origin: float, warmup: bool = False,
            cancel_ns: int | None = None) -> RequestRecord:
    """Request k of `served` as the client records it (index `index` in the level), times from `origin` (epoch s);
    `cancel_ns`: cancelled then, with the tokens it had."""
    base = int(origin * 1e9)
    sent = base + int(served.sent_ms[k] * 1e6)
    due = base + int(served.due_ms[k] * 1e6)
    freed = sent if sent > due else 0  # it waited for a client slot (a closed loop)
    chunks = (base + (served.tokens(k) * 1e6).astype(np.int64)).tolist()
    if cancel_ns is not None:
        return RequestRecord(index, spec.prompt_len, spec.output_len, warmup, due, freed, start_ns=sent,
                             chunk_ns=[c for c in chunks if c <= cancel_ns], end_ns=cancel_ns,
                             prompt_tokens=spec.prompt_len, error="cancelled")
    return RequestRecord(index, spec.prompt_len, spec.output_len, warmup, due, freed, start_ns=sent, chunk_ns=chunks,
                         end_ns=chunks[-1], output_tokens=spec.output_len, prompt_tokens=spec.prompt_len)


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
        future.set_result(run_trial(job.plan, job.config, job.out_dir, trial_time=job.trial_time,
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
    assert spec.input_len is not None and spec.output_len is not None  # a scenario's synthetic lengths
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
        spent = self.summary.time
        if spent is not None and spent.next_trial_s is not None:  # set only where the time limit left trials unlaunched
            return "time"
        return "budget" if len(self.rows) >= self.budget else "search"


def simulate(scenario: Scenario, model: Path, out: Path, hooks: Hooks = Hooks()) -> SimResult:
    """Run a whole tune of `scenario` (the tiny model at `model` gives the tokenizer's context) on the simulated
    engine, with the real tuner, plan and verdicts; its outputs (summary.json and the rest, not the report's charts)
    in `out`."""
    clock = SimClock()
    opts = TuneOptions(model=str(model), workload=WorkloadSpec.model_validate(scenario.workload), out=out,
                       slo=parse_slo(scenario.slo), strategy=scenario.strategy, budget=scenario.budget,
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


# -- the truth ---------------------------------------------------------------------------------------------------


TRUE_S = 240.0  # seconds of Poisson arrivals in a run that finds the truth, the first quarter left out
TRUE_REQUESTS = (2000, 300_000)  # ... at least and at most this many requests (a fast GPU's chat runs ~500 req/s:
# 8,000 requests there last 16 s, over which a queue 1.4x past capacity stays within a 10 s p99 E2E SLO)
SATURATED_REQUESTS = 20_000  # a saturated run's requests: 2,000 ended before a GPU's KV cache had filled (565
# req/s where a long Poisson run completes 337)
TRUE_RESOLUTION = 0.01
TRUE_RUNS = 8  # independent runs (seeds TRUE_SEED, TRUE_SEED + 1, ...) whose steady requests the truth pools: one
# run's crossing of the bound varied by up to 47% between seeds where a queue's episodes are few and long (seed 15's
# trial 2: 29-43 req/s over eight seeds), more than the +5% a trial's goodput is judged to; eight pooled, ~2-3%
TRUE_SEED = 7
_TRUTHS: dict[int, float] = {}


def _run(physics: Physics, workload: WorkloadSpec, rate: float, seed: int) -> tuple[Served, np.ndarray, np.ndarray]:
    """A long run at `rate` req/s (inf: more than it can take, a queue always waiting): what it served and the
    requests' prompt and output lengths."""
    rng = np.random.default_rng(seed)
    finite = math.isfinite(rate)
    n = int(np.clip(rate * TRUE_S, *TRUE_REQUESTS)) if finite else SATURATED_REQUESTS
    assert workload.input_len is not None and workload.output_len is not None  # a scenario's synthetic lengths
    prompts, outputs = workload.input_len.sample(rng, n), workload.output_len.sample(rng, n)
    due = np.cumsum(rng.exponential(1000 / rate, n)) if finite else np.zeros(n)
    concurrency = None if finite else 2 * physics.max_num_seqs
    return serve(physics, due, prompts, outputs, rng, max_concurrency=concurrency), prompts, outputs


def saturated_throughput(physics: Physics, workload: WorkloadSpec, seed: int = TRUE_SEED) -> float:
    """Requests per second `physics` completes with more requests waiting than it runs: its capacity."""
    key = _digest("saturated", physics.__dict__, workload.model_dump(mode="json"), seed)
    if key not in _TRUTHS:
        served, _, _ = _run(physics, workload, math.inf, seed)
        ends = np.sort(served.end_ms)
        steady = ends[len(ends) // 4: 3 * len(ends) // 4]
        _TRUTHS[key] = 1000 * (len(steady) - 1) / float(steady[-1] - steady[0])
    return _TRUTHS[key]


def latencies(served: Served, outputs: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The values (ms) of each SLO in `names` of the requests `served` (ITL: every gap), from when each was sent."""
    values = {}
    for name in names:
        if name == "itl_p99_ms":
            gaps = [np.diff(served.tokens(i)) for i in range(len(outputs))]
            values[name] = np.concatenate(gaps) if gaps else np.zeros(1)
        elif name == "tpot_p99_ms":
            values[name] = ((served.end_ms - served.first_ms) / np.maximum(outputs - 1, 1))[outputs > 1]
        else:
            values[name] = (served.first_ms if name == "ttft_p99_ms" else served.end_ms) - served.sent_ms
    return values


def steady_latencies(physics: Physics, workload: WorkloadSpec, rate: float, seed: int,
                     names: Sequence[str], runs: int = 1) -> dict[str, np.ndarray]:
    """The values of each SLO in `names` over `runs` long runs at `rate` req/s (seeds `seed`, `seed` + 1, ...), the
    first quarter of each run's requests left out, pooled."""
    pooled: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for k in range(runs):
        served, _, outputs = _run(physics, workload, rate, seed + k)
        steady = slice(len(outputs) // 4, None)
        part = Served(served.due_ms[steady], served.sent_ms[steady], served.first_ms[steady], served.end_ms[steady],
                      served.step_end_ms, served.runs[steady])
        for name, values in latencies(part, outputs[steady], names).items():
            pooled[name].append(values)
    return {name: np.concatenate(values) for name, values in pooled.items()}


def p99s(physics: Physics, workload: WorkloadSpec, rate: float, seed: int = TRUE_SEED,
         names: Sequence[str] = ("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2el_p99_ms"),
         runs: int = 1) -> dict[str, float]:
    """The p99 of each SLO in `names` over `runs` long runs at `rate` req/s (`steady_latencies`)."""
    return {name: float(np.percentile(v, 99)) if len(v) else 0.0
            for name, v in steady_latencies(physics, workload, rate, seed, names, runs).items()}


def over_share(physics: Physics, slo: dict[str, float], workload: WorkloadSpec, rate: float, seed: int = TRUE_SEED,
               runs: int = TRUE_RUNS) -> float:
    """The largest share of requests (ITL: gaps) over an SLO's bound in `runs` long runs at `rate` req/s."""
    values = steady_latencies(physics, workload, rate, seed, tuple(slo), runs)
    return max((float(np.mean(values[name] > bound)) if len(values[name]) else 0.0 for name, bound in slo.items()),
               default=0.0)


def true_goodput(physics: Physics, slo: dict[str, float], workload: WorkloadSpec, seed: int = TRUE_SEED,
                 runs: int = TRUE_RUNS) -> float:
    """The highest rate (req/s) at which `physics` holds every p99 SLO in `slo` over `runs` long runs pooled and
    completes what arrives (at most its `saturated_throughput`), to TRUE_RESOLUTION; 0 when it holds none. The rate
    is bracketed, then found as the root of the SLOs' largest log(p99 / bound) by false position (Illinois)."""
    key = _digest(physics.__dict__, slo, workload.model_dump(mode="json"), seed, runs)
    if key in _TRUTHS:
        return _TRUTHS[key]

    def margin(rate: float) -> float:
        measured = p99s(physics, workload, rate, seed, tuple(slo), runs)
        return max(math.log(max(measured[name], 1e-9) / bound) for name, bound in slo.items())

    capacity = saturated_throughput(physics, workload, seed)
    high, m_high = capacity, margin(capacity)
    if m_high <= 0:
        _TRUTHS[key] = capacity
        return capacity
    low, m_low = capacity / 64, margin(capacity / 64)
    if m_low > 0:
        _TRUTHS[key] = 0.0
        return 0.0
    side = 0  # the end kept last time: kept twice, its margin is halved (Illinois), so the bracket closes
    while high / low - 1 > TRUE_RESOLUTION:
        root = low + (0 - m_low) * (high - low) / (m_high - m_low)
        rate = min(high - (high - low) / 16, max(low + (high - low) / 16, root))
        m = margin(rate)
        if m <= 0:
            low, m_low = rate, m
            m_high, side = (m_high / 2 if side == -1 else m_high), -1
        else:
            high, m_high = rate, m
            m_low, side = (m_low / 2 if side == 1 else m_low), 1
    _TRUTHS[key] = low
    return low


# -- scenarios --------------------------------------------------------------------------------------------------


WORKLOADS = {
    "demo": {"input_len": {"type": "uniform", "min": 256, "max": 768},
             "output_len": {"type": "uniform", "min": 16, "max": 32}},
    "chat": {"input_len": {"type": "lognormal", "mean": 300, "std": 300, "min": 32, "max": 1500},
             "output_len": {"type": "uniform", "min": 32, "max": 96}},
    "long-prompt": {"input_len": {"type": "uniform", "min": 1024, "max": 3000},
                    "output_len": {"type": "uniform", "min": 16, "max": 48}},
    "long-reply": {"input_len": {"type": "uniform", "min": 64, "max": 256},
                   "output_len": {"type": "lognormal", "mean": 250, "std": 200, "min": 32, "max": 1000}},
    "decode-heavy": {"input_len": {"type": "uniform", "min": 200, "max": 1200},
                     "output_len": {"type": "lognormal", "mean": 700, "std": 400, "min": 64, "max": 2000}},
    "heavy-tailed": {"input_len": {"type": "lognormal", "mean": 1500, "std": 1500, "min": 64, "max": 3000},
                     "output_len": {"type": "lognormal", "mean": 200, "std": 200, "min": 16, "max": 800}},
}


def draw_scenario(seed: int, limit_s: float | None = 900.0, family: str | None = None, **fixed: Any) -> Scenario:
    """A random scenario (seeded): a CPU or GPU machine from very slow to fast, one of WORKLOADS (`family`: that
    one), a budget of 3-6, a share of configs that fail to start, and one SLO or two, each the p99 that a reference
    config (the defaults, or a chunk of the ladder) shows at 30-90% of its capacity, raised by 15-50% (a bound the
    p99 only grazes at every rate is not decided by any level); `fixed` sets any field."""
    rng = np.random.default_rng([seed, 2026])

    def log_uniform(low: float, high: float) -> float:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))

    device = DeviceKind.of(rng.random() >= 0.3)
    drawn = str(rng.choice(list(WORKLOADS)))
    workload = {"num_requests": 400, "seed": int(seed % 1000)} | WORKLOADS[family or drawn]
    effects = {f"enable_prefix_caching={v}": float(rng.uniform(0.97, 1.03)) for v in (True, False)}
    effects |= {f"enforce_eager={v}": float(rng.uniform(1.0, 1.5) if v and device == DeviceKind.GPU else 1.0)
                for v in (True, False)}
    effects |= {f"cpu_kvcache_space_gib={v}": v for v in (0.25, 0.5, 1, 2)}
    machine: dict[str, Any]
    if device == DeviceKind.CPU:
        machine = {"cold_s": log_uniform(60, 240), "launch_s": log_uniform(25, 90), "step_ms": log_uniform(0.5, 5),
                   "decode_ms": log_uniform(0.01, 0.3), "prefill_ms_per_token": log_uniform(0.005, 0.1),
                   "kv_tokens": 1 << 19, "noise": 0.1, "stall_share": float(rng.choice([0.0, 0.001, 0.003])),
                   "stall_ms": log_uniform(20, 300)}
    else:
        machine = {"cold_s": log_uniform(120, 240), "launch_s": log_uniform(50, 120), "step_ms": log_uniform(2, 12),
                   "decode_ms": log_uniform(0.003, 0.05), "prefill_ms_per_token": log_uniform(0.005, 0.05),
                   "kv_tokens": int(log_uniform(5e4, 1e6)), "noise": 0.03}
    scenario = Scenario(seed=seed, workload=workload, slo={}, device=device, effects=effects,
                        fail_share=float(rng.choice([0.0, 0.1, 0.3])), budget=int(rng.integers(3, 7)),
                        limit_s=limit_s, level_requests=int(rng.choice([400, 600])),
                        max_levels=int(rng.integers(4, 7)), **machine)
    kinds = [["itl_p99_ms"], ["tpot_p99_ms"], ["ttft_p99_ms"], ["ttft_p99_ms", "itl_p99_ms"], ["e2el_p99_ms"],
             ["ttft_p99_ms", "tpot_p99_ms"]]
    names = kinds[int(rng.integers(len(kinds)))]
    reference = {} if rng.random() < 0.5 else {"enable_chunked_prefill": True,
                                                "max_num_batched_tokens": int(rng.choice([128, 256, 512, 1024]))}
    spec = WorkloadSpec.model_validate(workload)
    physics = replace(scenario, **fixed).physics(reference)
    rate = float(rng.uniform(0.3, 0.9)) * saturated_throughput(physics, spec)
    p99 = p99s(physics, spec, rate, int(rng.integers(1 << 30)), names)
    slo = {name: round(p99[name] * float(rng.uniform(1.15, 1.5)), 1) for name in names}
    return replace(scenario, **({"slo": slo} | fixed))


# -- judging answers --------------------------------------------------------------------------------------------


LADDER = (128, 256, 512, 1024, 2048)  # the chunks `judge` finds the best config among
CLEAR_GAIN = 1.3  # a config this much better than the defaults is one a tune must name
LADDER_RUNS = 1  # runs the recommendation's and the ladder's truths pool: a gain of CLEAR_GAIN needs no more
DECIDABLE_RATE = 5.0  # req/s: a deciding level (300 requests) of a config this fast takes at most a minute


CLOSED = 0.1  # a trial's search closed its bracket: the lowest rate it did not pass is within 10% of its goodput
SHOWABLE = 0.0025  # a share over the bound a level of a few thousand requests shows within the p99 at 95%
REFUTABLE = 0.015  # ... and one it shows over the p99


def _closed(row: Any) -> bool:
    """Whether a trial's search closed in on its goodput rate: a rate it passed and one within CLOSED above it that
    it measured and did not pass."""
    if not row.goodput_rate or not row.goodput_bracket:
        return False
    high = row.goodput_bracket[1]
    measured = any(lv.rate == high and not lv.passed for lv in row.levels)
    return measured and high <= row.goodput_rate * (1 + CLOSED)


@dataclass(frozen=True)
class TrialTruth:
    """A measured trial held against its config's truth: its goodput rate (req/s; None: it passed none), the true
    one, whether its search closed in on it (`_closed`), and whether its truth is `decidable` by levels of a few
    thousand requests at 95%: at 85% of it the config has at most SHOWABLE of its requests over a bound, and at 105%
    at least REFUTABLE (where the p99 hugs its bound across a range of rates, or its excess comes in rare
    episodes, no such level tells the rates apart)."""

    trial: int
    measured: float | None
    truth: float
    searched: bool
    decidable: bool = True

    @property
    def ratio(self) -> float | None:
        return None if self.measured is None or not self.truth else self.measured / self.truth


@dataclass(frozen=True)
class Judged:
    """A simulated tune held against the truth: the true goodput rate (req/s) of vLLM's defaults, of the config it
    recommends and of the best config of the chunk ladder (chunked prefill at each of LADDER), and every measured
    trial's goodput beside its own truth."""

    defaults: float
    recommended: float | None
    best: float
    recommends_defaults: bool
    trials: tuple[TrialTruth, ...] = ()  # empty where `judge` was not asked for them

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
        return (not self.recommends_defaults
                and bool(self.recommended and self.recommended >= CLEAR_GAIN * self.defaults))


def judge(scenario: Scenario, result: SimResult, ladder: bool = True, trials: bool = True,
          runs: int = TRUE_RUNS) -> Judged:
    """`result`'s recommendation and (`trials`) every trial it measured against the truth (`true_goodput`: a trial's
    over `runs` runs, the recommendation's over LADDER_RUNS); `ladder`: find the best config of the chunk ladder
    too."""
    workload = WorkloadSpec.model_validate(scenario.workload)

    def truth(config: dict[str, Any], pooled: int = LADDER_RUNS) -> float:
        return true_goodput(scenario.physics(config), scenario.slo, workload, runs=pooled)

    def trial_truth(row: Any) -> TrialTruth:
        physics, true = scenario.physics(row.config), truth(row.config, pooled=runs)
        decidable = bool(true) and over_share(physics, scenario.slo, workload, 0.85 * true, runs=runs) <= SHOWABLE and (
            true >= saturated_throughput(physics, workload)
            or over_share(physics, scenario.slo, workload, 1.05 * true, runs=runs) >= REFUTABLE)
        return TrialTruth(trial=row.trial, measured=row.goodput_rate, truth=true, searched=_closed(row),
                          decidable=decidable)

    summary = result.summary
    best = summary.best
    defaults = summary.default is not None and best is not None and best.trial == summary.default.trial
    return Judged(defaults=truth({}), recommended=truth(best.config) if best is not None else None,
                  best=max(truth({"enable_chunked_prefill": True, "max_num_batched_tokens": c}) for c in LADDER)
                  if ladder else 0.0, recommends_defaults=defaults or best is None,
                  trials=tuple(trial_truth(row) for row in result.rows if row.ok) if trials else ())

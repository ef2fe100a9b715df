"""The executor contract: one suite that every executor passes, `Inline`, `LocalPool`, `RayCluster` and any
other (tests/unit/executors/test_executor_contract_unit.py runs it against `Inline`,
tests/integration/test_executor_contract.py against the other two).

Each executor runs the same stand-in `work` instead of a trial (what a real trial cannot do on demand: hold,
raise, die), so the suite needs no vLLM. A part of the contract an executor cannot keep is skipped with the
reason, as Optuna skips a capability a sampler lacks.

A third-party executor takes the `work` it runs (as servetune's do: `run_job` by default) and runs the suite
by subclassing `ExecutorContract` in its own tests, giving a factory of executors and what it cannot do::

    import pytest
    from servetune.testing.executors import ExecutorContract

    class TestMyExecutor(ExecutorContract):
        devices = 4  # the most GPUs one trial can get; None (the default): misfit never refuses a job ...
        # no_devices = "..."  # ... and this says why
        # no_worker = "..."   # set when it runs the work in the tuner's own process (as Inline does)

        @pytest.fixture
        def executor_factory(self):
            return lambda slots, work: MyExecutor(slots, work=work)

`work` is `stand_in`, a function of this module: a worker in another process imports it from here (or gets it
by value, as tests/integration/test_executor_contract.py registers it for Ray). Each test waits at most 60 s for
a future.
This module imports pytest: it is for tests only, and nothing else in servetune imports it."""

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

import pytest

from servetune.engine.logfacts import FailureKind, StartupFacts
from servetune.executors import Executor, Job, WorkerError, WorkerLost
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.measure.metrics import LevelMetrics, summarize
from servetune.study.outcome import Failure, LevelName, LevelOutcome, TrialOutcome, TrialStatus
from servetune.testing.processes import alive, wait_for

SERVER_LOG = "INFO the stand-in server's log\n"
RECORDS = "level-00.records.jsonl"
MS = 1_000_000

Work = Callable[[Job], TrialOutcome]


# --- the stand-in work: what the job's config asks of it -------------------------------------------------------

def stand_in(job: Job) -> TrialOutcome:
    """The work every executor runs here. `act`: "measure" or "fail" (write the trial's files, return its
    outcome), "hold" (until the file `release` exists), "raise" (a servetune bug), "die" (the worker process
    exits). With `pid_file`, it first writes its process id there."""
    if "pid_file" in job.config:
        scratch = Path(job.config["pid_file"] + ".tmp")
        scratch.write_text(str(os.getpid()))
        scratch.rename(job.config["pid_file"])
    act = job.config["act"]
    if act == "raise":
        raise KeyError("a bug")
    if act == "die":
        os._exit(3)
    if act == "hold":
        deadline = time.monotonic() + 300
        while not Path(job.config["release"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    (job.out_dir / "server.log").write_text(SERVER_LOG)
    if act != "fail":
        level_load().save(job.out_dir / RECORDS)
    return outcome_of(job)


def level_load() -> LoadResult:
    """Three requests at rate inf, 20 ms to the first of 4 tokens, one every 5 ms after it."""
    records = [RequestRecord(index=i, prompt_len=32, expected_output_len=4, warmup=False, scheduled_ns=10 * i * MS,
                             start_ns=10 * i * MS, chunk_ns=[(10 * i + 20 + 5 * k) * MS for k in range(4)],
                             end_ns=(10 * i + 40) * MS, output_tokens=4, prompt_tokens=32) for i in range(3)]
    return LoadResult(records, math.inf, 1.0, None, 0, 60 * MS, False)


def outcome_of(job: Job) -> TrialOutcome:
    """The outcome the stand-in returns for `job`, built through the model (the same wherever it is built)."""
    startup = StartupFacts(kv_cache_tokens=16384, max_concurrency=8.0, max_model_len=2048, ready_s=4.5)
    if job.config["act"] == "fail":
        failure = Failure(kind=FailureKind.KV_CACHE_TOO_SMALL, reason="the KV cache holds 512 tokens, 2048 needed",
                          log="server.log")
        return TrialOutcome.failed(job.config, failure, startup=startup)
    metrics = LevelMetrics.model_validate(summarize(level_load()))
    capacity = LevelOutcome(name=LevelName.CAPACITY, rate=math.inf, seed=0, verdict="pass", passed=True, reasons=[],
                            metrics=metrics, server={"vllm:num_preemptions": 0.0, "vllm:kv_cache_usage_perc": None},
                            records=RECORDS, rejected=0, attempts=1)
    return TrialOutcome(status=TrialStatus.OK, config=job.config, startup=startup, levels=[capacity],
                        request_throughput=metrics.request_throughput, p99_ttft_ms=metrics.p99_ttft_ms,
                        p99_tpot_ms=metrics.p99_tpot_ms, preemptions=0.0, rejected_requests=0)


def job(number: int, out: Path, act: str = "measure", **config) -> Job:
    # no TrialPlan: the contract's stand-in work never reads one
    return Job(number, {"act": act, **config}, None, out / "trials" / f"{number:04d}")  # type: ignore[arg-type]


# --- the contract ----------------------------------------------------------------------------------------------

class ExecutorContract:
    """The contract suite; a subclass named Test... runs it against one executor (see the module's docstring).

    `devices`: the most devices (GPUs) one job can get, or None when the executor cannot tell (`no_devices` says
    why misfit never names a job then). `no_worker`: why it has no worker to lose, and no busy slot to refuse a
    job with (None: it has workers)."""

    devices: int | None = None
    no_devices: str = ""
    no_worker: str | None = None

    @pytest.fixture
    def executor_factory(self) -> Callable[[int, Work], Executor]:
        """`factory(slots, work)`: an executor of at most `slots` trials at once that runs `work` for each job."""
        raise NotImplementedError(f"{type(self).__name__} must provide the executor_factory fixture")

    @pytest.fixture
    def make(self, executor_factory):
        """Build executors around the stand-in work (`make(slots)`); each is closed after the test (again, where
        the test closed it: a second close does nothing)."""
        made: list[Executor] = []

        def make(slots: int = 2) -> Executor:
            made.append(executor_factory(slots, stand_in))
            return made[-1]

        yield make
        for executor in made:
            executor.close()

    def test_the_future_holds_the_works_outcome_equal_after_the_round_trip(self, make, tmp_path):
        executor = make(slots=2)
        jobs = [job(0, tmp_path, "measure"), job(1, tmp_path, "fail")]
        futures = [executor.submit(j) for j in jobs]
        for j, future in zip(jobs, futures):
            got = future.result(60)
            assert type(got) is TrialOutcome and got == outcome_of(j)
        assert futures[0].result().ok and futures[0].result().capacity.rate == math.inf
        assert futures[1].result().failure.kind == FailureKind.KV_CACHE_TOO_SMALL

    def test_the_trials_files_come_back_into_its_directory(self, make, tmp_path):
        executor = make(slots=2)
        measured, failed = job(0, tmp_path, "measure"), job(1, tmp_path, "fail")
        ok, bad = executor.submit(measured).result(60), executor.submit(failed).result(60)
        assert LoadResult.load(measured.out_dir / ok.capacity.records) == level_load()  # paths relative to the trial
        assert (measured.out_dir / "server.log").read_text() == SERVER_LOG
        assert (failed.out_dir / bad.failure.log).read_text() == SERVER_LOG
        assert sorted(p.name for p in measured.out_dir.iterdir()) == [RECORDS, "server.log"]

    def test_a_work_that_raises_reports_its_traceback(self, make, tmp_path):
        if self.no_worker:  # the work ran in the tuner's own process: its exception is the tuner's, as it was raised
            with pytest.raises(KeyError, match="a bug"):
                make().submit(job(0, tmp_path, "raise"))
            return
        future = make().submit(job(0, tmp_path, "raise"))
        with pytest.raises(WorkerError, match="KeyError: 'a bug'") as raised:
            future.result(60)
        assert "in stand_in" in str(raised.value) and 'raise KeyError("a bug")' in str(raised.value)

    def test_a_worker_that_dies_gives_worker_lost_and_frees_its_slot(self, make, tmp_path):
        if self.no_worker:
            pytest.skip(self.no_worker)
        executor = make(slots=1)
        with pytest.raises(WorkerLost):
            executor.submit(job(0, tmp_path, "die")).result(60)
        after = job(1, tmp_path)
        assert executor.submit(after).result(60) == outcome_of(after)

    def test_submit_refuses_while_every_slot_is_busy_and_accepts_once_one_is_done(self, make, tmp_path):
        if self.no_worker:
            pytest.skip(self.no_worker)
        executor = make(slots=1)
        assert executor.slots == 1
        release = tmp_path / "release"
        first = executor.submit(job(0, tmp_path, "hold", release=str(release)))
        assert first is not None
        assert executor.submit(job(1, tmp_path)) is None
        release.touch()
        first.result(60)
        second = executor.submit(job(1, tmp_path))  # a done future's slot is free at once
        assert second is not None and second.result(60) == outcome_of(job(1, tmp_path))

    def test_futures_complete_in_any_order_each_trial_in_its_own_worker(self, make, tmp_path):
        """(Was tests/test_executors.py::test_pool_futures_complete_in_any_order, for LocalPool on fake GPUs with
        sleeps; here for every executor with workers, and the order set by the test.)"""
        if self.no_worker:
            pytest.skip(self.no_worker)
        executor = make(slots=2)
        release, pids = tmp_path / "release", [tmp_path / "slow.pid", tmp_path / "fast.pid"]
        slow = executor.submit(job(0, tmp_path, "hold", release=str(release), pid_file=str(pids[0])))
        fast = executor.submit(job(1, tmp_path, pid_file=str(pids[1])))
        done, _ = wait([slow, fast], return_when=FIRST_COMPLETED, timeout=60)
        assert done == {fast}
        release.touch()
        assert slow.result(60).ok and fast.result().ok
        assert pids[0].read_text() != pids[1].read_text()

    def test_misfit_is_none_for_a_job_that_fits(self, make, tmp_path):
        executor = make()
        assert executor.misfit(job(0, tmp_path)) is None
        assert executor.misfit(job(1, tmp_path, tensor_parallel_size=2)) is None

    def test_misfit_names_a_job_needing_more_devices_than_there_are(self, make, tmp_path):
        if self.devices is None:
            pytest.skip(self.no_devices)
        executor = make()
        reason = executor.misfit(job(0, tmp_path, tensor_parallel_size=self.devices + 1))
        assert reason is not None and f"needs {self.devices + 1} GPUs" in reason
        two_stages = job(1, tmp_path, tensor_parallel_size=2, pipeline_parallel_size=self.devices)
        assert executor.misfit(two_stages) is not None

    def test_close_stops_the_running_work(self, make, tmp_path):
        if self.no_worker:
            pytest.skip(self.no_worker)
        executor = make(slots=1)
        pid_file = tmp_path / "worker.pid"
        executor.submit(job(0, tmp_path, "hold", release=str(tmp_path / "never"), pid_file=str(pid_file)))
        assert wait_for(pid_file.exists, 60)
        worker = int(pid_file.read_text())
        assert alive(worker)
        executor.close()  # and once more by `make`: a second close does nothing
        assert wait_for(lambda: not alive(worker), 30), f"worker {worker} outlived close()"

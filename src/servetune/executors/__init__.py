"""Executors run trials for the tuner: one at a time in this process (`Inline`, the default), several at
once in worker processes on this host packed onto free GPUs or CPU cores (`LocalPool`, `--parallel N`), or
as Ray tasks on a cluster (`RayCluster`, `--ray-address`). Workers only measure; the tuner asks the study
for configs and tells it every outcome, so a study reads the same however its trials ran."""

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servetune.engine import InstalledVllm, probe
from servetune.errors import ServetuneError
from servetune.outcome import TrialOutcome
from servetune.trial import TrialPlan, run_trial


@dataclass(frozen=True)
class Job:
    """One trial to run: its number in the study, the config to launch, how to measure, where files go."""

    number: int
    config: dict[str, Any]
    plan: TrialPlan
    out_dir: Path
    deadline: float | None = None  # epoch s: the trial stops there, keeping what it measured

    @property
    def devices(self) -> int:
        """GPUs the config needs: tensor x pipeline parallel size."""
        return int(self.config.get("tensor_parallel_size") or 1) * int(self.config.get("pipeline_parallel_size") or 1)


class WorkerLost(RuntimeError):
    """The process (or node) running a trial died before the trial ended; the trial is run again."""


class WorkerError(RuntimeError):
    """A trial raised in its worker: a servetune bug, not an engine failure (those are outcomes)."""


def run_job(job: Job) -> TrialOutcome:
    """A worker's whole task: the trial's outcome (its paths relative to `job.out_dir`). Every executor
    takes another `work` in its place: tests/test_executor_contract.py runs stand-ins that return, raise or die."""
    return run_trial(job.plan, job.config, job.out_dir, deadline=job.deadline)


class Executor(Protocol):
    slots: int  # trials at once, at most

    def probe(self) -> InstalledVllm:
        """The vLLM that trials run with."""
        ...

    def misfit(self, job: Job) -> str | None:
        """Why `job` can never run here (it needs more devices than a worker has), or None."""
        ...

    def submit(self, job: Job) -> Future[TrialOutcome] | None:
        """Start `job`; None when the devices it needs are busy now. The future holds the outcome, with the
        trial's files in `job.out_dir`, or raises WorkerLost / WorkerError. Once a future is done, its devices
        are free again."""
        ...

    def close(self) -> None:
        """Stop every trial still running (their servers with them)."""
        ...


class Inline:
    """One trial at a time in this process, with live progress per load level: `submit` returns once the
    trial has ended. `work` replaces the trial (tests); without it, `on_level`/`on_record` go to `run_trial`."""

    slots = 1

    def __init__(self, on_level: Callable | None = None, on_record: Callable | None = None,
                 work: Callable[[Job], TrialOutcome] | None = None):
        self.on_level, self.on_record = on_level, on_record
        self.work = work or self._run_trial

    def _run_trial(self, job: Job) -> TrialOutcome:
        return run_trial(job.plan, job.config, job.out_dir, deadline=job.deadline, on_level=self.on_level,
                         on_record=self.on_record)

    def probe(self) -> InstalledVllm:
        return probe()

    def misfit(self, job: Job) -> str | None:
        return None

    def submit(self, job: Job) -> Future[TrialOutcome]:
        """Run the trial now. An exception in it is the tuner's own: it goes up from here with its traceback."""
        future: Future[TrialOutcome] = Future()
        future.set_result(self.work(job))
        return future

    def close(self) -> None:
        pass


def runs_inline(parallel: int | None, ray_address: str | None) -> bool:
    """Whether these options run one trial at a time in this process (the only executor that reports
    each trial's load levels as they run)."""
    return not ray_address and (parallel or 1) == 1


def make_executor(parallel: int | None, ray_address: str | None, on_level: Callable | None = None,
                  on_record: Callable | None = None) -> Executor:
    """`Inline` when `runs_inline`, else `RayCluster` with an address, else `LocalPool`."""
    if runs_inline(parallel, ray_address):
        return Inline(on_level, on_record)
    if ray_address:
        try:
            from servetune.executors.cluster import RayCluster
        except ImportError:
            raise ServetuneError("--ray-address needs Ray: pip install 'servetune[cluster]'") from None

        return RayCluster(ray_address, parallel)
    from servetune.executors.local import LocalPool

    return LocalPool(parallel, probe())

"""What every executor shares: the `Job` it runs, the `Executor` protocol it keeps, the errors its futures
raise, and `run_job`, the work a worker does. Executors import this module; `servetune.executors` re-exports it."""

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servetune.engine import InstalledVllm
from servetune.study.outcome import TrialOutcome
from servetune.timelimit import TrialTime
from servetune.trial.run import TrialPlan, run_trial


@dataclass(frozen=True)
class Job:
    """One trial to run: its number in the study, the config to launch, how to measure, where files go."""

    number: int
    config: dict[str, Any]
    plan: TrialPlan
    out_dir: Path
    trial_time: TrialTime | None = None  # the time it may spend (None: no time limit)

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
    takes another `work` in its place: the contract suite (`servetune.testing.executors`) runs stand-ins that
    return, raise or die."""
    return run_trial(job.plan, job.config, job.out_dir, trial_time=job.trial_time)


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

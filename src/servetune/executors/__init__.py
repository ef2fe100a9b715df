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
from servetune.trial import TrialPlan, run_trial


@dataclass(frozen=True)
class Job:
    """One trial to run: its number in the study, the config to launch, how to measure, where files go."""

    number: int
    config: dict[str, Any]
    plan: TrialPlan
    out_dir: Path

    @property
    def devices(self) -> int:
        """GPUs the config needs: tensor x pipeline parallel size."""
        return int(self.config.get("tensor_parallel_size") or 1) * int(self.config.get("pipeline_parallel_size") or 1)


class WorkerLost(RuntimeError):
    """The process (or node) running a trial died before the trial ended; the trial is run again."""


class WorkerError(RuntimeError):
    """A trial raised in its worker: a servetune bug, not an engine failure (those are outcomes)."""


def run_job(job: Job) -> dict:
    """A worker's whole task: the trial's outcome."""
    return run_trial(job.plan, job.config, job.out_dir)


class Executor(Protocol):
    slots: int  # trials at once, at most

    def probe(self) -> InstalledVllm:
        """The vLLM that trials run with."""
        ...

    def misfit(self, job: Job) -> str | None:
        """Why `job` can never run here (it needs more devices than a worker has), or None."""
        ...

    def submit(self, job: Job) -> Future | None:
        """Start `job`; None when the devices it needs are busy now. The future holds the outcome, or
        raises WorkerLost / WorkerError."""
        ...

    def close(self) -> None:
        """Stop every trial still running (their servers with them)."""
        ...


class Inline:
    """One trial at a time in this process, with live progress per load level."""

    slots = 1

    def __init__(self, on_level: Callable | None = None, on_record: Callable | None = None):
        self.on_level, self.on_record = on_level, on_record

    def probe(self) -> InstalledVllm:
        return probe()

    def misfit(self, job: Job) -> str | None:
        return None

    def submit(self, job: Job) -> Future:
        future: Future = Future()
        future.set_result(run_trial(job.plan, job.config, job.out_dir, on_level=self.on_level,
                                    on_record=self.on_record))
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
            raise ValueError("--ray-address needs Ray: pip install 'servetune[cluster]'") from None

        return RayCluster(ray_address, parallel)
    from servetune.executors.local import LocalPool

    return LocalPool(parallel, probe())

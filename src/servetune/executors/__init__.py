"""Executors run trials for the tuner: one at a time in this process (`Inline`, the default), several at
once in worker processes on this host packed onto free GPUs or CPU cores (`LocalPool`, `--parallel N`), or
as Ray tasks on a cluster (`RayCluster`, `--ray-address`). Workers only measure; the tuner asks the study
for configs and tells it every outcome, so a study reads the same however its trials ran.

This module re-exports what executors share (`_base`) and picks one (`make_executor`). A new executor keeps
the `Executor` protocol and runs `servetune.testing.executors`, the contract suite every executor here passes."""


from servetune.engine import probe
from servetune.errors import ServetuneError
from servetune.executors._base import Executor, Job, WorkerError, WorkerLost, run_job
from servetune.executors.inline import Inline
from servetune.executors.local import LocalPool
from servetune.trial.hooks import Hooks

__all__ = ["Executor", "Inline", "Job", "LocalPool", "WorkerError", "WorkerLost", "make_executor", "run_job",
           "runs_inline"]


def runs_inline(parallel: int | None, ray_address: str | None) -> bool:
    """Whether these options run one trial at a time in this process (the only executor that reports
    each trial's load levels as they run)."""
    return not ray_address and (parallel or 1) == 1


def make_executor(parallel: int | None, ray_address: str | None, hooks: Hooks = Hooks()) -> Executor:
    """`Inline` when `runs_inline`, else `RayCluster` with an address, else `LocalPool`."""
    if runs_inline(parallel, ray_address):
        return Inline(hooks)
    if ray_address:
        try:  # deferred because Ray is optional (servetune[cluster]), not to break a circle: cluster imports _base
            from servetune.executors.cluster import RayCluster
        except ImportError:
            raise ServetuneError("--ray-address needs Ray: pip install 'servetune[cluster]'") from None

        return RayCluster(ray_address, parallel)
    assert parallel is not None  # more than one (not runs_inline)
    return LocalPool(parallel, probe())

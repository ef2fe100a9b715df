"""One trial at a time in the tuner's own process: the default executor."""

from collections.abc import Callable
from concurrent.futures import Future

from servetune.engine import InstalledVllm, probe
from servetune.executors._base import Job
from servetune.study.outcome import TrialOutcome
from servetune.trial.hooks import Hooks
from servetune.trial.run import run_trial


class Inline:
    """One trial at a time in this process, with live progress per load level: `submit` returns once the
    trial has ended. `work` replaces the trial (tests); without it, `hooks` go to `run_trial`."""

    slots = 1

    def __init__(self, hooks: Hooks = Hooks(), work: Callable[[Job], TrialOutcome] | None = None):
        self.hooks = hooks
        self.work = work or self._run_trial

    def _run_trial(self, job: Job) -> TrialOutcome:
        return run_trial(job.plan, job.config, job.out_dir, trial_time=job.trial_time, hooks=self.hooks)

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

"""Submitting trials to an executor and waiting for them: the one loop the search (`tune.Tuner.search`) and the
head-to-head (`confirm.run_head_to_head`) share. A worker lost (its process or node died) is data here, never an
exception: the caller queues the trial again; a run of them in a row stops the tune (`WorkerError`), the cause being
the executor's rather than any config's."""

from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from servetune.executors import Executor, Job, WorkerError, WorkerLost
from servetune.study.outcome import TrialOutcome

MAX_LOST_IN_A_ROW = 3  # trials whose worker died, one after another, before giving up

T = TypeVar("T")


@dataclass(frozen=True)
class Finished(Generic[T]):
    """A submitted trial that ended: its outcome, or why its worker was lost (`lost`; no outcome then)."""

    tag: T  # what the caller submitted it with
    outcome: TrialOutcome | None
    lost: str | None = None


@dataclass
class Dispatch(Generic[T]):
    """Trials in flight on an executor, each with the caller's tag."""

    executor: Executor
    running: dict[Future[TrialOutcome], T] = field(default_factory=dict)
    lost_in_a_row: int = 0

    @property
    def free(self) -> bool:
        """Whether the executor has a slot for another trial (its devices may still be busy: `submit`)."""
        return len(self.running) < self.executor.slots

    def submit(self, job: Job, tag: T) -> bool:
        """Start `job`; False when the devices it needs are busy now (try again after `wait`)."""
        future = self.executor.submit(job)
        if future is None:
            return False
        self.running[future] = tag
        return True

    def wait(self) -> Iterator[Finished[T]]:
        """Wait until at least one trial ends, and hand back each that did. After the caller has handled a
        lost one (queued it again), WorkerError when MAX_LOST_IN_A_ROW were lost one after another."""
        done, _ = wait(self.running, return_when=FIRST_COMPLETED)
        for future in done:
            tag = self.running.pop(future)
            try:
                finished = Finished(tag, future.result())
            except WorkerLost as e:
                finished = Finished(tag, None, str(e))
            yield finished
            self.lost_in_a_row = self.lost_in_a_row + 1 if finished.lost else 0
            if self.lost_in_a_row >= MAX_LOST_IN_A_ROW:
                raise WorkerError(f"{self.lost_in_a_row} trials in a row lost their worker (last: {finished.lost}); "
                                  "what they ran is queued again: fix the cause and continue with --resume")

"""What a tune tells as it goes: one protocol of no-op methods, each saying when it is called. The CLI's progress
(`console.TuneProgress`) overrides them; the tuner, the head-to-head and the executor that runs trials in this
process (`executors.Inline`, through `trial.run_trial`) call them."""

from servetune.loadgen.records import RequestRecord
from servetune.study.outcome import TrialOutcome


class Hooks:
    """Progress callbacks of a tune; each does nothing unless overridden."""

    def trial_started(self, number: int, config: dict, why: str) -> None:
        """Trial `number` is about to launch `config`; `why` it was proposed."""

    def trial_finished(self, number: int, out: TrialOutcome) -> None:
        """Trial `number` ended with `out` (measured, or failed)."""

    def trial_lost(self, number: int, reason: str) -> None:
        """Trial `number`'s worker was lost: its config runs again."""

    def trial_skipped(self, number: int, config: dict, reason: str) -> None:
        """A proposal was not launched (infeasible, ruled out, a duplicate)."""

    def confirm_started(self, number: int, config: dict, rates: list[float]) -> None:
        """The head-to-head launches the defaults (`config`) to measure them at `rates`."""

    def confirm_finished(self, number: int, out: TrialOutcome) -> None:
        """The head-to-head's levels ended with `out`."""

    def confirm_lost(self, number: int, reason: str) -> None:
        """The head-to-head's worker was lost: it runs again."""

    def level_started(self, name: str, rate: float, n: int) -> None:
        """A load level of the trial running in this process sends `n` requests (warm-up included) at `rate`."""

    def record(self, record: RequestRecord) -> None:
        """A request of that level finished (called from the load generator's thread)."""

    def note(self, text: str) -> None:
        """A line worth saying: the time plan, a stop."""

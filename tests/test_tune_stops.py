"""How a tune stops and resumes, with a stand-in executor whose trials hold scripted rates (what only a stand-in
can do on demand: a trial that takes 200 s, an interrupt in the head-to-head): the time plan, outputs written
after every trial with the tune's state, an interrupted head-to-head resumed, one tuner per study, and a resume
that refuses a different study."""

import json
import math
import time
from types import SimpleNamespace
from concurrent.futures import Future

import pytest

import outcomes
from installed_vllm import VLLM_CPU
from servetune.engine.logfacts import StartupFacts
from servetune.executors import Job, WorkerError, WorkerLost
from servetune.study import StudyError, StudyLock, default_storage
from servetune.timelimit import TimePlan, parse_duration
from servetune.trial import LevelOptions
from servetune.tune import Hooks, TuneOptions, tune
from servetune.workload import WorkloadSpec

WORKLOAD = {"num_requests": 20, "input_len": {"type": "fixed", "value": 32}, "output_len": {"type": "fixed", "value": 8}}


class SimulatedClock:
    """The time plan's clock, in which a trial's `wall_s` passes when it is submitted."""

    def __init__(self, monkeypatch):
        self.offset = 0.0
        monkeypatch.setattr("servetune.timelimit.time", SimpleNamespace(time=lambda: time.time() + self.offset))


class StandIn:
    """Trial n holds `rates[n]` req/s (fails 10% above) after `wall_s` of launch and levels; the head-to-head
    level fails (or raises KeyboardInterrupt, as a Ctrl-C there would). `seen` reads summary.json as each trial
    starts."""

    slots = 1

    def __init__(self, rates: dict[int, float], out, wall_s: float = 60.0, interrupt_head_to_head: bool = False,
                 lose_head_to_head: int = 0, clock: SimulatedClock | None = None):
        self.rates, self.out, self.wall_s, self.interrupt = rates, out, wall_s, interrupt_head_to_head
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
        rate = self.rates[len([j for j in self.jobs if not j.plan.fixed_levels]) - 1]
        if self.clock is not None:
            self.clock.offset += self.wall_s
        future.set_result(outcomes.ok(
            job.config, levels=[outcomes.level("capacity", math.inf), outcomes.level("search", rate)],
            goodput_rate=rate, goodput_bracket=(rate, 1.1 * rate), request_throughput=2 * rate, p99_ttft_ms=10.0,
            p99_tpot_ms=5.0, wall_s=self.wall_s, startup=StartupFacts(ready_s=30.0)))
        return future

    def close(self) -> None:
        pass


def options(model, tmp_path, **kw) -> TuneOptions:
    return TuneOptions(model=str(model), workload=WorkloadSpec.model_validate(WORKLOAD), out=tmp_path / "out",
                       slo={"tpot_p99_ms": 25}, strategy="grid", levels=LevelOptions(requests=20, max_levels=1), **kw)


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def test_durations_read_as_a_person_writes_them():
    assert parse_duration("25m") == 1500 and parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    for bad in ("soon", "0m", "-5m", "5 minutes"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_the_time_plan_guesses_first_then_uses_what_it_measured():
    plan = TimePlan(limit_s=600, device="cpu")
    assert plan.trial_s() == 60 + 180 and plan.head_to_head_s(None) == 60 + 120 + 10  # guessed
    assert TimePlan(limit_s=600, head_to_head=False).head_to_head_s(5.0) == 0
    assert plan.can_launch(None)
    plan.started -= 470  # 130 s left: the first trial is still launched on its guess (a launch and a minute)
    assert plan.can_launch(None) and plan.affordable(None) == 1
    plan.started += 470
    plan.observe(wall_s=200, launch_s=120)  # a cold first launch: later ones are taken as at most the guess
    assert plan.launch_s() == 60 and plan.trial_s() == 60 + 80
    plan.observe(wall_s=100, launch_s=20)
    plan.observe(wall_s=140, launch_s=40)
    assert plan.launch_s() == 30 and plan.trial_s() == 30 + 80  # the launches after the first; the levels' median
    assert plan.head_to_head_s(10.0) == 30 + 60 + 10  # launch, a whole level of 600 requests at 10 req/s, stop
    assert plan.affordable(10.0) in ((600 - 100) // 110, (600 - 100) // 110 - 1)  # the clock runs
    assert plan.trial_deadline(10.0, trials_left=1) == pytest.approx(plan.deadline - 100)
    # two trials after this one keep a launch (30 s) and a minute of levels each
    assert plan.trial_deadline(10.0, trials_left=3) == pytest.approx(plan.deadline - 100 - 2 * 90)
    plan.started -= 400  # 200 s left: no whole trial (110 s) fits before the head-to-head (100 s), but one cut
    assert plan.affordable(10.0) == 1 and plan.can_launch(10.0)  # at its deadline does: a launch and a minute
    plan.started -= 100  # 100 s left: not even that
    assert not plan.can_launch(10.0) and plan.affordable(10.0) == 0
    assert TimePlan(limit_s=None).can_launch(1.0) and TimePlan(limit_s=None).trial_deadline(1.0, 2) is None


def test_the_plan_says_what_the_time_left_affords():
    plan = TimePlan(limit_s=600, device="cpu")
    assert plan.describe(None, 3).endswith("(guessed; launch ~1m00s), so ~1 of the 3 trials left and the head-to-head "
                                           "(~3m10s)")
    assert plan.describe(None, 0).endswith("(guessed; launch ~1m00s), the budget is spent; the head-to-head (~3m10s) "
                                           "is next")
    assert TimePlan(limit_s=600, head_to_head=False).describe(None, 0).endswith("the budget is spent")


def test_a_tune_stops_launching_when_the_next_trial_no_longer_fits_and_says_so(tiny_model, tmp_path, monkeypatch):
    executor = StandIn({0: 5.0, 1: 6.0, 2: 7.0}, tmp_path / "out", wall_s=220.0, clock=SimulatedClock(monkeypatch))
    summary = tune(options(tiny_model, tmp_path, budget=3, time_limit_s=250), executor=executor)
    assert len(executor.jobs) == 1  # a 220 s trial and the head-to-head do not fit in what is left of 250 s
    assert summary.state == "time-limit" and summary_of(tmp_path)["state"] == "time-limit"
    assert "2 of 3 trials not launched" in summary.not_done[0]
    assert summary.best.trial == 0 and summary.confirmation.recommended_goodput_rate == 5.0
    assert executor.jobs[0].deadline is not None  # the trial itself was given the time it could have
    assert "At the time limit: run vLLM's defaults: it holds 5.00 req/s" in summary.answer


def test_where_a_whole_trial_no_longer_fits_one_cut_at_its_deadline_still_runs(tiny_model, tmp_path, monkeypatch):
    """400 s: after a 220 s trial, 180 s are left: not a whole trial (220 s) and the head-to-head, but a launch, a
    minute of levels and the head-to-head (~134 s)."""
    executor = StandIn({0: 5.0, 1: 6.0, 2: 7.0}, tmp_path / "out", wall_s=220.0, clock=SimulatedClock(monkeypatch))
    summary = tune(options(tiny_model, tmp_path, budget=3, time_limit_s=400), executor=executor)
    searched = [j for j in executor.jobs if not j.plan.fixed_levels]
    assert len(searched) == 2 and searched[1].deadline is not None
    assert summary.state == "time-limit" and "1 of 3 trials not launched" in summary.not_done[0]


def test_outputs_are_written_after_every_trial_and_an_interrupted_head_to_head_resumes(tiny_model, tmp_path):
    out = tmp_path / "out"
    first = StandIn({0: 5.0, 1: 10.0}, out, interrupt_head_to_head=True)
    with pytest.raises(KeyboardInterrupt):
        tune(options(tiny_model, tmp_path, budget=2), executor=first)
    assert first.seen[0]["state"] == "running" and first.seen[0]["trials"] == 0
    assert first.seen[1]["trials"] == 1 and first.seen[1]["best"]["trial"] == 0  # written after trial 0
    interrupted = summary_of(tmp_path)
    assert interrupted["state"] == "interrupted" and interrupted["confirmation"] is None
    assert interrupted["best"]["trial"] == 1 and "--resume" in interrupted["not_done"][-1]
    assert (out / "best.yaml").exists() and (out / "report.html").exists() and (out / "trials.csv").exists()

    again = StandIn({}, out)
    summary = tune(options(tiny_model, tmp_path, budget=2, resume=True), executor=again)
    assert [bool(j.plan.fixed_levels) for j in again.jobs] == [True]  # only the head-to-head was left to do
    assert again.jobs[0].plan.fixed_levels[0][0] == 10.0  # the defaults at the pick's rate
    assert summary.state == "complete" and summary.confirmation.verdict == "confirmed"
    assert summary.best.trial == 1 and summary.gain == pytest.approx(1.0)
    assert summary_of(tmp_path)["state"] == "complete"


def test_a_second_tuner_on_a_study_is_refused_naming_the_holder(tiny_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    held = StudyLock(out, default_storage(out)).acquire()
    try:
        with pytest.raises(StudyError, match=r"being tuned by pid \d+ on .* since "):
            tune(options(tiny_model, tmp_path, budget=1), executor=StandIn({0: 5.0}, out))
        assert not (out / "study.db").exists()  # refused before it touched the study
    finally:
        held.release()
    assert tune(options(tiny_model, tmp_path, budget=1), executor=StandIn({0: 5.0}, out)).trials == 1
    assert not (out / StudyLock.FILE).exists()  # released with the run


def test_resume_refuses_a_study_made_with_other_options(tiny_model, tmp_path):
    tune(options(tiny_model, tmp_path, budget=1, confirm=False), executor=StandIn({0: 5.0}, tmp_path / "out"))
    changed = options(tiny_model, tmp_path, budget=2, resume=True, confirm=False, engine_args={"max_num_seqs": 8})
    with pytest.raises(StudyError, match=r'--engine-arg differs from the study\'s: it was \{\}, now \{"max_num_seqs": 8\}'):
        tune(changed, executor=StandIn({1: 6.0}, tmp_path / "out"))
    levels = options(tiny_model, tmp_path, budget=2, resume=True, confirm=False)
    levels = TuneOptions(**{**levels.__dict__, "levels": LevelOptions(requests=40, max_levels=1)})
    with pytest.raises(StudyError, match="the level options"):
        tune(levels, executor=StandIn({1: 6.0}, tmp_path / "out"))
    # the budget and the time limit may change
    more = options(tiny_model, tmp_path, budget=2, resume=True, confirm=False, time_limit_s=3600)
    assert tune(more, executor=StandIn({0: 6.0}, tmp_path / "out")).trials == 2


class Quiet(Hooks):
    pass


class Lost(Hooks):
    def __init__(self):
        self.lost: list[str] = []

    def confirm_lost(self, number: int, reason: str) -> None:
        self.lost.append(reason)


def test_a_head_to_head_whose_worker_is_lost_runs_again_as_a_search_trial_would(tiny_model, tmp_path):
    executor, hooks = StandIn({0: 5.0, 1: 10.0}, tmp_path / "out", lose_head_to_head=2), Lost()
    summary = tune(options(tiny_model, tmp_path, budget=2), hooks, executor=executor)
    assert [bool(j.plan.fixed_levels) for j in executor.jobs] == [False, False, True, True, True]
    assert hooks.lost == ["the node running it died"] * 2
    assert summary.confirmation.verdict == "confirmed" and not summary.not_done


def test_head_to_heads_that_keep_losing_their_worker_stop_the_tune_for_a_resume(tiny_model, tmp_path):
    with pytest.raises(WorkerError, match="3 trials in a row lost their worker .*continue with --resume"):
        tune(options(tiny_model, tmp_path, budget=2), executor=StandIn({0: 5.0, 1: 10.0}, tmp_path / "out",
                                                                       lose_head_to_head=99))
    summary = tune(options(tiny_model, tmp_path, budget=2, resume=True), executor=StandIn({}, tmp_path / "out"))
    assert summary.confirmation.verdict == "confirmed"  # the resume ran the head-to-head only


def test_the_cli_says_a_lost_worker_in_one_line(monkeypatch, capsys):
    import typer

    from servetune import cli

    def lost(opts):
        raise WorkerLost("ActorDiedError: the worker died")

    monkeypatch.setattr(cli, "_tune", lost)
    monkeypatch.setattr("servetune.interrupt.handle_signals", lambda: None)  # pytest keeps its own
    with pytest.raises(typer.Exit) as stop:
        cli._tune_guarded(None)
    assert stop.value.exit_code == 1
    assert "a trial's worker was lost (ActorDiedError: the worker died)" in capsys.readouterr().err

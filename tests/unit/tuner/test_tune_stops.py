"""How a tune stops and resumes, with a stand-in executor whose trials hold scripted rates (what only a stand-in
can do on demand: a trial that takes 200 s, an interrupt in the head-to-head): the time plan, outputs written
after every trial with the tune's state, an interrupted head-to-head resumed, one tuner per study, and a resume
that refuses a different study."""

import json

import pytest

from servetune.executors import WorkerError, WorkerLost
from servetune.measure.slo import parse_slo
from servetune.study.storage import StudyError, StudyLock, default_storage
from servetune.testing.simengine import SimClock
from servetune.timelimit import (
    GUESS_CAPACITY_S,
    GUESS_LAUNCH_S,
    STOP_S,
    Keep,
    NotStarted,
    TimePlan,
    TrialTime,
    parse_duration,
)
from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import Runtime, TuneOptions, tune
from servetune.workload import WorkloadSpec
from support.standins import StandIn
from support.workloads import WORKLOAD


def options(model, tmp_path, **kw) -> TuneOptions:
    return TuneOptions(model=str(model), workload=WorkloadSpec.model_validate(WORKLOAD), out=tmp_path / "out",
                       slo=parse_slo({"tpot_p99_ms": 25}), strategy="grid",
                       levels=LevelOptions(requests=20, max_levels=1), **kw)


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def test_durations_read_as_a_person_writes_them():
    assert parse_duration("25m") == 1500 and parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    assert parse_duration("1h5s") == 3605 and parse_duration("2.5m") == 150
    for bad in ("soon", "0m", "-5m", "5 minutes", "5m5m", "30s5m", "1h2h"):  # each unit once
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_the_time_plan_guesses_a_cold_first_launch_then_uses_what_it_measured():
    clock = SimClock()
    plan = TimePlan(limit_s=900, device="cpu", budget_trials=4, clock=clock)
    assert plan.launch_s() == GUESS_LAUNCH_S["cpu"][0]  # nothing measured: the first launch fills the caches
    assert plan.launch_s(later=True) == GUESS_LAUNCH_S["cpu"][1]  # one after a launch that starts now finds them full
    plan.observe_launch(200)  # a cold first launch: later ones are taken as at most the guess of a later one
    assert plan.launch_s() == GUESS_LAUNCH_S["cpu"][1]
    plan.observe_launch(20)
    plan.observe_launch(40)
    assert plan.launch_s() == 30  # the median of the launches after the first
    assert plan.level_s == 900 / (2 * 5)  # two deciding levels for each trial of the budget and the head-to-head
    assert plan.trial_s(first_level_s=50) == 30 + 50 + 10  # a launch, the first deciding level, a stop
    clock.advance_to(clock.now + 800)  # 100 s left: a 90 s trial fits, not beside 20 s kept for a head-to-head
    assert plan.launch_fits(50) and not plan.launch_fits(50, reserve_s=20)
    assert plan.head_to_head_fits()  # a launch (30 s) and a stop
    clock.advance_to(clock.now + 80)  # 20 s left: only a tune's first trial is launched, whatever the time
    assert plan.launch_fits(50, first=True) and not plan.launch_fits(0)
    assert not plan.head_to_head_fits()
    clock.advance_to(clock.now + 20)
    assert not plan.launch_fits(50, first=True)
    allowed = plan.trial_time(reserve_s=20, keep=None, next_trial_s=90, after=2, baseline=False)
    assert allowed.deadline == plan.deadline - 20 and allowed.share_s == 2 * plan.level_s
    assert TimePlan(limit_s=None).trial_time(reserve_s=0, keep=None, next_trial_s=0, after=0, baseline=True) is None


def test_a_levels_requests_fit_its_time_its_share_and_leave_room_for_the_trials_after_it():
    allowed = TrialTime(deadline=1000.0, level_s=60.0, share_s=120.0, next_trial_s=100.0, after=3)
    # 600 requests at 10 req/s take a minute: the cap holds; held to level_s (60 s) at 20 req/s
    assert allowed.level_size(now=0, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5) == 600
    assert allowed.level_size(now=0, end=1000, rate_per_s=20, cap=2000, least=300, drain_s=5) == 1200
    # near the end it shrinks to what fits (50 s less the drain and a stop), and is not started below the least
    assert allowed.level_size(now=950, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5) == 350
    assert allowed.level_size(now=980, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5) == NotStarted(
        "more than the 20s left")
    # 300 requests at 2 req/s take 2m35s, more than a trial's share (2m), while other trials would use the time
    assert "share" in allowed.level_size(now=0, end=1000, rate_per_s=2, cap=600, least=300, drain_s=5).why
    # vLLM's defaults are held to it only once a level of theirs was decided
    defaults = TrialTime(deadline=1000.0, share_s=120.0, next_trial_s=100.0, after=3, baseline=True)
    assert defaults.level_size(now=0, end=1000, rate_per_s=2, cap=600, least=300, drain_s=5) == 600
    assert defaults.level_size(now=0, end=1000, rate_per_s=2, cap=600, least=300, drain_s=5,
                               decided=True) == NotStarted("more than a trial's share of the limit (2m00s)")
    # after its first verdict a trial goes on only while the 3 trials after it keep 100 s each and a deciding level
    # as long as this one (35 s): 405 s
    assert allowed.level_size(now=560, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5,
                              decided=True) == NotStarted("going on would leave the 3 trials left less than they need")
    assert allowed.level_size(now=540, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5, decided=True) == 400
    # with 300 s left only 2 of them fit at all: room is kept for those 2
    assert allowed.level_size(now=700, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5,
                              decided=True) == NotStarted("going on would leave the 2 trials left less than they need")
    assert allowed.level_size(now=850, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5,
                              decided=True) == NotStarted("going on would leave the trial left less than it needs")
    assert allowed.level_size(now=700, end=1000, rate_per_s=10, cap=600, least=300, drain_s=5) == 600  # the first
    # the last trial, or one after which no other fits, uses the rest
    assert TrialTime(deadline=1000.0).refines(now=0, end=1000)
    assert allowed.refines(now=950, end=1000) and not allowed.refines(now=0, end=1000)


def test_the_head_to_heads_time_is_kept_once_a_pass_needs_it():
    keep = Keep(low=5.0, high=8.0, launch_s=30.0, requests=300, drain_s=5.0)
    allowed = TrialTime(deadline=1000.0, keep=keep)
    assert allowed.end([4.0]) == 1000  # below the defaults' rate: no head-to-head
    assert allowed.end([4.0, 6.0]) == 1000 - (1.25 * 30 + 300 / 6 + 5 + 10)  # above it, below their failure: kept
    assert allowed.end([6.0, 9.0]) == 1000  # the highest pass is above a rate the defaults failed at: nothing to run


def test_the_plan_says_what_the_time_left_affords():
    plan = TimePlan(limit_s=600, device="cpu", clock=SimClock())
    assert plan.describe(30, 3) == ("time left 10m00s: a trial needs at least ~2m40s (launch ~2m00s, guessed; its "
                                    "first deciding level ~30s), room for ~3 of the 3 trials left")
    assert plan.describe(30, 0, reserve_s=90).endswith("the budget is spent; 1m30s kept for the head-to-head")
    assert plan.describe(30, 1).endswith("room for ~1 of the 1 trial left")
    # 5 minutes: the first trial's cold launch (2m40s with its level), then a warm one (1m40s)
    assert TimePlan(limit_s=300, device="cpu", clock=SimClock()).describe(30, 3).endswith("room for ~2 of the 3 "
                                                                                          "trials left")


def test_a_tune_stops_launching_when_the_next_trial_no_longer_fits_and_says_so(tiny_model, tmp_path):
    clock = SimClock()
    executor = StandIn({0: 5.0, 1: 6.0, 2: 7.0}, tmp_path / "out", wall_s=220.0, clock=clock)
    summary = tune(options(tiny_model, tmp_path, budget=3, time_limit_s=250), executor=executor,
                   runtime=Runtime(clock=clock))
    assert len(executor.jobs) == 1  # a 220 s trial: the 30 s left hold no launch (30 s) and a race level at 5 req/s
    assert summary.state == "time-limit" and summary_of(tmp_path)["state"] == "time-limit"
    assert "2 of 3 trials not launched: the 30s left hold no launch and first deciding level" in summary.not_done[0]
    assert summary.best.trial == 0 and summary.confirmation.recommended_goodput_rate == 5.0
    assert executor.jobs[0].trial_time.deadline == clock.now - 220 + 250  # the tune's own deadline: no slice
    # the trials after the first launch into its compile caches: the room the defaults keep for them is a warm
    # launch's (a cold one's cut the defaults' search on the H200 with 9m26s left and 2 trials of 2m19s to come)
    assert executor.jobs[0].trial_time.next_trial_s == GUESS_LAUNCH_S["cpu"][1] + GUESS_CAPACITY_S + STOP_S
    assert "At the time limit: run vLLM's defaults: it holds 5.00 req/s" in summary.answer
    assert summary.time.unused_s == 30 and summary.time.elapsed_s == 220


def test_a_candidate_races_at_the_best_rate_and_the_last_one_that_fits_runs(tiny_model, tmp_path):
    """400 s: after a 220 s trial, 180 s are left: a launch (30 s) and a deciding level at 5 req/s fit."""
    clock = SimClock()
    executor = StandIn({0: 5.0, 1: 6.0, 2: 7.0}, tmp_path / "out", wall_s=220.0, clock=clock)
    summary = tune(options(tiny_model, tmp_path, budget=3, time_limit_s=400), executor=executor,
                   runtime=Runtime(clock=clock))
    searched = [j for j in executor.jobs if not j.plan.fixed_levels]
    assert len(searched) == 2 and searched[0].plan.race is None
    assert searched[1].plan.race.rate == 5.0 and searched[1].plan.race.beat == 5.5
    assert searched[1].trial_time.after == 1 and searched[1].trial_time.deadline == searched[0].trial_time.deadline
    assert summary.state == "time-limit" and "1 of 3 trials not launched" in summary.not_done[0]


def test_no_time_is_kept_for_a_head_to_head_that_the_best_config_makes_moot(tiny_model, tmp_path):
    """The defaults hold 5 and fail at 8 req/s: trial 1's 6 would need the head-to-head, trial 2's 9 beats them by
    their own failure and is the pick, so trial 3 keeps nothing for a head-to-head (seed 296 of bench/simulate.py
    left 2m19s unused so)."""
    clock = SimClock()
    executor = StandIn({0: 5.0, 1: 6.0, 2: 9.0, 3: 7.0}, tmp_path / "out", clock=clock, fails={0: 8.0})
    summary = tune(options(tiny_model, tmp_path, budget=4, time_limit_s=3600), executor=executor,
                   runtime=Runtime(clock=clock))
    searched = [j for j in executor.jobs if not j.plan.fixed_levels]
    assert searched[2].trial_time.deadline < searched[0].trial_time.deadline  # trial 1's pass at 6 keeps the time
    assert searched[3].trial_time.deadline == searched[0].trial_time.deadline
    assert summary.confirmation.method == "search" and summary.confirmation.recommended_trial == 2


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
    with pytest.raises(StudyError,
                       match=r'--engine-arg differs from the study\'s: it was \{\}, now \{"max_num_seqs": 8\}'):
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


def test_a_resume_with_other_settings_is_refused_before_any_prompt_is_built(tiny_model, tmp_path, monkeypatch):
    """The options that define the study are compared once its lock is taken, before the
    tokenizer is loaded (it took 112 s of prompts before); with the same options a resume goes on to its prompts."""

    class PromptsBuilt(Exception):
        pass

    def prompts(*args, **kwargs):
        raise PromptsBuilt

    tune(options(tiny_model, tmp_path, budget=1, confirm=False), executor=StandIn({0: 5.0}, tmp_path / "out"))
    monkeypatch.setattr("servetune.tuner.loop.load_tokenizer", prompts)
    again = options(tiny_model, tmp_path, budget=2, resume=True, confirm=False)
    with pytest.raises(PromptsBuilt):
        tune(again, executor=StandIn({1: 6.0}, tmp_path / "out"))
    with pytest.raises(StudyError, match=r'^--resume: the level options \(.*\) differs from the study\'s: it was '
                                         r'\{"requests": 20\}, now \{"requests": 40\}'):
        tune(TuneOptions(**{**again.__dict__, "levels": LevelOptions(requests=40, max_levels=1)}),
             executor=StandIn({1: 6.0}, tmp_path / "out"))
    with pytest.raises(StudyError, match=r"^--resume: --engine-arg differs"):
        tune(TuneOptions(**{**again.__dict__, "engine_args": {"max_num_seqs": 8}}),
             executor=StandIn({1: 6.0}, tmp_path / "out"))


def test_a_stop_before_a_resumed_tune_began_says_the_outputs_state_as_they_are(tiny_model, tmp_path, monkeypatch,
                                                                               capsys):
    """A SIGTERM while a --resume builds its prompts printed "state: interrupted" while
    summary.json, untouched, still said complete: the line now says the state the outputs have."""
    import signal

    import typer

    from servetune import cli
    from servetune.interrupt import Interrupted

    tune(options(tiny_model, tmp_path, budget=1, confirm=False), executor=StandIn({0: 5.0}, tmp_path / "out"))

    def stopped(*args, **kwargs):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr("servetune.tuner.loop.load_tokenizer", stopped)
    monkeypatch.setattr("servetune.interrupt.handle_signals", lambda: None)  # pytest keeps its own
    with pytest.raises(typer.Exit) as stop:
        cli._tune_guarded(options(tiny_model, tmp_path, budget=2, resume=True, confirm=False))
    assert stop.value.exit_code == 143
    err = " ".join(capsys.readouterr().err.split())
    assert summary_of(tmp_path)["state"] == "complete"
    assert err == (f"error: interrupted (SIGTERM); no server is left running; the outputs in {tmp_path / 'out'} are "
                   "as they were (state: complete). Continue with the same command and --resume")


def test_a_cpu_tune_offers_no_knobs_and_says_why_it_has_no_roofline(tiny_model, tmp_path):
    notes: list[str] = []

    class Notes(Hooks):
        def note(self, text: str) -> None:
            notes.append(text)

    clock = SimClock()
    executor = StandIn({0: 5.0}, tmp_path / "out", clock=clock)
    summary = tune(options(tiny_model, tmp_path, budget=1), hooks=Notes(), executor=executor,
                   runtime=Runtime(clock=clock))
    assert not any("also searched" in note for note in notes), notes
    assert summary_of(tmp_path)["roofline"]["note"].startswith("no bound on CPU")
    assert summary.limit_line.startswith("Roofline: no bound on CPU")

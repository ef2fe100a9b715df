"""The answer path is total: for any study a tune can leave behind (no trial; every trial lost, failed or skipped;
levels undecided or with nothing finished; a head-to-head without a rate; a tune interrupted in a launch, a level
or the head-to-head), the results read it, `answer` says what is known in a sentence, and summary.json, best.yaml,
best_command.sh and the report are written. Studies are generated (Hypothesis) through servetune's own models."""

import html
import io
import json
import math
import re
import tempfile
from pathlib import Path

import optuna
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from rich.console import Console

from servetune.console import result_table
from servetune.engine.logfacts import FailureKind, StartupFacts
from servetune.report import publish
from servetune.study.outcome import Failure, LevelName, TrialOutcome
from servetune.study.record import HeadToHead, LevelRecord, Progress, StudyMeta, StudyRecord, TrialRecord
from servetune.study.results import Results, write_outputs
from support import outcomes

KNOB = {"max_num_batched_tokens": [128, 256, 512]}
UNIT = "req/s"

rates = st.floats(0.05, 80, allow_nan=False)
states = st.sampled_from(["running", "interrupted", "time-limit", "complete"])


@st.composite
def levels(draw, race: bool) -> list:
    """A trial's levels: a capacity level (with nothing finished, or a throughput), a race or search levels, each
    pass, fail or undecided, some with nothing finished."""
    made = []
    if race:
        made.append(_level(draw, LevelName.RACE, draw(rates)))
    if draw(st.booleans()):
        done = draw(st.sampled_from([0, 120]))
        made.append(outcomes.level(LevelName.CAPACITY, math.inf, verdict="pass" if done else "fail",
                                   completed=done, request_throughput=draw(rates) if done else 0.0,
                                   p99_ttft_ms=draw(rates) if done else 0.0))
    for _ in range(draw(st.integers(0, 4))):
        made.append(_level(draw, LevelName.SEARCH, draw(rates)))
    return made


def _level(draw, name: LevelName, rate: float):
    verdict = draw(st.sampled_from(["pass", "fail", "undecided"]))
    done = draw(st.sampled_from([0, 40, 400])) if verdict != "pass" else 400
    return outcomes.level(name, rate, verdict=verdict, reasons=[] if verdict == "pass" else [f"{verdict}: why"],
                          completed=done, p99_ttft_ms=draw(rates) if done else 0.0)


@st.composite
def outcome(draw) -> TrialOutcome:
    startup = draw(st.none() | st.builds(StartupFacts, ready_s=st.floats(1, 400)))
    wall = draw(st.none() | st.floats(1, 900))
    if draw(st.integers(0, 4)) == 0:
        failure = Failure(kind=draw(st.sampled_from(list(FailureKind))), reason="it did not start", log="server.log")
        return TrialOutcome.failed({}, failure, wall_s=wall, startup=startup,
                                   cut_short=draw(st.none() | st.just("time limit: the launch did not finish")))
    made = draw(levels(race=draw(st.booleans())))
    finite = [lv for lv in made if math.isfinite(lv.rate)]
    passed = [lv.rate for lv in finite if lv.passed]
    best = max(passed, default=None)
    above = [lv.rate for lv in finite if not lv.passed and (best is None or lv.rate > best)]
    capacity = next((lv for lv in made if lv.name == LevelName.CAPACITY and lv.metrics.completed), None)
    bracket = (best or 0.0, min(above, default=capacity.metrics.request_throughput if capacity else best or 1.0))
    decisive = next((lv for lv in made if lv.passed and lv.rate == best), capacity)
    return outcomes.ok(levels=made, goodput_rate=best, goodput_bracket=bracket if finite else None,
                       request_throughput=capacity.metrics.request_throughput if capacity else None,
                       p99_ttft_ms=decisive.metrics.p99_ttft_ms if decisive else None,
                       p99_tpot_ms=decisive.metrics.p99_tpot_ms if decisive else None, wall_s=wall, startup=startup,
                       cut_short=draw(st.none() | st.just("time limit: a search level needs more than is left")))


trial_kinds = st.sampled_from(["measured", "measured", "measured", "skipped", "interrupted", "running"])


@st.composite
def studies(draw) -> StudyRecord:
    """A study as a tune leaves it: its meta, trials of every kind (the first, vLLM's defaults, where there is one),
    maybe a head-to-head, and its progress."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    record = StudyRecord(study)
    record.start(StudyMeta(model="m", workload={"input_len": {"type": "fixed", "value": 64}}, slo={"ttft_p99_ms": 500},
                           objective="goodput", strategy="optuna", space={"knobs": KNOB, "fixed": {}},
                           vllm_version="0.32.0", device="cpu", out="/nonexistent", levels={"confidence": 0.95}))
    measured = []
    for made in range(draw(st.integers(0, 5))):
        number = len(study.get_trials(deepcopy=False))  # a requeued trial queued one more
        kind, role = draw(trial_kinds), "default" if made == 0 else "search"
        params = {} if role == "default" else {"max_num_batched_tokens": draw(st.sampled_from(KNOB[
            "max_num_batched_tokens"]))}
        attrs = TrialRecord(role=role)
        state, value = TrialState.RUNNING, None
        if kind == "skipped":
            attrs, state = attrs.model_copy(update={"skipped": "predicted not to start"}), TrialState.PRUNED
        elif kind == "measured":
            out = draw(outcome()).model_copy(update={"config": params})
            attrs = attrs.model_copy(update={"outcome": out, "config_requested": params})
            state = TrialState.COMPLETE if out.ok else TrialState.PRUNED
            value = (out.goodput_rate or 0.0) if out.ok else None
            measured.append((number, out))
        trial = optuna.trial.create_trial(state=state, value=value, params=params, user_attrs=attrs.stored(),
                                          distributions={k: CategoricalDistribution(KNOB[k]) for k in params})
        study.add_trial(trial)
        if kind == "interrupted":
            record.requeue(record.trial(number), "worker lost: the node died")
    if measured and draw(st.booleans()):
        record.write_confirmation(draw(head_to_heads(measured)))
    record.write_progress(Progress(state=draw(states), not_done=draw(st.lists(st.just("a thing not done"), max_size=2)),
                                   time_limit_s=draw(st.none() | st.floats(60, 3600)),
                                   elapsed_s=draw(st.none() | st.floats(0, 3600)),
                                   next_trial_s=draw(st.none() | st.floats(10, 900))))
    return record


@st.composite
def head_to_heads(draw, measured: list[tuple[int, TrialOutcome]]) -> HeadToHead:
    number, pick = draw(st.sampled_from(measured))
    verdict = draw(st.sampled_from(["confirmed", "not confirmed", "undecided", "not run", "defaults"]))
    rate = draw(st.none() | rates)
    level = LevelRecord(rate=rate or 1.0, verdict=draw(st.sampled_from(["pass", "fail", "undecided"])))
    return HeadToHead(method=draw(st.sampled_from(["head-to-head", "search"])),
                      pick=LevelRecord(trial=number, rate=rate or 1.0), head_to_head=draw(st.none() | st.just(level)),
                      verdict=verdict, recommended_trial=number, recommended_goodput_rate=rate,
                      default_goodput_rate=draw(st.none() | rates), reason=draw(st.sampled_from(["", "because"])),
                      wall_s=draw(st.none() | st.floats(1, 300)))


def check_answer(results: Results) -> None:
    summary = results.summary
    text = summary.answer
    assert text and text.endswith(".") and text[0].isupper(), text
    assert not re.search(r"\bNone\b|\bnan\b|\binf\b", text), text
    if not results.rows:
        assert "nothing was measured" in text.lower()
    if "it holds" in text:  # a rate is claimed only where a level passed at it
        claimed = float(re.search(r"it holds ([\d.]+)", text).group(1))
        passed = {round(lv.rate, 2) for row in results.rows for lv in row.levels if lv.passed}
        confirmed = summary.confirmation.recommended_goodput_rate if summary.confirmation else None
        assert claimed in passed or (confirmed is not None and round(confirmed, 2) == claimed), (claimed, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=studies())
def test_every_study_reads_into_an_answer_and_its_files(record):
    results = Results(record)
    check_answer(results)
    with tempfile.TemporaryDirectory() as out:
        write_outputs(results, Path(out))
        written = json.loads((Path(out) / "summary.json").read_text())
        assert written["answer"] == results.summary.answer and written["state"] == results.summary.state
        assert (Path(out) / "best.yaml").exists() == (results.summary.best is not None)
        assert (Path(out) / "best_command.sh").exists() == (results.summary.best is not None)
    table = Console(file=io.StringIO(), width=200)
    table.print(result_table(results.summary))  # the CLI's table: "-" where a number was never measured
    if results.summary.best is not None and None in results.summary.best.slo_p99.values():
        assert "| -" in table.file.getvalue().replace("│", "|")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=studies())
def test_every_study_has_a_report_that_shows_no_unmeasured_number(record):
    results = Results(record)
    with tempfile.TemporaryDirectory() as out:
        page = html.unescape(publish(results, Path(out)).read_text())
    assert results.summary.answer in page
    best = results.summary.best
    if best is not None and all(p99 is None for p99 in best.slo_p99.values()):
        assert "not measured" in page  # the headline card, never "0 · 0.0 ms"
    if best is not None and not results.summary.recommended_rate:
        assert "none decided" in page

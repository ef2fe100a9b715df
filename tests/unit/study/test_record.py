"""The study record (`servetune.study.record`): what servetune keeps in an Optuna study reads back as written, is
versioned, refuses a newer version, and is read and written nowhere else."""

import re

import optuna
import pytest
from optuna.trial import TrialState

from servetune.errors import StudyError
from servetune.measure.verdict import Decision, SloTest, StopReason
from servetune.study.record import (
    RECORD_VERSION,
    HeadToHead,
    HeadToHeadMethod,
    LevelRecord,
    Progress,
    Reference,
    Role,
    StudyMeta,
    StudyRecord,
    TrialRecord,
    read_trial,
    write_trial,
)
from support import outcomes
from support.paths import ROOT

SRC = ROOT / "src" / "servetune"
META = StudyMeta(model="/m", workload={"num_requests": 10}, slo={"tpot_p99_ms": 25.0}, objective="goodput",
                 strategy="seed", budget=3,
                 space={"knobs": {"max_num_seqs": [16, 32]}, "fixed": {}, "max_model_len": 64, "context": 2048},
                 vllm_version="0.32.0", device="cpu", out="/out", levels={"confidence": 0.95})


def sqlite_study(tmp_path) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="servetune",
                               direction="maximize")


def test_a_trials_record_reads_back_as_written(tmp_path):
    record = StudyRecord(sqlite_study(tmp_path))
    record.start(META)
    record.enqueue({"max_num_seqs": 16}, TrialRecord(role="seed", ladder="max_num_seqs", planned={"max_num_seqs": 16},
                                                     why="the procedure: max_num_seqs ladder"))
    trial = record.study.ask()
    out = outcomes.ok({"max_num_seqs": 16}, levels=[outcomes.level("search", 2.0)], goodput_rate=2.0)
    write_trial(trial, config_requested={"max_num_seqs": 16}, outcome=out, constraints=[-1.5])
    record.study.tell(trial, 2.0)

    again = StudyRecord(optuna.load_study(study_name="servetune", storage=f"sqlite:///{tmp_path / 'study.db'}"))
    [t] = again.trials()
    assert t.record == read_trial(record.study.trials[0])
    assert (t.record.role, t.record.ladder, t.record.why) == ("seed", "max_num_seqs",
                                                              "the procedure: max_num_seqs ladder")
    assert t.outcome == out and t.record.constraints == [-1.5] and t.measured and t.objective_value == 2.0
    assert again.meta == META and again.stored_meta == META.stored()
    assert TrialRecord().role == "search" and TrialRecord().stored() == {}  # a trial TPE proposed: nothing written


def test_a_trials_role_is_typed_and_stored_as_before(tmp_path):
    """Roles read back as `Role`s, a --reference-config's as a `Reference`; the study keeps the same text as ever."""
    study = sqlite_study(tmp_path)
    record = StudyRecord(study)
    record.enqueue({}, TrialRecord(role=Role.DEFAULT, planned={}))
    record.enqueue({}, TrialRecord(role=Reference(1), planned={}, reference={"max_num_seqs": 8}))
    for _ in range(2):
        study.tell(study.ask(), 1.0)
    assert [t.user_attrs["role"] for t in study.trials] == ["default", "reference-1"]
    assert [t.record.role for t in StudyRecord(study).trials()] == [Role.DEFAULT, Reference(1)]
    assert TrialRecord.read({"role": "reference-0"}).role == Reference(0) and str(Reference(0)) == "reference-0"
    assert [str(TrialRecord.read({"role": r.value}).role) for r in Role] == [r.value for r in Role]
    with pytest.raises(ValueError, match="role"):
        TrialRecord.read({"role": "reference"})


def test_the_studys_record_reads_back_as_written(tmp_path):
    record = StudyRecord(sqlite_study(tmp_path))
    record.start(META)
    assert record.progress == Progress()  # nothing written yet: complete, as a study made before progress
    record.write_progress(Progress(state="running", not_done=["the head-to-head"], time_limit_s=600.0, elapsed_s=12.5))
    test = SloTest(slo="tpot_p99_ms", bound_ms=25.0, over=9, counted=60, requests=60, low=0.08, high=0.2,
                   decision=Decision.FAIL)
    decided = HeadToHead(method="head-to-head", pick=LevelRecord(trial=3, rate=10.0), verdict="confirmed",
                         head_to_head=LevelRecord(rate=10.0, verdict="fail", reasons=["x"], requests=60, tests=[test],
                                                  p99={"tpot_p99_ms": 31.0}),
                         recommended_trial=3, recommended_goodput_rate=10.0, default_goodput_rate=5.0,
                         reason="trial 3 holds 10.00 req/s", search_trials=4)
    record.write_confirmation(decided)
    assert record.progress.state == "running" and record.progress.not_done == ["the head-to-head"]
    assert record.confirmation == decided and record.confirmation.confirmed
    stored = record.study.user_attrs["confirmation"]
    assert list(stored) == ["method", "pick", "head_to_head", "verdict", "recommended_trial",
                            "recommended_goodput_rate", "default_goodput_rate", "reason", "search_trials"]
    assert stored["pick"] == {"trial": 3, "rate": 10.0}  # a pick without its level: no empty fields
    assert stored["head_to_head"]["tests"][0]["decision"] == "fail"
    assert record.confirmation.method is HeadToHeadMethod.HEAD_TO_HEAD and stored["method"] == "head-to-head"
    older = {k: v for k, v in stored["head_to_head"]["tests"][0].items() if k != "limit"}  # stored before limits
    assert SloTest.model_validate(older).limit == pytest.approx(0.01)


def test_a_levels_stop_reason_is_typed_and_stored_as_the_text_studies_hold():
    for stored in ("decided", "saturated", "time limit", "measured"):
        level = type(outcomes.level()).model_validate(outcomes.level().model_dump() | {"stopped": stored})
        assert level.stopped is StopReason(stored) and level.model_dump(mode="json")["stopped"] == stored
    with pytest.raises(ValueError, match="stopped"):
        type(outcomes.level()).model_validate(outcomes.level().model_dump() | {"stopped": "bored"})


def test_an_older_record_keeps_what_it_stored_and_its_order():
    pooled = {"requests_per_run": 300, "seeds": 3, "default": {"trial": 0}, "candidates": [], "verdict": "defaults",
              "reason": "no searched config beat them", "recommended_trial": 0, "recommended_goodput_rate": 5.0,
              "default_goodput_rate": 5.0}
    read = HeadToHead.read(pooled)
    assert read.method is None and read.stored() == pooled and list(read.stored()) == list(pooled)


def test_a_new_study_carries_the_records_version_and_a_newer_one_is_refused(tmp_path):
    study = sqlite_study(tmp_path)
    StudyRecord(study).start(META)
    assert study.user_attrs["record_version"] == RECORD_VERSION
    study.set_user_attr("record_version", RECORD_VERSION + 1)
    with pytest.raises(StudyError, match=f"newer servetune \\(its record version is {RECORD_VERSION + 1}"):
        StudyRecord(study)


def test_a_trial_record_of_a_newer_outcome_is_refused_naming_the_trial():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    trial.set_user_attr("outcome", outcomes.ok().stored() | {"schema_version": 99})
    with pytest.raises(StudyError, match="trial 0's record cannot be read: .*newer"):
        read_trial(trial)
    with pytest.raises(TypeError, match="not fields of a trial's record: colour"):
        write_trial(trial, colour="blue")


def test_requeue_marks_the_trial_interrupted_and_queues_it_again_with_its_record(tmp_path):
    record = StudyRecord(sqlite_study(tmp_path))
    record.start(META)
    record.enqueue({"max_num_seqs": 32}, TrialRecord(role="seed", ladder="max_num_seqs", planned={"max_num_seqs": 32},
                                                     why="the procedure", reference={"max_num_seqs": 32}))
    trial = record.study.ask()
    trial.suggest_categorical("max_num_seqs", [16, 32])
    write_trial(trial, config_requested={"max_num_seqs": 32}, model_len_reason="tightened")
    record.requeue(record.trial(trial.number), "worker lost: node died")

    lost, again = record.trials()
    assert lost.state == TrialState.FAIL and lost.record.interrupted == "worker lost: node died"
    assert record.interrupted == {0: "worker lost: node died"}
    assert again.state == TrialState.WAITING and again.params == {} and again.record.stored() == {
        "role": "seed", "planned": {"max_num_seqs": 32}, "why": "the procedure", "ladder": "max_num_seqs",
        "reference": {"max_num_seqs": 32}}  # kept: what it was and why; not what it measured or asked
    queued = record.study.ask()
    assert queued.suggest_categorical("max_num_seqs", [16, 32]) == 32  # the same config comes next
    exported = record.exported()
    assert exported[0]["interrupted"] == "worker lost: node died" and list(exported[0])[4:] == [
        "config_requested", "interrupted", "ladder", "model_len_reason", "planned", "reference", "role", "why"]


def test_a_version_1_study_keeps_interrupted_on_the_trial(tmp_path):
    study = sqlite_study(tmp_path)
    study.set_user_attr("meta", META.stored())  # written before the record was versioned
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"role": "default",
                                                                                   "interrupted": "the tuner stopped"}))
    record = StudyRecord(study)
    assert record.trials()[0].record.interrupted == "the tuner stopped"
    assert record.interrupted == {0: "the tuner stopped"}
    assert record.exported()[0]["interrupted"] == "the tuner stopped"


def test_no_module_but_the_record_reads_or_writes_optunas_user_attributes():
    """The record model is the one reader and writer of user attributes, through Optuna's public API."""
    attrs = re.compile(r"user_attrs|set_user_attr|enqueue_trial|set_system_attr|system_attrs")
    private = re.compile(r"\._storage\b|\._trial_id\b|\._study_id\b")
    found, privately = [], []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if path.name != "record.py" and attrs.search(text):
            found.append(str(path.relative_to(SRC)))
        if private.search(text):
            privately.append(str(path.relative_to(SRC)))
    assert found == [], f"user attributes read or written outside servetune/study/record.py: {found}"
    assert privately == [], f"Optuna's private API used in: {privately}"

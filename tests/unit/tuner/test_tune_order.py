"""What the tuner does first and in which order: bad input fails before vLLM is probed, and each trial is
announced before it runs (the in-process executor runs a trial inside `submit`)."""

from concurrent.futures import Future

import pytest

from servetune.errors import ServetuneError
from servetune.executors import Job
from servetune.measure.slo import parse_slo
from servetune.study.outcome import Failure, TrialOutcome
from servetune.study.storage import StudyError
from servetune.testing.installed import VLLM_CPU
from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions
from servetune.tuner.loop import TuneOptions, tune
from servetune.workload import WorkloadError, WorkloadSpec

WORKLOAD = {"num_requests": 20, "input_len": {"type": "fixed", "value": 32},
            "output_len": {"type": "fixed", "value": 8}}


class NeverProbed:
    """An executor that fails the test if the tuner gets as far as probing vLLM."""

    slots = 1

    def probe(self):
        raise AssertionError("vLLM was probed before the input was checked")

    def close(self) -> None:
        pass


def options(model, tmp_path, **kw) -> TuneOptions:
    return TuneOptions(model=str(model), workload=WorkloadSpec.model_validate(kw.pop("workload", WORKLOAD)),
                       out=tmp_path / "out", slo=parse_slo({"ttft_p99_ms": 500}),
                       levels=LevelOptions(requests=20, max_levels=1),
                       confirm=False, **kw)


def test_a_bad_study_url_fails_before_the_probe_without_its_password(tiny_model, tmp_path):
    url = "postgresql+psycopg://alice:S3cretPW@127.0.0.1:9/db"
    with pytest.raises(StudyError) as e:
        tune(options(tiny_model, tmp_path, storage=url), executor=NeverProbed())
    assert "alice:***@127.0.0.1:9" in str(e.value) and "S3cretPW" not in str(e.value)


def test_an_existing_study_without_resume_fails_before_the_probe(tiny_model, tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(storage=storage, study_name="servetune")
    with pytest.raises(StudyError, match="already holds a study"):
        tune(options(tiny_model, tmp_path, storage=storage), executor=NeverProbed())


def test_a_missing_dataset_fails_before_the_probe(tiny_model, tmp_path):
    workload = {"num_requests": 5, "dataset": {"path": str(tmp_path / "nope.jsonl"), "format": "jsonl"}}
    with pytest.raises(WorkloadError, match="nope.jsonl: cannot read"):
        tune(options(tiny_model, tmp_path, workload=workload), executor=NeverProbed())


def test_a_model_without_a_tokenizer_fails_before_the_probe(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match="cannot load tokenizer"):
        tune(options(tmp_path / "empty", tmp_path), executor=NeverProbed())


def test_a_workload_longer_than_the_models_context_fails_before_the_probe(tiny_model, tmp_path):
    workload = {"num_requests": 5, "input_len": {"type": "fixed", "value": 4000},
                "output_len": {"type": "fixed", "value": 200}}
    with pytest.raises(ServetuneError, match="needs max-model-len 4200, the model's context is 4096 tokens"):
        tune(options(tiny_model, tmp_path, workload=workload), executor=NeverProbed())
    with pytest.raises(ServetuneError, match="--min-model-len must be a positive"):
        options(tiny_model, tmp_path, min_model_len=0)


class InProcess:
    """Like `Inline`: the trial runs inside `submit` (here it only notes that it ran)."""

    slots = 1

    def __init__(self, events: list):
        self.events = events

    def probe(self):
        return VLLM_CPU

    def misfit(self, job: Job):
        return None

    def submit(self, job: Job) -> Future:
        self.events.append(("ran", job.number))
        future: Future = Future()
        future.set_result(TrialOutcome.failed(job.config, Failure(kind="exited", reason="stand-in")))
        return future

    def close(self) -> None:
        pass


class Noted(Hooks):
    def __init__(self, events: list):
        self.events = events

    def trial_started(self, number, config, why):
        self.events.append(("started", number))

    def trial_finished(self, number, out):
        self.events.append(("finished", number))


def test_each_trial_is_announced_before_it_runs(tiny_model, tmp_path):
    events: list = []
    tune(options(tiny_model, tmp_path, budget=2), Noted(events), executor=InProcess(events))
    numbers = sorted({n for _, n in events})
    assert len(numbers) == 2
    assert events == [(what, n) for n in numbers for what in ("started", "ran", "finished")]


def test_the_study_keeps_the_models_context_and_tightens_no_lower_than_the_floor(tiny_model, tmp_path):
    import optuna

    from servetune.study.record import StudyRecord

    tune(options(tiny_model, tmp_path, budget=1, min_model_len=2000), executor=InProcess([]))
    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    meta = StudyRecord(optuna.load_study(study_name="servetune", storage=storage)).meta
    assert meta.model_len["context"] == 4096 and meta.model_len["floor"] == 2000
    assert meta.model_len["need"] == 64  # 32 prompt tokens + 8, plus 16 of headroom, rounded up to 16
    assert meta.space["max_model_len"] == 2000 and meta.space["context"] == 4096
    assert "max_model_len" not in meta.space["fixed"]

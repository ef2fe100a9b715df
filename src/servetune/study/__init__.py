"""The study: what a trial returns (`outcome`), the record kept in Optuna's user attributes (`record`), the study
read once into `Results` for every output (`results`), and the Optuna storage with its lock (`storage`)."""

from servetune.study.outcome import Failure, LevelOutcome, TrialOutcome
from servetune.study.record import HeadToHead, StudyMeta, StudyRecord
from servetune.study.results import Results, Summary, TrialRow, write_outputs
from servetune.study.storage import STUDY_NAME, StudyError, StudyLock, default_storage

__all__ = [
    "STUDY_NAME", "Failure", "HeadToHead", "LevelOutcome", "Results", "StudyError", "StudyLock", "StudyMeta",
    "StudyRecord", "Summary", "TrialOutcome", "TrialRow", "default_storage", "write_outputs",
]

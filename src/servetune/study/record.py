"""The study record: what servetune keeps in an Optuna study beside Optuna's own facts (state, params, value), typed
and versioned; this module is its one reader and writer, through Optuna's public API only.

- A trial's record (`TrialRecord`, the trial's user attributes): its role and why it was proposed, the knob values
  it planned, the config it asked for, why it was skipped or interrupted, its outcome and its constraints.
- The study's record (`StudyRecord`, the study's user attributes): what defines it (`StudyMeta`), the tune's
  progress (`Progress`), the head-to-head (`HeadToHead`), the memory model's calibration, and the trials that were
  interrupted and queued again.

Versions (`RECORD_VERSION`, kept in the study): 1, written before the record was versioned, kept a trial's
`interrupted` among its own attributes (which only Optuna's private API can set on a running trial); 2 keeps it in
the study's record. Both read the same; a study written by a newer servetune is refused.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Self, cast

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
)

from servetune.engine.memory import Calibration
from servetune.errors import StudyError
from servetune.measure.slo import Objective, Slos, parse_slo
from servetune.measure.verdict import SloTest
from servetune.study.outcome import TrialOutcome
from servetune.workload import RateUnit

RECORD_VERSION = 2  # 2: a trial's `interrupted` in the study's record (`StudyRecord.requeue`); the version kept

_VERSION, _META, _PROGRESS, _CONFIRMATION, _CALIBRATION, _INTERRUPTED = (
    "record_version", "meta", "progress", "confirmation", "calibration", "interrupted")


class _Stored(BaseModel):
    """A record as Optuna keeps it (JSON): read back, it dumps (`stored`) the keys it was stored with, in their
    order, unknown ones included (a record of an older servetune keeps what this one does not know)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> Self:
        """The record as stored, validated; `stored` gives back its keys in their stored order."""
        model = cls.model_validate(stored)
        model._keys = tuple(stored)
        return model

    def __eq__(self, other: object) -> bool:  # the stored key order is not part of the value
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and self.__pydantic_extra__ == other.__pydantic_extra__)

    @model_serializer(mode="wrap")
    def _as_stored(self, handler) -> dict[str, Any]:
        """The fields set (in the order read, else declared) and unknown ones: a record dumps as it is stored."""
        data = handler(self)
        given = [*self.model_fields_set, *(self.model_extra or {})]
        keys = [k for k in self._keys if k in given] + [k for k in type(self).model_fields if k in given
                                                       and k not in self._keys]
        return {k: data[k] for k in keys + [k for k in given if k not in keys] if k in data}

    def stored(self) -> dict[str, Any]:
        """The record as Optuna keeps it (JSON): an outcome's enums as text, inf as a float."""
        return self.model_dump(mode="python")


class Role(StrEnum):
    """Why a trial is in the study; a --reference-config's trial has a `Reference` instead."""

    DEFAULT = "default"  # vLLM's defaults: the baseline
    SEED = "seed"  # a step of the seed procedure's ladders
    ANCHOR = "anchor"  # the warm start of the chunk ladder (under a latency SLO)
    LADDER = "ladder"  # a rung of the chunk ladder
    SEARCH = "search"  # proposed by the strategy's sampler


@dataclass(frozen=True)
class Reference:
    """The role of the `index`-th --reference-config's trial, stored as `reference-<index>`."""

    index: int

    def __str__(self) -> str:
        return f"reference-{self.index}"


def _role(value: Any) -> Any:
    """A role as stored (text) read back: a `Role`, or a `Reference` for `reference-N`."""
    if isinstance(value, str) and (m := re.fullmatch(r"reference-(\d+)", value)):
        return Reference(int(m.group(1)))
    return value


TrialRole = Annotated[Role | Reference, BeforeValidator(_role), PlainSerializer(str, return_type=str)]


class TrialRecord(_Stored):
    """A trial's record. A field left out was never written (a trial TPE proposed has no role, planned or why)."""

    role: TrialRole = Role.SEARCH  # stored as text: default, reference-N, seed, anchor, ladder, search
    planned: dict[str, Any] | None = None  # the knob values a queued trial planned (`strategies.suggest`)
    why: str | None = None  # why it was proposed
    ladder: str | None = None  # the seed procedure's ladder it is a step of
    reference: dict[str, Any] | None = None  # a --reference-config, measured as given
    config_requested: dict[str, Any] | None = None  # the config it asked to launch
    model_len_reason: str | None = None  # why its max-model-len is below the model's context
    skipped: str | None = None  # why it was not launched
    outcome: TrialOutcome | None = None  # what it measured (`TrialOutcome.read`: migrated, validated)
    constraints: list[float] | None = None  # Optuna constraints (<= 0 feasible): each SLO's p99 over its bound
    interrupted: str | None = None  # version 1 only; see `StudyRecord.interrupted`

    @field_validator("outcome", mode="before")
    @classmethod
    def _read_outcome(cls, value: Any) -> Any:
        return TrialOutcome.read(cast(dict, value)) if isinstance(value, Mapping) else value


def read_trial(trial: FrozenTrial | optuna.Trial) -> TrialRecord:
    """A trial's record, validated; StudyError, naming the trial, for one this servetune cannot read."""
    try:
        return TrialRecord.model_validate(trial.user_attrs)
    except ValueError as e:  # pydantic's ValidationError, or an outcome of a newer schema
        raise StudyError(f"trial {trial.number}'s record cannot be read: {_first_error(e)}") from None


def _first_error(e: ValueError) -> str:
    if isinstance(e, ValidationError):
        error = e.errors()[0]
        return f"{'.'.join(map(str, error['loc']))}: {error['msg'].removeprefix('Value error, ')}"
    return str(e).splitlines()[0]


def write_trial(trial: optuna.Trial, **values: Any) -> None:
    """Write fields of a running trial's record (`TrialRecord`'s names; each value checked)."""
    unknown = set(values) - set(TrialRecord.model_fields)
    if unknown:
        raise TypeError(f"not fields of a trial's record: {', '.join(sorted(unknown))}")
    for name, value in TrialRecord.model_validate(values).stored().items():
        trial.set_user_attr(name, value)


def constraints_of(trial: FrozenTrial) -> list[float]:
    """A trial's Optuna constraints (what a constrained sampler reads); none written: feasible."""
    return read_trial(trial).constraints or [0.0]


@dataclass(frozen=True)
class RecordedTrial:
    """A trial: Optuna's facts and servetune's record."""

    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    record: TrialRecord

    @property
    def outcome(self) -> TrialOutcome | None:
        return self.record.outcome

    @property
    def measured(self) -> bool:
        """Whether it launched a server (completed or failed); not a skipped or interrupted one."""
        return self.state in (TrialState.COMPLETE, TrialState.PRUNED) and self.outcome is not None

    @property
    def objective_value(self) -> float | None:
        """The value told to the study (None unless COMPLETE)."""
        return self.value if self.state == TrialState.COMPLETE else None


if TYPE_CHECKING:
    class MeasuredTrial(RecordedTrial):
        """A trial `StudyRecord.measured` returns: it has an outcome (to the type checker; a RecordedTrial at run
        time)."""

        @property
        def outcome(self) -> TrialOutcome: ...
else:
    MeasuredTrial = RecordedTrial


class StudyMeta(_Stored):
    """What defines a study (a resumed one must match it: `study.DEFINING`) and what it ran with. Studies made by
    an older servetune lack some fields (None)."""

    model: str
    workload: dict[str, Any]  # the WorkloadSpec as JSON
    slo: dict[str, int | float]  # as given (an int stays one)
    objective: Objective
    strategy: str
    budget: int | None = None
    space: dict[str, Any]  # `SearchSpace.to_dict`
    model_len: dict[str, Any] | None = None  # `workload.fit.ModelLenBounds`
    user_engine_args: dict[str, Any] | None = None
    servetune_version: str | None = None
    vllm_version: str
    device: str
    out: str
    levels: dict[str, Any] | None = None  # `trial.LevelOptions`; None: made before statistical verdicts
    seed: int | None = None
    references: list[dict[str, Any]] | None = None
    optional_knobs: list[str] | None = None
    tokenizer: str | None = None
    confirm: bool | None = None
    min_model_len: int | None = None
    device_name: str | None = None  # as vLLM names the device, e.g. "NVIDIA H200"
    model_shape: dict[str, Any] | None = None  # `engine.memory.ModelShape` (None: the model's config was not read)
    work: dict[str, float] | None = None  # `engine.roofline.Work`: the workload's mean reply, prefill, context
    gpu_hour_price: float | None = None
    offered: dict[str, str] | None = None  # knobs searched for this workload and GPU, and why (`search.offer`)

    @property
    def rate_unit(self) -> RateUnit:
        """What the study's rates count (`WorkloadSpec.rate_unit`)."""
        return RateUnit.of(self.workload.get("trace"))

    @property
    def slos(self) -> Slos:
        """The SLOs, parsed."""
        return parse_slo(self.slo)

    @property
    def confidence(self) -> float | None:
        """Of each level's verdict; None for a study made before verdicts were statistical."""
        return (self.levels or {}).get("confidence")

    @property
    def knobs(self) -> dict[str, list]:
        """The searched knobs and their values."""
        return self.space["knobs"]

    @property
    def context(self) -> int:
        """The model's context (0: unknown)."""
        return (self.model_len or {}).get("context") or self.space.get("context") or 0

    @property
    def max_chars_per_token(self) -> int:
        return (self.model_len or {}).get("max_chars_per_token") or 0


class TuneState(StrEnum):
    """Where a tune stands."""

    RUNNING = "running"
    INTERRUPTED = "interrupted"  # stopped by a signal or a write that failed: --resume goes on
    TIME_LIMIT = "time-limit"  # ended by --time-limit with something left undone
    COMPLETE = "complete"


class Progress(_Stored):
    """Where the tune stands and what it left undone."""

    state: TuneState = TuneState.COMPLETE
    not_done: list[str] = []
    time_limit_s: float | None = None
    elapsed_s: float | None = None
    next_trial_s: float | None = None  # the least another trial needed, where the time limit left trials unlaunched
    more_s: float | None = None  # what the time limit left undone needed: cut levels, trials not launched


class LevelRecord(_Stored):
    """A level that decided the head-to-head: its rate, verdict and tests, each SLO's point p99. The pick's carries
    its trial; a pick without its deciding level (not found) only its trial and rate."""

    trial: int | None = None
    rate: float
    verdict: str | None = None
    reasons: list[str] | None = None
    requests: int | None = None
    tests: list[SloTest] | None = None
    p99: dict[str, float] | None = None


class HeadToHeadVerdict(StrEnum):
    """What the head-to-head decided (`confirm.decide`)."""

    CONFIRMED = "confirmed"  # the defaults fail at the pick's rate: the pick is recommended
    NOT_CONFIRMED = "not confirmed"  # the defaults hold the pick's rate too: they are kept
    UNDECIDED = "undecided"  # the defaults' level at that rate reached no verdict
    NOT_RUN = "not run"  # the defaults were not measured at the pick's rate
    DEFAULTS = "defaults"  # no searched config beat the defaults


class HeadToHeadMethod(StrEnum):
    """How the defaults' deciding level was measured (`confirm.decide`)."""

    SEARCH = "search"  # their own search failed at or below the pick's rate
    HEAD_TO_HEAD = "head-to-head"  # they were launched again at the pick's rate


class HeadToHead(_Stored):
    """The head-to-head (`confirm.decide`): the pick's deciding level, the defaults' level that decides it (method
    `search`: their own search's failure at or below the pick's rate; `head-to-head`: the defaults launched again at
    the pick's rate), the verdict (confirmed, not confirmed, undecided, not run, defaults), why, and the
    recommendation. `search_trials`:
    how many trials were measured when it was decided (a resume that measured nothing new keeps it). A study made
    before the head-to-head keeps its pooled confirmation as stored (method None, its own fields kept)."""

    method: HeadToHeadMethod | None = None
    pick: LevelRecord | None = None
    head_to_head: LevelRecord | None = None
    verdict: HeadToHeadVerdict
    recommended_trial: int
    recommended_goodput_rate: float | None
    default_goodput_rate: float | None
    reason: str
    search_trials: int | None = None
    wall_s: float | None = None  # the head-to-head's launch and level (None: none ran)

    @property
    def confirmed(self) -> bool:
        return self.verdict == HeadToHeadVerdict.CONFIRMED


class StudyRecord:
    """The record of an Optuna study that servetune tunes; StudyError for one a newer servetune wrote."""

    def __init__(self, study: optuna.Study):
        self.study = study
        version = study.user_attrs.get(_VERSION, 1)
        if not isinstance(version, int) or version > RECORD_VERSION:
            raise StudyError(f"the study was written by a newer servetune (its record version is {version}, this "
                             f"servetune reads up to {RECORD_VERSION}): use that servetune")

    # -- the study's own record --------------------------------------------------------------------------------

    def start(self, meta: StudyMeta) -> None:
        """A new study: its meta and the record's version."""
        self.study.set_user_attr(_VERSION, RECORD_VERSION)
        self.study.set_user_attr(_META, meta.stored())

    def continued(self) -> None:
        """A resumed study: written from now on in this version's layout (which reads the older one too)."""
        self.study.set_user_attr(_VERSION, RECORD_VERSION)

    @property
    def has_meta(self) -> bool:
        return _META in self.study.user_attrs

    @property
    def stored_meta(self) -> dict[str, Any]:
        """The meta as stored (trials.json; a resume compares it with the options given now); {} for none."""
        return dict(self.study.user_attrs.get(_META) or {})

    @property
    def meta(self) -> StudyMeta:
        try:
            return StudyMeta.read(self.study.user_attrs[_META])
        except KeyError:
            raise StudyError("the study was not written by servetune tune (no meta)") from None
        except ValidationError as e:
            raise StudyError(f"the study's meta cannot be read: {_first_error(e)}") from None

    @property
    def progress(self) -> Progress:
        return Progress.read(self.study.user_attrs.get(_PROGRESS) or {})

    def write_progress(self, progress: Progress) -> None:
        self.study.set_user_attr(_PROGRESS, progress.stored())

    @property
    def confirmation(self) -> HeadToHead | None:
        stored = self.study.user_attrs.get(_CONFIRMATION)
        try:
            return None if stored is None else HeadToHead.read(stored)
        except ValidationError as e:
            raise StudyError(f"the study's head-to-head cannot be read: {_first_error(e)}") from None

    def write_confirmation(self, record: HeadToHead) -> None:
        self.study.set_user_attr(_CONFIRMATION, record.stored())

    def write_calibration(self, calibration: Calibration) -> None:
        self.study.set_user_attr(_CALIBRATION, calibration.model_dump())

    @property
    def interrupted(self) -> dict[int, str]:
        """Why each interrupted trial did not finish, by number (version 1: each trial's own attribute too)."""
        found = {t.number: why for t in self.study.get_trials(deepcopy=False)
                 if isinstance(why := t.user_attrs.get(_INTERRUPTED), str)}
        return found | {int(n): why for n, why in (self.study.user_attrs.get(_INTERRUPTED) or {}).items()}

    # -- trials ------------------------------------------------------------------------------------------------

    def trials(self, states: Iterable[TrialState] | None = None) -> list[RecordedTrial]:
        """The study's trials (those in `states`), in order, each with its record."""
        interrupted = self.study.user_attrs.get(_INTERRUPTED) or {}
        found = self.study.get_trials(deepcopy=False, states=tuple(states) if states is not None else None)
        return [self._recorded(t, interrupted.get(str(t.number))) for t in found]

    @staticmethod
    def _recorded(t: FrozenTrial, interrupted: str | None = None) -> RecordedTrial:
        record = read_trial(t)
        if interrupted is not None:
            record = record.model_copy(update={"interrupted": interrupted})
        return RecordedTrial(t.number, t.state, dict(t.params), t.value, record)

    def trial(self, number: int) -> RecordedTrial:
        return self.trials()[number]

    def measured(self) -> list[MeasuredTrial]:
        """Trials that launched a server (completed or failed), in order; not skipped or interrupted ones."""
        return cast("list[MeasuredTrial]",
                    [t for t in self.trials((TrialState.COMPLETE, TrialState.PRUNED)) if t.outcome is not None])

    def launches(self) -> list[TrialOutcome]:
        """The outcome of every trial that launched a server, interrupted ones included."""
        return [t.outcome for t in self.trials() if t.outcome is not None]

    def enqueue(self, params: dict[str, Any], record: TrialRecord) -> None:
        """Queue a config (`params`: its knob values) with its record; the next `ask` takes it."""
        self.study.enqueue_trial(params, user_attrs=record.stored(), skip_if_exists=False)

    def requeue(self, trial: RecordedTrial, why: str) -> None:
        """Mark a trial that never finished FAIL (interrupted: `why`) and queue its params again, with the same
        role, ladder, reference, why and planned knobs."""
        interrupted = dict(self.study.user_attrs.get(_INTERRUPTED) or {})
        self.study.set_user_attr(_INTERRUPTED, interrupted | {str(trial.number): why})
        self.study.tell(trial.number, state=TrialState.FAIL)
        kept = trial.record.model_dump(include={"role", "ladder", "reference", "why"})
        planned = trial.record.planned if trial.record.planned is not None else trial.params
        self.enqueue(trial.params, TrialRecord.model_validate(kept | {"planned": planned}))

    def exported(self) -> list[dict[str, Any]]:
        """Every trial as trials.json has it: number, state, params, value and its whole record as stored (a
        version 2 `interrupted` among its own, in the order Optuna's SQL storage returns them: by name)."""
        interrupted = {str(n): why for n, why in self.interrupted.items()}
        trials = []
        for t in self.study.get_trials(deepcopy=False):
            attrs = dict(t.user_attrs) | ({_INTERRUPTED: interrupted[str(t.number)]}
                                          if str(t.number) in interrupted else {})
            trials.append({"trial": t.number, "state": t.state.name, "params": t.params, "value": t.value,
                           **dict(sorted(attrs.items()))})
        return trials

"""What a workload file says: request lengths, shared prefixes or a dataset, and the load shape."""

import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from servetune.errors import ServetuneError


class RateUnit(StrEnum):
    """What a level's rate counts: requests per second, or for a trace its speed-up factor (1: as recorded)."""

    REQUESTS_PER_S = "req/s"
    TRACE_SPEED = "x trace speed"

    @classmethod
    def of(cls, trace: object) -> "RateUnit":
        """The unit of a workload with this trace (None: none)."""
        return cls.TRACE_SPEED if trace else cls.REQUESTS_PER_S


class WorkloadError(ServetuneError):
    """A workload file, dataset or tokenizer that cannot be used; the message is one line."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fixed(_Model):
    """Every request has `value` tokens."""

    type: Literal["fixed"] = "fixed"
    value: PositiveInt

    @property
    def low(self) -> int:
        """The shortest length it produces."""
        return self.value

    @property
    def high(self) -> float:
        """The longest length it produces (inf: no bound)."""
        return self.value

    @property
    def mean_len(self) -> float:
        """The mean length it produces (tokens)."""
        return float(self.value)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` lengths in tokens (int64)."""
        return np.full(size, self.value, dtype=np.int64)


class _Bounded(_Model):
    """Samples are rounded and clipped to [min, max] tokens."""

    min: PositiveInt = 1
    max: PositiveInt | None = None

    if TYPE_CHECKING:  # Normal's and LogNormal's field (Uniform has its own mean_len)
        @property
        def mean(self) -> float: ...

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    @property
    def low(self) -> int:
        return self.min

    @property
    def high(self) -> float:
        return math.inf if self.max is None else self.max

    @property
    def mean_len(self) -> float:
        """About the mean length it produces (tokens): the distribution's `mean` clipped to [min, max]."""
        return float(np.clip(self.mean, self.min, self.max or math.inf))

    def _clip(self, draws: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(draws), self.min, self.max).astype(np.int64)


class Uniform(_Bounded):
    """Integers uniform on [min, max]."""

    type: Literal["uniform"] = "uniform"
    max: PositiveInt

    @property
    def mean_len(self) -> float:
        return (self.min + self.max) / 2

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.min, self.max, size, endpoint=True)


class Normal(_Bounded):
    """Normal with `mean` and `std` in tokens."""

    type: Literal["normal"] = "normal"
    mean: PositiveFloat
    std: float = Field(ge=0)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._clip(rng.normal(self.mean, self.std, size))


class LogNormal(_Bounded):
    """Log-normal whose lengths have `mean` and `std` in tokens (a long right tail, like chat traffic)."""

    type: Literal["lognormal"] = "lognormal"
    mean: PositiveFloat
    std: float = Field(ge=0)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        sigma2 = math.log1p((self.std / self.mean) ** 2)
        return self._clip(rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size))


LengthDistribution = Annotated[Fixed | Uniform | Normal | LogNormal, Field(discriminator="type")]


class SharedPrefix(_Model):
    """Each request starts with one of `groups` distinct prefixes of `length` tokens."""

    length: PositiveInt
    groups: PositiveInt = 1


class DatasetSpec(_Model):
    """Prompts and output lengths from a file; ShareGPT entries outside the length limits are skipped."""

    path: Path
    format: Literal["sharegpt", "jsonl"]
    min_len: PositiveInt = 4
    max_prompt_len: PositiveInt = 1024
    max_total_len: PositiveInt = 2048


class TraceSpec(_Model):
    """Replay a trace's arrival times and token counts (layouts in `workload.trace`); the workload's
    `request_rate` is then the speed-up factor (1 = as recorded). `block_tokens`: tokens per Mooncake hash id,
    and of a `prefix_group`'s shared prefix."""

    path: Path
    block_tokens: PositiveInt = 512


class SessionSpec(_Model):
    """Multi-turn conversations: each turn's prompt is the whole conversation so far plus a new user message.

    `turns` per conversation (synthetic lengths; with a ShareGPT dataset, at most this many of its turns);
    `think_time_s` between a reply and the user's next message; `history`: whose replies the later turns
    resend, the model's own (`model`) or the dataset's (`dataset`, ShareGPT only).
    """

    turns: LengthDistribution
    think_time_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    history: Literal["model", "dataset"] = "model"


class WorkloadSpec(_Model):
    """A workload: what to send (synthetic lengths or a dataset) and the load shape to send it at."""

    num_requests: PositiveInt
    seed: NonNegativeInt = 0  # numpy's generators take no negative seed
    input_len: LengthDistribution | None = None
    output_len: LengthDistribution | None = None
    prefix: SharedPrefix | None = None
    dataset: DatasetSpec | None = None
    request_rate: PositiveFloat = math.inf
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_concurrency: PositiveInt | None = None
    endpoint: Literal["completions", "chat"] = "completions"
    sessions: SessionSpec | None = None
    trace: TraceSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _trace_as_recorded(cls, data: Any) -> Any:
        """A trace's `request_rate` (its speed-up factor) is 1 unless given."""
        if isinstance(data, dict) and data.get("trace") is not None and data.get("request_rate") is None:
            return data | {"request_rate": 1.0}
        return data

    @model_validator(mode="after")
    def _trace_alone(self) -> Self:
        if self.trace is None:
            return self
        given = [name for name in ("input_len", "output_len", "prefix", "dataset", "sessions")
                 if getattr(self, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} cannot be combined with trace (lengths and arrivals come from it)")
        if self.max_concurrency is not None:
            raise ValueError("max_concurrency cannot be combined with trace (arrivals come from it)")
        return self

    @model_validator(mode="after")
    def _sessions_on_chat(self) -> Self:
        if self.sessions is None:
            return self
        if self.endpoint != "chat":
            raise ValueError("sessions need endpoint: chat (each turn resends the conversation as chat messages)")
        if self.prefix is not None:
            raise ValueError("prefix cannot be combined with sessions (the conversation is the shared prefix)")
        if self.sessions.history == "dataset" and (self.dataset is None or self.dataset.format != "sharegpt"):
            raise ValueError("sessions.history: dataset needs a sharegpt dataset (its replies are resent)")
        if self.dataset is not None and self.dataset.format != "sharegpt":
            raise ValueError("sessions from a dataset need format sharegpt (conversations with turns)")
        return self

    @model_validator(mode="after")
    def _lengths_from_one_source(self) -> Self:
        synthetic = {"input_len": self.input_len, "output_len": self.output_len, "prefix": self.prefix}
        if self.trace is not None:
            return self
        if self.dataset is not None:
            given = [name for name, value in synthetic.items() if value is not None]
            if given:
                raise ValueError(f"{', '.join(given)} cannot be combined with dataset (lengths come from it)")
            return self
        if self.input_len is None or self.output_len is None:
            raise ValueError("input_len and output_len are required unless a dataset is given")
        if self.prefix is not None and self.input_len.low <= self.prefix.length:
            low, prefix = self.input_len.low, self.prefix.length
            raise ValueError(f"input_len must always exceed prefix.length ({prefix}); its lower bound is {low}")
        return self

    @property
    def rate_unit(self) -> RateUnit:
        """What a level's rate counts."""
        return RateUnit.of(self.trace)

    @classmethod
    def random(cls, input_len: int, output_len: int, num_requests: int, seed: int = 0, **load: Any) -> Self:
        """Fixed-length random prompts, like `vllm bench serve --dataset-name random`; `load` sets the load shape."""
        return cls(
            num_requests=num_requests,
            seed=seed,
            input_len=Fixed(value=input_len),
            output_len=Fixed(value=output_len),
            **load,
        )

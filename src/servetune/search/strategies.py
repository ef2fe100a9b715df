"""Search strategies: each proposes the next config of a study. `seed` follows the manual tuning procedure,
`grid` walks the space, `optuna` lets a sampler (TPE, constrained when the objective is throughput under SLOs)
choose. A strategy registers itself (`register`: its name, a line of help, what a trial its sampler proposed
records as its reason); the CLI's choices come from the registry. The search never launches anything: the tuner
measures and tells the study."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import optuna
from optuna.trial import TrialState

from servetune.engine.logfacts import FailureKind
from servetune.knobs import KNOBS, first_rung
from servetune.measure.slo import NO_SLO, Slos
from servetune.search.space import SearchSpace
from servetune.study.record import RecordedTrial, Role, StudyRecord, TrialRecord, constraints_of, read_trial


class Strategy(Protocol):
    """Makes the study's sampler and, for strategies that plan themselves, queues the next config."""

    def sampler(self) -> optuna.samplers.BaseSampler: ...

    def plan_next(self, study: optuna.Study) -> bool:
        """Queue the next config if this strategy picks configs itself; False when it has nothing left."""
        ...


@dataclass(frozen=True)
class Registered:
    """A strategy users pick by name (`--strategy NAME`)."""

    name: str
    help: str  # a line for `--strategy`'s help
    why: str  # why a trial its sampler proposed (not one it queued itself) was proposed, as the study records it
    make: Callable[..., Strategy]  # (space, budget, seed, constrained, slo) -> the strategy


REGISTRY: dict[str, Registered] = {}


def register(name: str, help: str, why: str) -> Callable[[type], type]:
    """Add the decorated strategy class to the registry under `name`."""
    def add(cls: type) -> type:
        REGISTRY[name] = Registered(name, help, why, cls)
        return cls
    return add


def strategy_help() -> str:
    """`--strategy`'s help: every registered strategy and what it does."""
    return "; ".join(f"{s.name} ({s.help})" for s in REGISTRY.values())


def value_of(t: RecordedTrial) -> float:
    return t.value if t.state == TrialState.COMPLETE and t.value is not None else float("-inf")




@register("optuna", help="TPE, warm-started by the procedure's first rung, or by the chunk ladder under an ITL or "
                          "TPOT SLO", why="TPE's proposal")
class OptunaStrategy:
    """TPE (multivariate, constant liar) over the categorical knobs, warm-started by the procedure; with SLO
    constraints when the objective is plain throughput, via `constraints_func` reading the trial's
    `constraints` attribute.

    The warm start follows what binds. Under an ITL or TPOT SLO, prefill stalls decide the SLO, so the chunk
    ladder comes first (`ChunkLadder`: chunked prefill, chunk sizes walked from the anchor's up while each
    rung beats the one below, then down); otherwise one anchor config (the procedure's first rung,
    `knobs.first_rung`).
    TPE proposes the rest."""

    def __init__(self, space: SearchSpace, budget: int, seed: int, constrained: bool,
                 slo: Slos = NO_SLO):
        self.space, self.budget, self.seed, self.constrained = space, budget, seed, constrained
        latency_bound = any(s.latency.prefill_bound for s in slo)  # prefill stalls break it: chunking decides
        self.ladder = ChunkLadder.for_space(space, self.anchor()) if latency_bound else None

    def anchor(self) -> dict[str, Any]:
        """The first rung's value for each knob, or the nearest value the knob offers."""
        params, rung = {}, first_rung()
        for knob in self.space.knobs:
            want = rung.get(knob.name, knob.choices[0])
            if want in knob.choices or not isinstance(want, (int, float)) or isinstance(want, bool):
                params[knob.name] = want if want in knob.choices else knob.choices[0]
            else:
                params[knob.name] = min(knob.choices, key=lambda v: abs(v - want))
        return params

    def sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=self.seed, multivariate=True, constant_liar=True,
            n_startup_trials=max(2, self.budget // 3),
            constraints_func=constraints_of if self.constrained else None,
        )

    def plan_next(self, study: optuna.Study) -> bool:
        record = StudyRecord(study)
        trials = record.trials()
        if self.ladder is not None:
            step = self.ladder.next(trials)
            if step is not None:
                params, why = step
                record.enqueue(params, TrialRecord(role=Role.LADDER, planned=params, why=why))
            return True
        if not any(t.record.role == Role.ANCHOR for t in trials):
            anchor = self.anchor()
            record.enqueue(anchor, TrialRecord(role=Role.ANCHOR, planned=anchor,
                                               why="the procedure's first rung (chunked prefill 512)"))
        return True


TIE = 0.05  # rates this close are a tie (the rate search's resolution)


class ChunkLadder:
    """The chunked-prefill ladder as a warm start: the anchor config with chunked prefill on and each chunk
    size (`max_num_batched_tokens` below max-model-len). It starts at the anchor's chunk and climbs while
    each rung beats the one below it; if the start holds no rate, or the first climb does not beat it, it walks
    down from the start instead, while each rung is not clearly worse than the one above (`_walk`). A rung that
    fails, or is skipped before launching (ruled out, infeasible), ends a climb; going down, the next smaller chunk
    is tried. Pure: reads the study's trials, proposes (params, why)."""

    def __init__(self, base: dict[str, Any], chunks: list[int], start: int, seqs: tuple[int, ...] = ()):
        self.base, self.chunks, self.start, self.seqs = base, chunks, start, seqs

    @classmethod
    def for_space(cls, space: SearchSpace, anchor: dict[str, Any]) -> "ChunkLadder | None":
        mnbt, chunked = space.knob("max_num_batched_tokens"), space.knob("enable_chunked_prefill")
        if mnbt is None or (chunked is not None and True not in chunked.choices):
            return None
        chunks = sorted(v for v in mnbt.choices if v < space.max_model_len) or sorted(mnbt.choices)[:1]
        want = anchor.get("max_num_batched_tokens", chunks[0])
        start = min(range(len(chunks)), key=lambda i: abs(chunks[i] - want))
        base = dict(anchor) | ({"enable_chunked_prefill": True} if chunked is not None else {})
        seqs = space.knob("max_num_seqs")
        return cls(base, chunks, start, seqs.choices if seqs is not None else ())

    def next(self, trials: list[RecordedTrial]) -> tuple[dict[str, Any], str] | None:
        rungs = {cast("dict[str, Any]", t.record.planned).get("max_num_batched_tokens"): t  # queued with its plan
                 for t in trials if t.record.role == Role.LADDER}
        if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in rungs.values()):
            return None  # a rung is queued or running: its result decides the next
        done = {chunk: value_of(t) for chunk, t in rungs.items()}
        walk = self._walk(done)
        if walk is None:
            return None
        index, direction = walk
        chunk = self.chunks[index]
        params = self.base | {"max_num_batched_tokens": chunk}
        if "max_num_seqs" in params and params["max_num_seqs"] > chunk:  # vLLM needs seqs <= batched tokens
            params["max_num_seqs"] = max([s for s in self.seqs if s <= chunk], default=params["max_num_seqs"])
        return params, (
            f"chunk ladder (an ITL/TPOT SLO binds: prefill stalls decide it): chunk {chunk}, {direction}")

    def _walk(self, done: dict[int | None, float]) -> tuple[int, str] | None:
        """The next rung's index and direction, or None when the ladder is over. A start that held no rate does
        not climb (a larger chunk stalls longer); going down goes on while a rung is not clearly worse than the one
        above (within TIE), and always below a rung that held no rate, failed or was ruled out: a smaller chunk's
        shorter stalls may show only further down."""
        c, i = self.chunks, self.start
        if c[i] not in done:
            return i, "the start"
        while done[c[self.start]] > 0 and i + 1 < len(c) and c[i + 1] in done and done[c[i + 1]] > done[c[i]]:
            i += 1
        if done[c[self.start]] > 0 and i + 1 < len(c) and c[i + 1] not in done:
            return i + 1, "going up"
        if i > self.start:
            return None  # it climbed: the best rung lies above the start
        j = self.start

        def better(lower: float, upper: float) -> bool:  # not clearly worse: a tie within noise goes on down
            return lower >= upper * (1 - TIE) if upper > 0 else True  # below a rung that held nothing: on down

        while j > 0 and c[j - 1] in done and better(done[c[j - 1]], done[c[j]]):
            j -= 1
        return (j - 1, "going down") if j > 0 and c[j - 1] not in done else None


@register("grid", help="every combination of the knobs' values, in a seeded random order", why="the grid's next point")
class GridStrategy(OptunaStrategy):
    """Every combination of the knobs' values, in a seeded random order."""

    def sampler(self) -> optuna.samplers.BaseSampler:
        grid = {k.name: list(k.choices) for k in self.space.knobs}
        return optuna.samplers.GridSampler(grid, seed=self.seed)

    def plan_next(self, study: optuna.Study) -> bool:
        return True


@register("seed", help="the manual procedure: a ladder per knob on top of the best config so far",
          why="the procedure's next step")
class SeedStrategy:
    """The manual procedure, one ladder per knob on top of the best config so far:
    max_model_len is the model's context, or the workload's longest request where the space tightens it;
    then max-num-batched-tokens with chunked prefill at 128, 256, 512 ...; then without chunked prefill at
    1x, 2x, 3x ... the tightened max-model-len; then prefix caching off/on, max-num-seqs, the KV cache size; and
    enforce-eager only once a config ran out of memory. A ladder stops at the first launch failure or
    preemption, or when a step is no better than the one before."""

    def __init__(self, space: SearchSpace, budget: int, seed: int, constrained: bool, slo: Slos = NO_SLO):
        self.space = space
        self.steps = self._ladders()

    def sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=0)  # unused: every config is queued

    def _ladders(self) -> list[tuple[str, list[dict[str, Any]]]]:
        mml = self.space.max_model_len
        mnbt = self.space.knob("max_num_batched_tokens")
        ladders: list[tuple[str, list[dict[str, Any]]]] = []
        if mnbt is not None:
            chunked = [v for v in mnbt.choices if v < mml]
            whole = [v for v in mnbt.choices if v >= mml and v % mml == 0]
            ladders.append(("chunked", [{"enable_chunked_prefill": True, "max_num_batched_tokens": v}
                                        for v in chunked]))
            ladders.append(("whole", [{"enable_chunked_prefill": False, "max_num_batched_tokens": v} for v in whole]))
        for name in (k.arg for k in KNOBS if k.ladder):
            knob = self.space.knob(name)
            if knob is not None:
                ladders.append((name, [{name: v} for v in knob.choices]))
        return ladders

    def _history(self, study: optuna.Study) -> list[RecordedTrial]:
        return [t for t in StudyRecord(study).trials() if t.record.role in (Role.DEFAULT, Role.SEED)]

    def _next(self, study: optuna.Study) -> dict[str, Any] | None:
        history = self._history(study)
        tried = {tuple(sorted(t.params.items())) for t in history}
        done = [t for t in history if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        best = max(done, key=value_of, default=None)
        base = dict(best.params) if best is not None else {}
        oom = any(t.outcome.failure.kind == FailureKind.OOM for t in done if t.outcome and t.outcome.failure)
        ladders = self.steps + ([("enforce_eager", [{"enforce_eager": True}])] if oom else [])
        for ladder, steps in ladders:
            ran = [t for t in done if t.record.ladder == ladder]
            if self._ladder_stopped(ran):
                continue
            for step in steps:
                params = {**base, **step}
                key = tuple(sorted(params.items()))
                if key not in tried and self.space.violation(self.space.config(params)) is None:
                    return {"params": params, "ladder": ladder}
        return None

    @staticmethod
    def _ladder_stopped(ran: list[RecordedTrial]) -> bool:
        if not ran:
            return False
        last = ran[-1]
        if last.state != TrialState.COMPLETE:
            return True
        assert last.outcome is not None  # a completed trial measured
        if (last.outcome.preemptions or 0) > 0:
            return True
        return len(ran) >= 2 and value_of(last) <= value_of(ran[-2])

    def plan_next(self, study: optuna.Study) -> bool:
        step = self._next(study)
        if step is None:
            return False
        planned = TrialRecord(role=Role.SEED, ladder=step["ladder"], planned=step["params"],
                              why=f"the procedure: {step['ladder']} ladder")
        StudyRecord(study).enqueue(step["params"], planned)
        return True


def make_strategy(name: str, space: SearchSpace, budget: int, seed: int, constrained: bool,
                  slo: Slos = NO_SLO) -> Strategy:
    """The strategy called `name`; `slo`: the SLOs of the study (what binds shapes the warm start)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name].make(space, budget, seed, constrained, slo)


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    """The config of a searched trial: the knobs a queued trial planned, otherwise every knob sampled."""
    planned = read_trial(trial).planned
    names = list(planned) if planned is not None else [k.name for k in space.knobs]
    params = {n: trial.suggest_categorical(n, list(knob.choices)) for n in names if (knob := space.knob(n))}
    return space.config(params)

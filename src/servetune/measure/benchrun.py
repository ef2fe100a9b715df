"""`servetune bench`'s run: build the prompts, then measure a running server, or launch vLLM, measure it and stop it.
The results (`BenchRun`; its JSON has `vllm bench serve`'s field names) and the raw records are written beside each
other, never over an earlier run's; a stop (Ctrl-C, SIGTERM) first writes the requests that finished; what could not
be written where asked (a full disk) goes to the temporary directory, and the run says so (`BenchRun.misplaced`).
What the run has to say as it goes goes to its `BenchHooks` (the CLI draws bars and prints lines)."""

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servetune import __version__
from servetune.engine import Engine, EngineFailed, launched, serve_command
from servetune.errors import ServetuneError
from servetune.jsonio import check_writable, write_json, write_or_beside
from servetune.loadgen import LoadResult, LoadShape, RequestRecord, Target
from servetune.measure.bench import LevelResult, check_context, check_server, launch_model_len, measure_level
from servetune.measure.metrics import LevelMetrics, summarize
from servetune.measure.slo import good_request
from servetune.workload import RequestSpec, WorkloadSpec, build_requests, load_tokenizer


@dataclass(frozen=True)
class BenchOptions:
    """What `servetune bench` runs, every option checked (`options.BenchArgs.resolve`)."""

    json_out: Path  # the results; the records and the server log go beside it
    model: str  # the served model name; when launching, the model's path
    workload: WorkloadSpec  # the workload file or random lengths, with the load options on top
    base_url: str | None = None  # a running server; None: launch vLLM with `engine_args`
    engine_args: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None  # None: the model's
    warmup: int = 0  # requests sent before the measured ones
    goodput_slo: dict[str, float] = field(default_factory=dict)  # per-request bounds in ms (slo.GOODPUT_KEYS)
    request_timeout_s: float | None = None  # None: derived from the level's requests

    @property
    def records_path(self) -> Path:
        return self.json_out.with_suffix(".records.jsonl")

    @property
    def log_path(self) -> Path:
        """The launched server's log."""
        return self.json_out.with_suffix(".server.log")

    def files(self) -> list[Path]:
        """What the run writes: the results, the records and, when it launches vLLM, the server's log."""
        return [self.json_out, self.records_path, *([self.log_path] if self.base_url is None else [])]


class BenchHooks:
    """What a bench run tells as it goes; the CLI draws and prints it."""

    def note(self, text: str) -> None:
        """A line worth saying: what a stop kept."""

    def warn(self, text: str) -> None:
        """Something went other than asked: a file written elsewhere."""

    @contextmanager
    def starting(self, command: str) -> Iterator[None]:
        """vLLM starts with `command` for as long as this lasts."""
        yield

    @contextmanager
    def sending(self, total: int) -> Iterator[Callable[[RequestRecord], None]]:
        """The level sends `total` requests (warm-up included) for as long as this lasts; each finished record
        goes to the callable this yields."""
        yield lambda record: None


class EngineFacts(BaseModel):
    """The server a bench launched: its config; its start-up facts, version, device, command and whether it was
    still alive at the end; or why it did not start."""

    config: dict[str, Any]
    startup: dict[str, Any] | None = None
    vllm_version: str | None = None
    device: str | None = None
    command: str | None = None
    alive_at_end: bool | None = None
    failure: dict[str, Any] | None = None


class BenchRun(BaseModel):
    """A bench run: the level's metrics and the server's counters over it (None before any request finished, or
    when vLLM did not start), the launched engine's facts, and whether a stop cut it short."""

    servetune_version: str
    date: str
    model: str
    workload: dict[str, Any]
    engine: EngineFacts | None = None
    metrics: LevelMetrics | None = None
    server: dict[str, float | None] | None = None
    interrupted: bool = False
    records: str | None = None  # where the level's records are (beside the JSON, or where a full disk sent them)
    misplaced: list[str] = Field(default=[], exclude=True)  # what could not be written where asked, and where it is

    def to_json(self) -> dict[str, Any]:
        """As the JSON has it: the metrics at the top level with `vllm bench serve`'s names, the server's counters
        as `server_metrics` (not in a stopped run's), `interrupted: true` in a stopped run's, where the records are
        (`records`)."""
        out = self.model_dump(include={"servetune_version", "date", "model", "workload", "records"},
                              exclude_none=True)
        if self.engine is not None:
            out["engine"] = self.engine.model_dump(exclude_unset=True)
        if self.metrics is not None:
            out |= self.metrics.model_dump() | ({"interrupted": True} if self.interrupted
                                                 else {"server_metrics": self.server})
        return out


def run_bench(opts: BenchOptions, hooks: BenchHooks = BenchHooks()) -> BenchRun:
    """Build the prompts, then bench the server at `base_url`, or launch one, bench it and stop it. The results
    are written to `json_out` (a server that does not start: its failure, then EngineFailed) and returned."""
    for path in opts.files():
        try:
            check_writable(path)
        except OSError as e:
            raise ServetuneError(f"--json: cannot write {path}: {e.strerror or e}") from None
        if path.exists() or path.is_symlink():
            raise ServetuneError(f"--json: {path} exists (an earlier run's): move it away, or give another --json")
    tok = load_tokenizer(opts.tokenizer or opts.model)
    requests = build_requests(opts.workload, tok, count=opts.workload.num_requests + opts.warmup)
    run = BenchRun(servetune_version=__version__, date=datetime.now(UTC).isoformat(), model=opts.model,
                   workload=opts.workload.model_dump())
    if opts.base_url is None:
        run = _launched(opts, requests, run, hooks)
    else:
        run = _measured_at(opts.base_url, opts, requests, run, hooks)
    return _save_json(opts.json_out, run)


def _launched(opts: BenchOptions, requests: list[RequestSpec], run: BenchRun, hooks: BenchHooks) -> BenchRun:
    """Launch vLLM, bench it and stop it; a server that does not start is written down (EngineFailed)."""
    check_context(requests, launch_model_len(opts.model, opts.engine_args), f"the model {opts.model}")
    engine = Engine(opts.model, opts.engine_args, opts.log_path)
    command = serve_command(opts.model, engine.engine_args)
    with ExitStack() as running:
        try:
            facts = running.enter_context(launched(engine, hooks.starting(command)))
        except EngineFailed as e:
            failed = run.model_copy(update={"engine": EngineFacts(config=engine.engine_args,
                                                                  failure=e.failure.to_dict())})
            if problem := _save_json(opts.json_out, failed).misplaced:
                hooks.warn(problem[0])
            raise
        run = run.model_copy(update={"engine": EngineFacts(
            config=engine.engine_args, startup=facts.to_dict(), vllm_version=engine.vllm.version,
            device=engine.vllm.device_type, command=command)})
        run = _measured_at(engine.base_url, opts, requests, run, hooks)
        assert run.engine is not None  # set above
        return run.model_copy(update={"engine": run.engine.model_copy(update={"alive_at_end": engine.alive()})})


def _measured_at(url: str, opts: BenchOptions, requests: list[RequestSpec], run: BenchRun,
                 hooks: BenchHooks) -> BenchRun:
    """Check the server at `url`, send the requests and save the records: the run with its metrics."""
    target = Target(url, opts.model, opts.workload.endpoint)
    check_context(requests, check_server(target), f"the server at {url}")
    level = _measure(target, requests, opts, run, hooks)
    records, problem = _save_records(level.load, opts.records_path)
    return run.model_copy(update={"metrics": level.metrics, "server": level.server,
                                  "records": records and str(records),
                                  "misplaced": run.misplaced + ([problem] if problem else [])})


def _measure(target: Target, requests: list[RequestSpec], opts: BenchOptions, run: BenchRun,
             hooks: BenchHooks) -> LevelResult:
    """`measure_level`, each record told to the hooks. On Ctrl-C (or SIGTERM) the requests finished so far are
    written (records and JSON, `interrupted: true`) before the interrupt goes on."""
    spec, slo = opts.workload, opts.goodput_slo or None
    finished: list[RequestRecord] = []
    with hooks.sending(len(requests)) as count:
        def on_record(record: RequestRecord) -> None:
            finished.append(record)
            count(record)

        try:
            shape = LoadShape(request_rate=spec.request_rate, burstiness=spec.burstiness,
                              max_concurrency=spec.max_concurrency, warmup_requests=opts.warmup, seed=spec.seed,
                              request_timeout_s=opts.request_timeout_s)
            return measure_level(target, requests, shape, goodput_slo=slo, on_record=on_record)
        except KeyboardInterrupt:
            _save_finished(finished, opts, run, hooks)
            raise


def _save_finished(finished: list[RequestRecord], opts: BenchOptions, run: BenchRun, hooks: BenchHooks) -> None:
    """The records of a stopped level and its metrics over the requests that finished (`interrupted`)."""
    spec = opts.workload
    load = LoadResult.stopped(finished, spec.request_rate, spec.burstiness, spec.max_concurrency)
    if load is None:
        hooks.note("no request had finished before the interrupt: nothing written")
        return
    done = [r for r in load.records if r.ok and not r.warmup]
    records, records_problem = _save_records(load, opts.records_path)
    good = good_request(opts.goodput_slo) if opts.goodput_slo else None
    stopped = run.model_copy(update={"metrics": summarize(load, good), "interrupted": True,
                                     "records": records and str(records)})
    results, results_problem = write_or_beside(opts.json_out, lambda where: write_json(where, stopped.to_json()),
                                               "the results")
    for problem in filter(None, (records_problem, results_problem)):
        hooks.warn(problem)
    places = ", ".join(str(p) for p in (results, records) if p is not None) or "nothing could be written"
    hooks.note(f"the {len(done)} requests that finished before the interrupt: {places}")


def _save_json(path: Path, run: BenchRun) -> BenchRun:
    """`run` with its results written at `path`, else in the temporary directory (`write_or_beside`): where
    they are when not at `path` is added to its `misplaced`."""
    _, problem = write_or_beside(path, lambda where: write_json(where, run.to_json()), "the results")
    return run.model_copy(update={"misplaced": run.misplaced + [problem]}) if problem else run


def _save_records(load: LoadResult, path: Path) -> tuple[Path | None, str | None]:
    """The level's records at `path`, else in the temporary directory: (where they went, None if nowhere; what
    went wrong, if anything)."""
    return write_or_beside(path, load.save, "the records")

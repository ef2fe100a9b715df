"""The `servetune` command line: bench, tune, report, memory, model, demo, verify."""

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from servetune import __version__
from servetune.errors import ServetuneError
from servetune.jsonio import check_writable, jsonable, write_json_or_beside
from servetune.knobs import optional_help
from servetune.search.strategies import strategy_help

if TYPE_CHECKING:  # the commands import what they use when they run: `servetune --help` stays quick
    from servetune.metrics import LevelMetrics
    from servetune.outcome import TrialOutcome
    from servetune.results import Summary
    from servetune.tune import TuneOptions
    from servetune.verify import VerifyPlan, VerifyResult
    from servetune.workload import WorkloadSpec

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest vLLM configuration for a model, workload and latency target.")
model_app = typer.Typer(no_args_is_help=True, help="Models servetune can write itself.")
app.add_typer(model_app, name="model")
console = Console(stderr=True)


class UsageError(ServetuneError):
    """A bad command-line option: reported as one line, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    from rich.markup import escape

    from servetune.redact import redact

    console.print(f"[bold red]error:[/] {escape(redact(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def one_line_errors():
    """Turn the errors a user can cause (`ServetuneError`: bad input, a missing server, model or study) into
    one line and exit code 2. Anything else is a bug and goes on with its traceback."""
    try:
        yield
    except ServetuneError as e:
        fail(str(e))


@contextmanager
def about(option: str):
    """Name `option` in the one line a bad value of it raises (a ServetuneError, or pydantic's
    ValidationError from checking it)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as e:
        raise UsageError(f"{option}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    except ServetuneError as e:
        raise UsageError(f"{option}: {e}") from None


def pairs(values: Sequence[str], option: str) -> dict:
    """`key=value` strings of a repeatable option as a dict; a bad one is reported naming `option`."""
    from servetune.engine.args import parse_pairs

    with about(option):
        return parse_pairs(values)


def check_timeout(request_timeout: float | None) -> float | None:
    if request_timeout is not None and not request_timeout > 0:
        raise UsageError(f"--request-timeout: {request_timeout:g} is not a positive number of seconds")
    return request_timeout


def progress_bar(auto_refresh: bool = True) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False, auto_refresh=auto_refresh)


def count_records(bar: Progress, task: TaskID, redraw_s: float = 0.25) -> Callable[[object], None]:
    """An `on_record` that advances `task` and redraws a bar made with auto_refresh=False at most every
    `redraw_s`, from the event loop's own thread. Rich's refresh thread would take the GIL ten times a
    second; when the kernel preempts it holding the GIL beside a busy server, the real-time event loop
    waits for it."""
    last = [0.0]

    def on_record(record: object) -> None:
        bar.advance(task)
        if (now := time.monotonic()) - last[0] >= redraw_s:
            last[0] = now
            bar.refresh()

    return on_record


SloOption = Annotated[list[str], typer.Option("--slo", help="An SLO, e.g. ttft_p99_ms=1000 (repeatable).")]
EngineArgOption = Annotated[list[str], typer.Option(
    "--engine-arg", help="A vLLM engine arg as key=value, e.g. max-num-seqs=64 (repeatable).")]
RequestTimeoutOption = Annotated[Optional[float], typer.Option(
    "--request-timeout", help="Seconds without a byte from the server after which a request fails (kind "
                              "timeout); default: 30 s plus the level's tokens at 1,000 tokens/s.")]


@model_app.command("tiny")
def model_tiny(out: Annotated[Path, typer.Option(help="Directory to write the model into.")]) -> None:
    """Write the embedded tiny Llama (random weights, fixed seed, own tokenizer): same bytes every time."""
    from servetune.tinymodel import write_tiny_model

    write_tiny_model(out)
    console.print(f"wrote the tiny model to {out}")


def _summary_table(title: str, metrics: "LevelMetrics", server: dict | None) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    m = metrics
    rows = [
        ("completed / failed", f"{m.completed} / {m.failed}"),
        ("duration (s)", f"{m.duration:.2f}"),
        ("request throughput (req/s)", f"{m.request_throughput:.2f}"),
        ("output throughput (tok/s)", f"{m.output_throughput:.1f}"),
        ("TTFT mean / p99 (ms)", f"{m.mean_ttft_ms:.1f} / {m.p99_ttft_ms:.1f}"),
        ("TPOT mean / p99 (ms)", f"{m.mean_tpot_ms:.2f} / {m.p99_tpot_ms:.2f}"),
        ("ITL mean / p99 (ms)", f"{m.mean_itl_ms:.2f} / {m.p99_itl_ms:.2f}"),
        ("E2EL mean / p99 (ms)", f"{m.mean_e2el_ms:.1f} / {m.p99_e2el_ms:.1f}"),
        ("schedule lag p99 (ms) / late", f"{m.p99_schedule_lag_ms:.1f} / {m.late_requests}"
                                         + (" [bold red]client lagging[/]" if m.client_lagging else "")),
    ]
    if m.request_goodput is not None:
        rows.append(("goodput (req/s)", f"{m.request_goodput:.2f}"))
    if m.steady_request_rate is not None:
        rows.append(("steady completion rate (req/s)", f"{m.steady_request_rate:.2f}"))
    if server is not None:
        rows.append(("preemptions", f"{server.get('num_preemptions', 0):.0f}"))
        if server.get("prefix_cache_hit_rate") is not None:
            rows.append(("prefix cache hit rate", f"{server['prefix_cache_hit_rate']:.1%}"))
    for turn, t in (m.per_turn or {}).items():
        rows.append((f"turn {turn}: input tokens / TTFT p99 (ms)",
                     f"{t.mean_input_tokens:.0f} / {t.p99_ttft_ms:.1f}"))
    if m.errors:
        rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in m.errors.items())))
    for name, value in rows:
        table.add_row(name, value)
    return table


def lagging_warning(metrics: "LevelMetrics") -> str:
    """One line saying that a level measured the client, not the server."""
    from servetune.metrics import LATE_MS, SCHEDULE_LAG_BOUND_MS

    return (f"[bold yellow]warning:[/] the client fell behind its schedule: p99 schedule lag "
            f"{metrics.p99_schedule_lag_ms:.0f} ms > {SCHEDULE_LAG_BOUND_MS:g} ms, {metrics.late_requests} "
            f"requests sent more than {LATE_MS:g} ms late; these numbers measure the client, not the server "
            f"(servetune's event loop takes real-time priority where allowed: run it as root or with "
            f"CAP_SYS_NICE, or give it a CPU of its own)")


@app.command()
def bench(
    json_out: Annotated[Path, typer.Option("--json", help="Write the results (vllm bench serve's field names) here.")],
    model: Annotated[str, typer.Option(help="Served model name; with --launch, the model path.")],
    base_url: Annotated[Optional[str], typer.Option(help="A running OpenAI-compatible server.")] = None,
    launch: Annotated[bool, typer.Option(help="Launch vLLM with --engine-arg, bench it, stop it.")] = False,
    engine_arg: EngineArgOption = [],
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer path; default: the model.")] = None,
    workload: Annotated[Optional[Path], typer.Option(help="A workload YAML file.")] = None,
    input_len: Annotated[int, typer.Option(min=1)] = 1024,
    output_len: Annotated[int, typer.Option(min=1)] = 128,
    num_prompts: Annotated[Optional[int], typer.Option(min=1)] = None,
    request_rate: Annotated[Optional[float], typer.Option(help="req/s, or inf")] = None,
    burstiness: Annotated[Optional[float], typer.Option(help="Gamma shape; 1 = Poisson.")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option(min=1)] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="completions or chat")] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up requests, not measured.")] = 0,
    goodput: Annotated[list[str], typer.Option(help="Per-request SLO for goodput, e.g. ttft_ms=500.")] = [],
    max_failed_fraction: Annotated[float, typer.Option(help="Exit 1 when more requests fail than this.")] = 0.05,
    request_timeout: RequestTimeoutOption = None,
) -> None:
    """Drive load against a vLLM server (running, or launched with --launch) and report its metrics."""
    from servetune.interrupt import exit_code, handle_signals

    handle_signals()
    try:
        with one_line_errors():
            opts = bench_options(
                json_out=json_out, model=model, base_url=base_url, launch=launch, engine_arg=engine_arg,
                tokenizer=tokenizer, workload=workload, input_len=input_len, output_len=output_len,
                num_prompts=num_prompts, request_rate=request_rate, burstiness=burstiness,
                max_concurrency=max_concurrency, endpoint=endpoint, seed=seed, warmup=warmup, goodput=goodput,
                request_timeout=request_timeout)
            result = _bench(opts)
    except KeyboardInterrupt as e:
        fail(f"interrupted ({e or 'SIGINT'}); no server is left running", code=exit_code(e))
    total = result["completed"] + result["failed"]
    if result["completed"] == 0 or (total and result["failed"] / total > max_failed_fraction):
        fail(f"{result['failed']} of {total} requests failed ({result['errors']}); the run is unusable "
             f"(records kept in {json_out.with_suffix('.records.jsonl')})", code=1)


@dataclass(frozen=True)
class BenchOptions:
    """What `servetune bench` runs, every option checked (`bench_options`)."""

    json_out: Path  # the results; the records and the server log go beside it
    model: str  # the served model name; when launching, the model's path
    workload: "WorkloadSpec"  # the workload file or random lengths, with the load options on top
    base_url: str | None = None  # a running server; None: launch vLLM with `engine_args`
    engine_args: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None  # None: the model's
    warmup: int = 0  # requests sent before the measured ones
    goodput_slo: dict[str, float] = field(default_factory=dict)  # per-request bounds in ms (GOODPUT_METRICS)
    request_timeout_s: float | None = None  # None: derived from the level's requests


def bench_options(*, json_out: Path, model: str, base_url: str | None, launch: bool, engine_arg: list[str],
                  tokenizer: str | None, workload: Path | None, input_len: int, output_len: int,
                  num_prompts: int | None, request_rate: float | None, burstiness: float | None,
                  max_concurrency: int | None, endpoint: str | None, seed: int | None, warmup: int,
                  goodput: list[str], request_timeout: float | None) -> BenchOptions:
    """`bench`'s options from the command line's values (`bench --help` says what each is), each checked
    and named in the one line a bad one gives (UsageError) before any server is asked or launched."""
    request_timeout_s = check_timeout(request_timeout)
    if launch == (base_url is not None):
        raise UsageError("give exactly one of --base-url URL (a running server) or --launch")
    if engine_arg and not launch:
        raise UsageError("--engine-arg needs --launch")
    model = local_model(model) if launch else model
    spec = _bench_spec(workload, input_len, output_len, {
        "num_requests": num_prompts, "request_rate": request_rate, "burstiness": burstiness,
        "max_concurrency": max_concurrency, "endpoint": endpoint, "seed": seed})
    return BenchOptions(json_out=json_out, model=model, workload=spec, base_url=base_url,
                        goodput_slo=_goodput_slo(goodput), engine_args=pairs(engine_arg, "--engine-arg"),
                        tokenizer=tokenizer, warmup=warmup, request_timeout_s=request_timeout_s)


_BENCH_OPTIONS = {"num_requests": "--num-prompts", "request_rate": "--request-rate", "burstiness": "--burstiness",
                  "max_concurrency": "--max-concurrency", "endpoint": "--endpoint", "seed": "--seed"}


def _bench_spec(workload: Path | None, input_len: int, output_len: int, overrides: dict) -> "WorkloadSpec":
    """The workload with the command line's load options on top; a bad one is reported naming its option."""
    from servetune.workload import WorkloadSpec, load_workload

    spec = load_workload(workload) if workload else WorkloadSpec.random(input_len, output_len,
                                                                         overrides["num_requests"] or 1000)
    for name, value in overrides.items():
        if value is not None:
            with about(_BENCH_OPTIONS[name]):
                spec = WorkloadSpec.model_validate(spec.model_dump() | {name: value})
    return spec


def _goodput_slo(goodput: list[str]) -> dict[str, float]:
    from servetune.metrics import GOODPUT_METRICS

    slo = pairs(goodput, "--goodput")
    for name, bound in slo.items():
        if name not in GOODPUT_METRICS:
            raise UsageError(f"--goodput: unknown metric {name!r}; use {', '.join(GOODPUT_METRICS)}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise UsageError(f"--goodput: {name}={bound} is not a positive number of ms")
    return {k: float(v) for k, v in slo.items()}


def _bench(opts: BenchOptions) -> dict:
    """Build the prompts, then bench the server at `base_url`, or launch one, bench it and stop it. The
    results (`jsonable` dict) are written to `json_out` and returned."""
    from servetune.workload import build_requests, load_tokenizer

    for path in (opts.json_out, opts.json_out.with_suffix(".records.jsonl")):
        try:
            check_writable(path)
        except OSError as e:
            raise UsageError(f"--json: cannot write {path}: {e.strerror or e}") from None
    tok = load_tokenizer(opts.tokenizer or opts.model)
    requests = build_requests(opts.workload, tok, count=opts.workload.num_requests + opts.warmup)
    output: dict = {"servetune_version": __version__, "date": datetime.now(timezone.utc).isoformat(),
                    "model": opts.model, "workload": opts.workload.model_dump()}
    if opts.base_url is None:
        _bench_launched(opts, requests, output)
    else:
        output |= _bench_at(opts.base_url, opts, requests, output)
    _save_json(opts.json_out, output)
    return output


def _save_json(path: Path, value: dict) -> None:
    """The results at `path`, or where `write_json_or_beside` had to put them, said in one line."""
    if (written := write_json_or_beside(path, value)) != path:
        console.print(f"[bold yellow]warning:[/] could not write {path}; the results are in {written}",
                      highlight=False)


def _save_records(load, path: Path) -> Path:
    """The level's records at `path`, else beside the temporary directory's copy of the results; where they went."""
    try:
        load.save(path)
        return path
    except OSError as e:
        fallback = Path(tempfile.gettempdir()) / f"servetune-{os.getpid()}-{path.name}"
        load.save(fallback)
        console.print(f"[bold yellow]warning:[/] could not write {path} ({e.strerror or e}); the records are in "
                      f"{fallback}", highlight=False)
        return fallback


def _bench_launched(opts: BenchOptions, requests: list, output: dict) -> None:
    """Launch vLLM, bench it and stop it, adding the engine's facts and the results to `output`; a server
    that does not start is written down and exits 1."""
    from servetune.bench import check_context, launch_model_len
    from servetune.engine import Engine, EngineFailed, serve_command

    check_context(requests, launch_model_len(opts.model, opts.engine_args), f"the model {opts.model}")
    engine = Engine(opts.model, opts.engine_args, opts.json_out.with_suffix(".server.log"))
    console.print(f"launching: {serve_command(opts.model, engine.engine_args)}")
    try:
        with progress_bar() as bar:
            bar.add_task("starting vLLM", total=None)
            facts = engine.start()
    except EngineFailed as e:
        output["engine"] = {"config": engine.engine_args, "failure": e.failure.to_dict()}
        _save_json(opts.json_out, output)
        fail(f"vLLM did not start ({e.failure.kind}): {e.failure.reason} (log: {e.failure.log_path})", code=1)
    try:
        output["engine"] = {"config": engine.engine_args, "startup": facts.to_dict(),
                            "vllm_version": engine.vllm.version, "device": engine.vllm.device_type,
                            "command": serve_command(opts.model, engine.engine_args)}
        output |= _bench_at(engine.base_url, opts, requests, output)
        output["engine"]["alive_at_end"] = engine.alive()
    finally:
        engine.stop()


def _bench_at(url: str, opts: BenchOptions, requests: list, output: dict) -> dict:
    """Check the server at `url`, send the requests, save the records and print the table; the metrics and
    the server's counters, as the JSON has them."""
    from servetune.bench import check_context, check_server
    from servetune.loadgen import Target

    target = Target(url, opts.model, opts.workload.endpoint)
    check_context(requests, check_server(target), f"the server at {url}")
    level = _measure(target, requests, opts, output)
    _save_records(level.load, opts.json_out.with_suffix(".records.jsonl"))
    console.print(_summary_table(f"servetune bench: {opts.model}", level.metrics, level.server))
    if level.metrics.client_lagging:
        console.print(lagging_warning(level.metrics), highlight=False, soft_wrap=True)
    return level.metrics.model_dump() | {"server_metrics": level.server}


def _measure(target, requests: list, opts: BenchOptions, output: dict):
    """`measure_level` with a bar. On Ctrl-C (or SIGTERM) the requests finished so far are written (records and
    JSON, `interrupted: true`) before the interrupt goes on."""
    from servetune.bench import measure_level
    from servetune.loadgen import LoadResult
    from servetune.metrics import summarize

    spec, slo = opts.workload, opts.goodput_slo or None
    finished = []
    with progress_bar(auto_refresh=False) as bar:
        count = count_records(bar, bar.add_task("requests", total=len(requests)))

        def on_record(record) -> None:
            finished.append(record)
            count(record)

        try:
            return measure_level(target, requests, request_rate=spec.request_rate, burstiness=spec.burstiness,
                                 max_concurrency=spec.max_concurrency, warmup_requests=opts.warmup, seed=spec.seed,
                                 goodput_slo=slo, request_timeout_s=opts.request_timeout_s, on_record=on_record)
        except KeyboardInterrupt:
            timed = [r for r in finished if not r.warmup]
            done = [r for r in timed if r.error_kind != "cancelled"]
            if not done:
                console.print("no request had finished before the interrupt: nothing written", highlight=False)
                raise
            load = LoadResult(sorted(finished, key=lambda r: r.index), spec.request_rate, spec.burstiness,
                              spec.max_concurrency, min(r.scheduled_ns for r in timed), max(r.end_ns for r in timed),
                              stopped_early=True)
            records = _save_records(load, opts.json_out.with_suffix(".records.jsonl"))
            _save_json(opts.json_out, output | summarize(load, slo).model_dump() | {"interrupted": True})
            console.print(f"the {len(done)} requests that finished before the interrupt: {opts.json_out}, "
                          f"{records}", highlight=False)
            raise


class TuneProgress:
    """Rich bars for the tuner: one over trials, one over the requests of the current load level. The bar is
    made with auto_refresh=False and redrawn from the load generator's thread (`count_records`), so no Rich
    thread competes with the real-time event loop during a level."""

    def __init__(self, bar: Progress, budget: int, levels: bool = True, rate_unit: str = "req/s"):
        self.bar, self.unit = bar, rate_unit  # a level's rate: req/s, or a trace's speed-up factor
        self.trials = bar.add_task("trials", total=budget)
        self.level = bar.add_task("level", total=1, visible=False)
        self.record = count_records(bar, self.level)
        self.levels = levels  # one trial at a time: its load levels are shown too
        self.running: list[int] = []

    def _running(self) -> None:
        names = ", ".join(map(str, self.running))
        self.bar.update(self.trials, description=f"trial{'s' if len(self.running) > 1 else ''} {names}")

    def trial_started(self, number: int, config: dict, why: str) -> None:
        from servetune.engine.args import to_argv

        self.bar.start()
        self.running.append(number)
        self._running()
        if self.levels:
            self.bar.update(self.level, description="starting vLLM", total=None, completed=0, visible=True)
        console.print(f"trial {number} ({why}): {' '.join(to_argv(config)) or '(vLLM defaults)'}", highlight=False)

    def trial_skipped(self, number: int, config: dict, reason: str) -> None:
        from servetune.engine.args import to_argv

        console.print(f"  skipped {' '.join(to_argv(config))}: {reason}", highlight=False)

    def trial_finished(self, number: int, out: "TrialOutcome") -> None:
        self.running.remove(number)
        self._running()
        self.bar.advance(self.trials)
        if not out.ok:
            console.print(f"  trial {number} failed ({out.failure.kind}): {out.failure.reason}", highlight=False)
        elif out.goodput_rate is not None:
            lo, hi = out.goodput_bracket
            console.print(f"  trial {number}: goodput rate {lo:.2f} {out.rate_unit} (fails at {hi:.2f}); capacity "
                          f"{out.request_throughput:.2f} req/s", highlight=False)
        else:
            console.print(f"  trial {number}: throughput {out.request_throughput:.2f} req/s", highlight=False)

    def confirm_started(self, number: int, config: dict, rates: list[float]) -> None:
        from servetune.engine.args import to_argv

        who = " ".join(to_argv(config)) or "(vLLM defaults)"
        self.bar.start()
        console.print(f"head-to-head: trial {number} {who} at the pick's {rates[0]:.2f} {self.unit}", highlight=False)
        if self.levels:
            self.bar.update(self.level, description="starting vLLM", total=None, completed=0, visible=True)

    def confirm_finished(self, number: int, out: "TrialOutcome") -> None:
        if not out.ok:
            console.print(f"  head-to-head: the defaults did not run ({out.failure})", highlight=False)
        for level in out.levels:
            console.print(f"  the defaults at {level.rate:.2f} {self.unit}: {level.verdict}"
                          + (f" ({'; '.join(level.reasons[:2])})" if level.reasons else ""), highlight=False)

    def confirm_lost(self, number: int, reason: str) -> None:
        console.print(f"  head-to-head: its worker was lost ({reason}); it runs again", highlight=False)

    def note(self, text: str) -> None:
        console.print(text, highlight=False)

    def trial_lost(self, number: int, reason: str) -> None:
        self.running.remove(number)
        self._running()
        console.print(f"  trial {number} lost ({reason}); its config runs again", highlight=False)

    def level_started(self, name: str, rate: float, n: int) -> None:
        self.bar.update(self.level, description=f"{name} @ {rate:.2f} {self.unit}", total=n, completed=0)
        self.bar.refresh()


def _result_table(summary: "Summary") -> Table:
    table = Table(title=f"servetune tune: {summary.objective} under {summary.slo or 'no SLO'}")
    goodput = f"goodput rate ({summary.rate_unit})"
    for col in ("", goodput, "throughput (req/s)", "p99 TTFT (ms)", "p99 TPOT (ms)", "config"):
        table.add_column(col)
    from servetune.engine.args import to_argv

    for name, m in (("default", summary.default), ("best", summary.best)):
        if m is None:
            continue
        rate = "-" if m.goodput_rate is None else f"{m.goodput_rate:.2f}"
        table.add_row(f"{name} (trial {m.trial})", rate, f"{m.request_throughput:.2f}",
                      f"{m.p99_ttft_ms:.1f}", f"{m.p99_tpot_ms:.2f}", " ".join(to_argv(m.config)) or "-")
    return table


def _tune(opts: "TuneOptions") -> "Summary":
    from servetune.executors import runs_inline
    from servetune.tune import tune as run_tune

    bar = progress_bar(auto_refresh=False)  # started by the first trial: an early error leaves no bar behind
    try:
        progress = TuneProgress(bar, opts.budget, levels=runs_inline(opts.parallel, opts.ray_address),
                                rate_unit=opts.workload.rate_unit)
        summary = run_tune(opts, progress)
    finally:
        if bar.live.is_started:
            bar.stop()
    console.print(_result_table(summary))
    console.print(f"{summary.answer}\nreport: {opts.out / 'report.html'}", highlight=False)
    if summary.best is not None:
        console.print(f"run it: {summary.best_command}\noutputs: {opts.out}/ (state: {summary.state})",
                      highlight=False)
    return summary


def _tune_guarded(opts: "TuneOptions") -> None:
    from servetune.executors import WorkerError, WorkerLost
    from servetune.interrupt import exit_code, handle_signals

    handle_signals()
    try:
        with one_line_errors():
            _tune(opts)
    except WorkerError as e:
        fail(str(e), code=1)
    except WorkerLost as e:  # the tuner queues a lost trial again: one that escapes it is said in a line all the same
        fail(f"a trial's worker was lost ({e}): continue with the same command and --resume", code=1)
    except KeyboardInterrupt as e:
        fail(f"interrupted ({e or 'SIGINT'}); no server is left running; the outputs in {opts.out} say what was "
             "measured (state: interrupted). Continue with the same command and --resume", code=exit_code(e))


@app.command()
def tune(
    model: Annotated[str, typer.Option(help="Model path (or name) to serve.")],
    workload: Annotated[Path, typer.Option(help="Workload YAML file.")],
    out: Annotated[Path, typer.Option(help="Output directory.")],
    slo: SloOption = [],
    objective: Annotated[str, typer.Option(help="goodput (highest rate within SLOs) or throughput (at rate inf).")] = "goodput",
    strategy: Annotated[str, typer.Option(help=strategy_help())] = "optuna",
    budget: Annotated[int, typer.Option(min=1, help="Servers to launch, vLLM's defaults included.")] = 6,
    study: Annotated[Optional[str], typer.Option(
        help="Optuna storage URL, e.g. postgresql+psycopg://user@host/db; default sqlite in OUT.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the study in OUT (or --study).")] = False,
    engine_arg: EngineArgOption = [],
    reference_config: Annotated[list[Path], typer.Option(
        help="A vLLM config YAML to measure as it is, beside the search (repeatable).")] = [],
    knob: Annotated[list[str], typer.Option(help=f"An optional knob to search too (repeatable): {optional_help()}.")] = [],
    tokenizer: Annotated[Optional[str], typer.Option()] = None,
    level_requests: Annotated[int, typer.Option(
        min=1, help="Most requests a load level sends: a level stops as soon as its verdict is decided.")] = 600,
    min_level_requests: Annotated[int, typer.Option(min=1, help="Fewest requests a level's verdict rests on.")] = 40,
    max_levels: Annotated[int, typer.Option(min=0, help="Most load levels per trial in the rate search.")] = 6,
    confidence: Annotated[float, typer.Option(
        min=0.5, max=0.999, help="Confidence of each level's pass and fail verdicts.")] = 0.95,
    time_limit: Annotated[Optional[str], typer.Option(
        help="Wall-clock budget of the whole tune, launches and head-to-head included, e.g. 25m, 1h30m: "
             "servetune launches only what still fits and stops there with its best answer.")] = None,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1)] = 0,
    parallel: Annotated[Optional[int], typer.Option(
        min=1, help="Trials at once: on this host, each on its own GPUs (CPU: its own cores); "
                    "with --ray-address, at most this many (default: one per GPU of the cluster).")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        help="Run trials as Ray tasks on this cluster (e.g. 10.0.0.1:6379); every node needs servetune, vLLM "
             "and the model at the same path.")] = None,
    confirm: Annotated[bool, typer.Option(
        help="After the search, launch vLLM's defaults again at the pick's goodput rate (the head-to-head) "
             "before recommending it over them (--no-confirm: recommend the search's result as it is).")] = True,
    request_timeout: RequestTimeoutOption = None,
    min_model_len: Annotated[Optional[int], typer.Option(
        min=1, help="Configs launch with the model's own context; where servetune tightens max-model-len (no "
                    "chunked prefill, a KV cache too small for the context), never below this many tokens.")] = None,
) -> None:
    """Search vLLM configs for the most goodput under SLOs (or throughput), measured on the real engine."""
    from servetune.trial import LevelOptions

    with one_line_errors():
        opts = tune_options(
            model=model, workload=workload, out=out, slo=slo, objective=objective, strategy=strategy,
            engine_arg=engine_arg, reference_config=reference_config, knob=knob, time_limit=time_limit,
            levels=LevelOptions(requests=level_requests, min_requests=min_level_requests, max_levels=max_levels,
                                confidence=confidence, request_timeout_s=request_timeout),
            confirm=confirm, budget=budget, storage=study, resume=resume, tokenizer=tokenizer, seed=seed,
            parallel=parallel, ray_address=ray_address, min_model_len=min_model_len)
    _tune_guarded(opts)


def tune_options(*, model: str, workload: Path, out: Path, slo: Sequence[str], objective: str, strategy: str,
                 engine_arg: Sequence[str] = (), reference_config: Sequence[Path] = (), knob: Sequence[str] = (),
                 time_limit: str | None = None, **as_given: Any) -> "TuneOptions":
    """`TuneOptions` from the command line's values, each checked and named in the one line a bad one gives
    (UsageError): the model directory, workload file, `key=value` SLOs and engine args, reference config
    files, strategy, objective, the time limit and the levels' request timeout. The rest (levels, confirm,
    budget, storage, resume, tokenizer, seed, parallel, ray_address, min_model_len) go to TuneOptions as given;
    what it leaves out takes    TuneOptions' default."""
    from servetune.search.strategies import REGISTRY
    from servetune.slo import parse_slo
    from servetune.timelimit import parse_duration
    from servetune.tune import TuneOptions
    from servetune.workload import load_workload

    if strategy not in REGISTRY:
        raise UsageError(f"--strategy: unknown strategy {strategy!r}; choose from {', '.join(REGISTRY)}")
    if objective not in ("goodput", "throughput"):
        raise UsageError(f"--objective: unknown objective {objective!r}; use goodput or throughput")
    slo_pairs = pairs(slo, "--slo")
    with about("--slo"):
        slos = parse_slo(slo_pairs)
    time_limit_s = None
    if time_limit is not None:
        try:
            time_limit_s = parse_duration(time_limit)
        except ValueError as e:
            raise UsageError(f"--time-limit: {e}") from None
    opts = TuneOptions(
        model=local_model(model), workload=load_workload(workload), out=out, slo=slos, objective=objective,
        strategy=strategy, engine_args=pairs(engine_arg, "--engine-arg"), optional_knobs=tuple(knob),
        references=[read_config_yaml(path) for path in reference_config], time_limit_s=time_limit_s, **as_given)
    check_timeout(opts.levels.request_timeout_s)
    return opts


def local_model(model: str) -> str:
    """A model directory on this machine as an absolute path (servers start in /); a hub name as given. A
    name that can only be a path (/..., ./..., ../..., ~/...) must be a directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if model.startswith(("/", "./", "../", "~")):
        raise UsageError(f"--model: {model}: no such model directory")
    return model


def read_config_yaml(path: Path) -> dict:
    """Engine args from a `vllm serve --config` YAML file (its `model` key is ignored)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(f"{path}: cannot read the config: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a vLLM config file is a mapping of flag names to values")
    return {k.replace("-", "_"): v for k, v in data.items() if k != "model"}


DEMO_WORKLOAD = Path(__file__).parent / "demo_workload.yaml"
DEMO_SLO = ["itl_p99_ms=40"]


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/demo"),
    budget: Annotated[int, typer.Option(min=1)] = 3,
    time_limit: Annotated[str, typer.Option(help="Wall-clock budget of the tune (see `tune --time-limit`).")] = "9m",
    resume: Annotated[bool, typer.Option()] = False,
) -> None:
    """Build the tiny model and tune it on this machine: a small budget within a time limit, each level
    decided at 95% confidence, then the head-to-head of the pick against vLLM's defaults."""
    from servetune.tinymodel import write_tiny_model
    from servetune.trial import LevelOptions

    model = write_tiny_model(out / "tiny-llama")
    console.print(f"wrote the tiny model to {model}")
    with one_line_errors():
        opts = tune_options(model=str(model.resolve()), workload=DEMO_WORKLOAD, out=out, slo=DEMO_SLO,
                            objective="goodput", strategy="optuna", budget=budget, resume=resume, seed=0,
                            time_limit=time_limit, levels=LevelOptions(requests=400, max_levels=4))
    _tune_guarded(opts)


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="Directory to write report.html, charts and exports into.")],
    study: Annotated[Optional[str], typer.Option(help="Optuna storage URL; default: the sqlite study in OUT.")] = None,
) -> None:
    """Write the HTML report (Pareto front, load curves, parameter effects, every trial) of a study."""
    from servetune.report import write_report
    from servetune.study import default_storage

    with one_line_errors():
        try:
            check_writable(out / "report.html")
        except OSError as e:
            raise UsageError(f"--out: cannot write into {out}: {e.strerror or e}") from None
        path = write_report(study or default_storage(out), out)
    console.print(f"report: {path}", highlight=False)


@app.command()
def memory(
    model: Annotated[str, typer.Option(help="Model directory or its config.json.")],
    device_memory_gib: Annotated[float, typer.Option(help="Device memory (GiB); on CPU, the machine's RAM.")],
    gpu_memory_utilization: Annotated[Optional[float], typer.Option()] = None,
    max_model_len: Annotated[Optional[int], typer.Option()] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option()] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option()] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager")] = False,
    cpu_kvcache_space_gib: Annotated[Optional[float], typer.Option(help="CPU: the KV cache size (GiB).")] = None,
    device_name: Annotated[str, typer.Option(help="GPU name, e.g. H200 (vLLM's defaults depend on it).")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Predict, without launching, whether a config fits and how many KV-cache tokens it gets."""
    from servetune.memory import memory_report

    kind = "cpu" if cpu_kvcache_space_gib is not None else "gpu"
    with one_line_errors():
        try:
            report = memory_report(model, device_memory_gib, device_kind=kind, device_name=device_name,
                                   gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                   enforce_eager=enforce_eager or None, cpu_kvcache_space_gib=cpu_kvcache_space_gib)
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise UsageError(f"{model}: cannot read the model config: {e}") from None
    if as_json:
        print(json.dumps(jsonable(report), indent=2))
        return
    verdict = "fits" if report["fits"] else f"does not fit: {report['reason']}"
    console.print(f"{report['kv_cache_tokens']:,} KV-cache tokens, max concurrency "
                  f"{report['max_concurrency']:.2f}x; {verdict}", highlight=False)


@app.command()
def verify(
    out: Annotated[Optional[Path], typer.Option(
        help="A tune's output directory: its model, best config, SLOs, workload and recommended rate, unless "
             "given below.")] = None,
    config: Annotated[Optional[Path], typer.Option(
        help="A `vllm serve --config` YAML, e.g. a tune's best.yaml.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model path (or name) to serve.")] = None,
    workload: Annotated[Optional[Path], typer.Option(help="Workload YAML file: the prompts' lengths, burstiness, "
                                                          "max_concurrency, endpoint.")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Request rate (req/s).")] = None,
    slo: SloOption = [],
    num_prompts: Annotated[int, typer.Option(
        min=1, help="Requests each client sends; servetune's statistical test of a TTFT, TPOT or E2EL p99 "
                    "needs 299 after the level fills up to pass at 95%.")] = 400,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write both clients' numbers here; beside it the prompts, records, logs (default with "
                       "--out: OUT/verify.json).")] = None,
) -> None:
    """Measure a config at a rate with servetune's client and with vLLM's `vllm bench serve` on the same prompts,
    and print both side by side with the SLO verdicts."""
    from servetune.engine import EngineFailed
    from servetune.interrupt import exit_code, handle_signals
    from servetune.verify import verify as run_verify

    handle_signals()
    try:
        with one_line_errors():
            plan, json_out = verify_plan(out=out, config=config, model=model, workload=workload, rate=rate, slo=slo,
                                         num_prompts=num_prompts, json_out=json_out)
            result = run_verify(plan, json_out, on_stage=lambda stage: console.print(f"{stage} ...", highlight=False))
    except EngineFailed as e:
        fail(f"vLLM did not start ({e.failure.kind}): {e.failure.reason} (log: {e.failure.log_path})", code=1)
    except KeyboardInterrupt as e:
        fail(f"interrupted ({e or 'SIGINT'}); no server is left running", code=exit_code(e))
    console.print(_verify_table(result))
    console.print(f"results: {json_out}", highlight=False)
    if result.vllm is None:
        fail(result.vllm_failure, code=1)


def verify_plan(*, out: Path | None, config: Path | None, model: str | None, workload: Path | None,
                rate: float | None, slo: Sequence[str], num_prompts: int,
                json_out: Path | None) -> tuple["VerifyPlan", Path]:
    """`verify`'s plan and JSON path from the command line, with what is not given taken from the tune in `out`;
    each value checked and named in the one line a bad or missing one gives (UsageError)."""
    from servetune.slo import parse_slo
    from servetune.verify import VerifyPlan, read_tune
    from servetune.workload import WorkloadSpec, load_workload

    with about("--out"):
        tuned = read_tune(out) if out is not None else None
    needed = {"--config": config, "--model": model, "--workload": workload, "--rate": rate, "--json": json_out}
    if tuned is None and (missing := [name for name, value in needed.items() if value is None]):
        raise UsageError(f"{', '.join(missing)}: needed without --out TUNE_DIR")
    if rate is None and tuned.rate is None:
        raise UsageError(f"--rate: needed: the tune in {out} recommends no rate")
    with about("--slo"):
        slos = parse_slo(pairs(slo, "--slo")) if slo else tuned.slo if tuned else {}
    with about("--config"):
        engine_args = read_config_yaml(config) if config is not None else tuned.config
    model = local_model(model) if model is not None else tuned.model
    spec = load_workload(workload) if workload is not None else tuned.workload
    rate = rate if rate is not None else tuned.rate
    with about("--rate"):
        spec = WorkloadSpec.model_validate(spec.model_dump() | {"request_rate": rate, "num_requests": num_prompts})
    with about("--workload" if workload is not None else "--out"):
        plan = VerifyPlan(model=model, config=engine_args, workload=spec, slo=slos)
    json_out = json_out or out / "verify.json"
    try:
        check_writable(json_out)
    except OSError as e:
        raise UsageError(f"--json: cannot write {json_out}: {e.strerror or e}") from None
    return plan, json_out


def _verify_rows() -> list[tuple[str, str]]:
    from servetune.slo import LATENCIES

    return [("completed / failed", "{0.completed} / {0.failed}"),
            ("prompt / output tokens", "{0.total_input_tokens:,} / {0.total_output_tokens:,}"),
            ("request throughput (req/s)", "{0.request_throughput:.2f}"),
            ("output throughput (tok/s)", "{0.output_throughput:.1f}"),
            *((f"{t.label} mean / p99 (ms)", f"{{0.{t.mean_field}:.2f}} / {{0.{t.p99_field}:.2f}}") for t in LATENCIES)]


def _verify_table(result: "VerifyResult") -> Table:
    """Both clients side by side (metric | servetune | vllm bench serve | SLO | verdict), then a row per SLO."""
    from servetune.slo import latency

    table = Table(title=f"servetune verify: {result.workload.num_requests} requests at "
                        f"{result.workload.request_rate:g} req/s, each client",
                  caption="verdict: each client's point p99 of its N completed requests (ITL: of their gaps) "
                          "against the SLO; for servetune's client also the tuner's statistical test of the "
                          "fraction over the bound (pass, fail or undecided; a TTFT, TPOT or E2EL p99 cannot pass on "
                          "fewer than 299 requests after the level fills up)")
    for column in ("metric", "servetune", "vllm bench serve", "SLO", "verdict"):
        table.add_column(column, justify="right" if column in ("servetune", "vllm bench serve") else "left")
    ours, theirs = result.servetune, result.vllm
    for label, fmt in _verify_rows():
        table.add_row(label, fmt.format(ours.metrics), fmt.format(theirs.metrics) if theirs else "-")
    their_checks = {check.name: check for check in theirs.slo} if theirs else {}
    for check in ours.slo:
        other = their_checks.get(check.name)
        test = (f" (test: {check.test.decision}, {check.test.over} of {check.test.counted} "
                f"{latency(check.name).counts} over)" if check.test else "")
        verdict = (f"servetune {_verdict(check.passed)}, N={check.requests}{test}"
                   + (f"; vllm {_verdict(other.passed)}, N={other.requests}" if other else ""))
        table.add_row(f"{check.name}", f"{check.p99_ms:.2f}", f"{other.p99_ms:.2f}" if other else "-",
                      f"<= {check.bound_ms:g}", verdict)
    return table


def _verdict(passed: bool) -> str:
    return "[green]pass[/]" if passed else "[bold red]fail[/]"


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

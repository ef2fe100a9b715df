"""The `servetune` command line: bench, tune, report, memory, model, demo, verify. It parses (each command's options
are a model in `servetune.options`), runs what the command runs, and prints (`servetune.console`)."""

import contextlib
import inspect
import json
import os
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import typer
import typer.core
from pydantic import BaseModel
from rich.markup import escape

from servetune.console import (
    BenchProgress,
    TuneProgress,
    console,
    progress_bar,
    say,
    show_answer,
    show_bench,
    verify_table,
    warn,
)
from servetune.device import DeviceKind
from servetune.errors import ServetuneError
from servetune.options import (
    BenchArgs,
    DemoArgs,
    MemoryArgs,
    ModelTinyArgs,
    ReportArgs,
    TuneArgs,
    UsageError,
    VerifyArgs,
)

if TYPE_CHECKING:  # the commands import what they run when they run
    from pathlib import Path

    from servetune.engine import EngineFailed
    from servetune.study.results import Summary
    from servetune.tuner.loop import TuneOptions

HELP_PANEL = "Help"  # --help's panel, last, in a command whose options are grouped into panels


def _help_option(option: "typer.core.TyperOption | None", panels: bool) -> "typer.core.TyperOption | None":
    """--help as the help shows it: with no type (Typer shows a flag's as `<bool>`), and in a panel of its own
    where the other options are grouped into panels."""
    if option is not None:
        option.metavar = ""
        if panels:
            option.rich_help_panel = HELP_PANEL
    return option


class Command(typer.core.TyperCommand):
    """A command whose flags (--resume, --help, ...) show no type in its help, and whose --help comes last."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "is_flag", False):
                param.metavar = ""

    def get_help_option(self, ctx: Any) -> "typer.core.TyperOption | None":  # Any: click's Context
        panels = any(getattr(param, "rich_help_panel", None) for param in self.params)
        return _help_option(super().get_help_option(ctx), panels)


class Group(typer.core.TyperGroup):
    """A command group whose --help shows no type."""

    def get_help_option(self, ctx: Any) -> "typer.core.TyperOption | None":
        return _help_option(super().get_help_option(ctx), panels=False)


app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest vLLM configuration for a model, workload and latency target.\n\n"
                       "Start with `servetune tune --help`, or try `servetune demo` (a tiny model tuned here).")
model_app = typer.Typer(cls=Group, no_args_is_help=True, help="Models servetune can write itself.")
app.add_typer(model_app, name="model")


Args = TypeVar("Args", bound=BaseModel)


def help_text(doc: str) -> str:
    """A command's docstring as its help shows it: each paragraph in one line, for the terminal to wrap at its width
    (Typer keeps a docstring's line breaks, and a command's summary in `servetune --help` is its first paragraph);
    an example's indented lines kept as they are."""
    lines: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        if lines and line and lines[-1] and not line.startswith(" ") and not lines[-1].startswith(" "):
            lines[-1] += " " + line
        else:
            lines.append(line)
    return "\n".join(lines)


def command(on: typer.Typer, args: type[Args], name: str | None = None) -> Callable[[Callable[[Args], None]], None]:
    """Register the decorated function as a command of `on` whose options are the fields of `args` (an options
    model: each field's type, default, flag, help and panel) and whose help is its docstring, called with the model
    the command line gives."""
    hints = typing.get_type_hints(args, include_extras=True)
    params = [inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, annotation=hints[field],
                                default=inspect.Parameter.empty if info.is_required() else info.default)
              for field, info in args.model_fields.items()]

    def register(run: Callable[[Args], None]) -> None:
        def parsed(**values: object) -> None:
            run(args(**values))

        parsed.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        parsed.__annotations__ = {p.name: p.annotation for p in params}
        parsed.__name__, parsed.__doc__ = run.__name__, help_text(run.__doc__ or "")
        on.command(name, cls=Command)(parsed)

    return register


def fail(message: str, code: int = 2) -> typing.NoReturn:
    from servetune.redact import redact

    console.print(f"[bold red]error:[/] {escape(redact(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn the errors a user can cause (`ServetuneError`: bad input, a missing server, model or study) into
    one line and exit code 2. Anything else is a bug and goes on with its traceback."""
    try:
        yield
    except ServetuneError as e:
        fail(str(e))


@app.callback()
def _before_any_command() -> None:
    """torch's compile cache in this user's own directory, in this process and every one it starts, unless the user
    chose one: importing torch (the tokenizer, the probe of an environment) otherwise makes TMPDIR/torchinductor_USER
    and sets the variable to it, and a launch would take that for the user's choice."""
    from servetune.engine.launcher import compile_cache

    with one_line_errors(), contextlib.suppress(OSError):  # no temporary directory to write: said where one is needed
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache()


def interrupted(e: KeyboardInterrupt, what: str = "") -> typing.NoReturn:
    from servetune.interrupt import exit_code

    fail(f"interrupted ({e or 'SIGINT'}); no server is left running{what}", code=exit_code(e))


def not_started(e: "EngineFailed") -> typing.NoReturn:
    fail(f"vLLM did not start ({e.failure.kind}): {e.failure.reason} (log: {e.failure.log_path})", code=1)


@command(model_app, ModelTinyArgs, "tiny")
def model_tiny(args: ModelTinyArgs) -> None:
    """Write the embedded tiny Llama (random weights, fixed seed, own tokenizer): same bytes every time.

    The demo and the tests serve it; it needs no model hub.

    Example:
      servetune model tiny --out .cache/tiny-llama
    """
    from servetune.tinymodel import write_tiny_model

    write_tiny_model(args.out)
    say(f"wrote the tiny model to {args.out}")


@command(app, BenchArgs)
def bench(args: BenchArgs) -> None:
    r"""Drive load against a vLLM server and report its TTFT, TPOT, ITL, throughput and goodput.

    Measures a running server (--base-url), or launches vLLM with --engine-arg, measures it and stops it
    (--launch). The results go to --json with `vllm bench serve`'s field names, each request's timestamps beside.

    Example:
      servetune bench --base-url http://localhost:8000 --model MODEL \
        --input-len 1024 --output-len 128 --num-prompts 500 --request-rate 8 \
        --json bench.json
    """
    from servetune.engine import EngineFailed
    from servetune.interrupt import handle_signals
    from servetune.measure.benchrun import run_bench

    handle_signals()
    try:
        with one_line_errors():
            run = run_bench(args.resolve(), BenchProgress())
    except EngineFailed as e:
        not_started(e)
    except KeyboardInterrupt as e:
        interrupted(e)
    show_bench(run)
    if run.misplaced:  # a full disk: the results are where this says, not at --json
        fail("; ".join(run.misplaced), code=1)
    m = run.metrics
    assert m is not None  # a run that returned has its metrics
    total = m.completed + m.failed
    if m.completed == 0 or (total and m.failed / total > args.max_failed_fraction):
        fail(f"{m.failed} of {total} requests failed ({m.errors}); the run is unusable "
             f"(records kept in {args.json_out.with_suffix('.records.jsonl')})", code=1)


@command(app, TuneArgs)
def tune(args: TuneArgs) -> None:
    r"""Find the vLLM config that serves the most requests per second within your SLOs, measured on the real engine.

    Launches vLLM's defaults, then candidate configs, and measures each under load levels that search for the
    highest rate whose p99 latencies hold the SLOs, until --budget servers are measured or --time-limit is
    reached. Prints the best config and the `vllm serve` command to run it; writes summary.json, best.yaml,
    best_command.sh, report.html and every trial's records to --out.

    Example:
      servetune tune --model /models/Llama-3.1-8B-Instruct --workload chat.yaml \
        --slo ttft_p99_ms=1000 --slo itl_p99_ms=30 --time-limit 30m \
        --out out/chat
    """
    with one_line_errors():
        opts = args.resolve()
    _tune_guarded(opts)


@command(app, DemoArgs)
def demo(args: DemoArgs) -> None:
    """Tune a tiny Llama on this machine, end to end, within a time limit: servetune's demo.

    Writes the tiny model, measures this machine to set the SLO (p99 ITL), then tunes: a small budget, each load
    level decided at 95% confidence, the pick held against vLLM's defaults.

    Example:
      servetune demo --out out/demo --time-limit 9m
    """
    import time

    from servetune.demo import measure_machine, write_small_chunk
    from servetune.engine import EngineFailed
    from servetune.tinymodel import write_tiny_model

    started = time.time()
    with one_line_errors():
        limit_s = args.limit_s()
    model = write_tiny_model(args.out / "tiny-llama")
    say(f"wrote the tiny model to {model}")
    with one_line_errors():
        resumed = _resumed(args.out) if args.resume else None
    if resumed is not None:
        slo, reference = resumed
    else:
        say("measuring this machine: vLLM's defaults, the demo's longest prompt one at a time ...")
        try:
            speed = measure_machine(model, args.out)
        except EngineFailed as e:
            not_started(e)
        say(speed.describe())
        slo, reference = speed.itl_slo_ms, write_small_chunk(args.out) if speed.slow else None
    with one_line_errors():
        opts = args.tune(model, slo, limit_s - (time.time() - started), reference).resolve()
    _tune_guarded(opts)


def _resumed(out) -> "tuple[float, Path | None]":
    """The demo study's p99 ITL bound in `out`, and its reference config's file (a resume keeps both)."""
    from servetune.demo import REFERENCE
    from servetune.measure.slo import ITL
    from servetune.report.data import load_study
    from servetune.study.storage import default_storage

    meta = load_study(default_storage(out)).meta
    if (itl := meta.slos.bound(ITL)) is None:
        raise ServetuneError(f"{out}: not the demo's study (it bounds no p99 ITL)")
    return itl, out / REFERENCE if meta.references else None


def _tune_guarded(opts: "TuneOptions") -> None:
    """The tune, its errors in one line: a user's (exit 2), workers lost, a study storage that fails or a trial's
    file that cannot be written (a full disk; exit 1), a stop (130/143)."""
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import OperationalError

    from servetune.executors import WorkerError, WorkerLost
    from servetune.interrupt import handle_signals
    from servetune.redact import shown_url
    from servetune.study.storage import default_storage

    handle_signals()
    try:
        with one_line_errors():
            _tune(opts)
    except (StorageInternalError, OperationalError) as e:
        cause = str(e.__cause__ or e).strip().splitlines()[0]
        fail(f"the study's storage failed ({cause}): what it was told before is kept in "
             f"{shown_url(opts.storage or default_storage(opts.out))}, the outputs in {opts.out} as last written; "
             "once it can be written again, continue with the same command and --resume", code=1)
    except OSError as e:  # a disk that filled up during the tune (one that was full is refused before it)
        fail(f"the tune stopped: cannot write {e.filename} ({e.strerror or e}); the study keeps what was measured "
             f"before, and the outputs in {opts.out} say so (state: interrupted): free space there and continue "
             "with the same command and --resume", code=1)
    except WorkerError as e:
        fail(str(e), code=1)
    except WorkerLost as e:  # the tuner queues a lost trial again: one that escapes it is said in a line all the same
        fail(f"a trial's worker was lost ({e}): continue with the same command and --resume", code=1)
    except KeyboardInterrupt as e:
        interrupted(e, _outputs_as_left(opts.out))


def _outputs_as_left(out) -> str:
    """What a stopped tune left in `out`, as its summary.json says: written as interrupted, or untouched (stopped
    before a resumed tune began), or none (before anything was measured)."""
    from servetune.study.record import TuneState

    try:
        state = json.loads((out / "summary.json").read_text())["state"]
    except (OSError, ValueError, KeyError):
        return "; nothing was measured yet: run the same command again"
    said = "say what was measured" if state == TuneState.INTERRUPTED else "are as they were"
    return f"; the outputs in {out} {said} (state: {state}). Continue with the same command and --resume"


def _tune(opts: "TuneOptions") -> "Summary":
    from servetune.executors import runs_inline
    from servetune.tuner.loop import tune as run_tune

    bar = progress_bar(auto_refresh=False)  # started by the first trial: an early error leaves no bar behind
    try:
        progress = TuneProgress(bar, opts.budget, levels=runs_inline(opts.parallel, opts.ray_address),
                                rate_unit=opts.workload.rate_unit, slo=opts.slo)
        summary = run_tune(opts, progress)
    finally:
        if bar.live.is_started:
            bar.stop()
    show_answer(summary, opts.out)
    return summary


@command(app, ReportArgs)
def report(args: ReportArgs) -> None:
    """Write a study's HTML report: Pareto front, load curves, parameter effects, every trial.

    Reads the study in --out (or --study) without writing into it, and writes into --out report.html, its charts,
    trials.json, levels.csv and the tune's outputs (summary.json, best.yaml, ...). Every tune writes them too.

    Example:
      servetune report --out out/chat
    """
    from servetune.report import write_report

    with one_line_errors():
        path = write_report(args.resolve(), args.out)
    say(f"report: {path}")


@command(app, MemoryArgs)
def memory(args: MemoryArgs) -> None:
    r"""Predict, without launching, whether a config fits and how many KV-cache tokens it gets.

    Reads the model's config.json and its weights' sizes, and predicts vLLM's start-up memory plan (docs/memory.md).

    Example:
      servetune memory --model /models/Llama-3.1-8B-Instruct \
        --device-memory-gib 141 --max-num-seqs 256 --max-model-len 8192
    """
    from servetune.engine.memory import memory_report
    from servetune.jsonio import jsonable

    kind = DeviceKind.of(args.cpu_kvcache_space_gib is not None)
    with one_line_errors():
        try:
            report = memory_report(args.model, args.device_memory_gib, device_kind=kind, device_name=args.device_name,
                                   **args.engine_args())
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise UsageError(f"{args.model}: cannot read the model config: {e}") from None
    if args.as_json:
        print(json.dumps(jsonable(report), indent=2))
        return
    verdict = "fits" if report["fits"] else f"does not fit: {report['reason']}"
    say(f"{report['kv_cache_tokens']:,} KV-cache tokens, max concurrency {report['max_concurrency']:.2f}x; {verdict}")


@command(app, VerifyArgs)
def verify(args: VerifyArgs) -> None:
    """Measure a config with servetune's client and with `vllm bench serve`, and print both side by side.

    Launches the config once, sends the same prompts at the same rate with each client, and prints both clients'
    numbers with the SLO verdicts. With --out, what is not given comes from that tune: its recommended config,
    SLOs, workload and rate.

    Example:
      servetune verify --out out/chat --num-prompts 400
    """
    from servetune.engine import EngineFailed
    from servetune.interrupt import handle_signals
    from servetune.verify import verify as run_verify

    handle_signals()
    try:
        with one_line_errors():
            plan, json_out = args.resolve()
            if plan.tune_note:
                warn(plan.tune_note)
            result = run_verify(plan, json_out, on_stage=lambda stage: say(f"{stage} ..."), on_note=say)
    except EngineFailed as e:
        not_started(e)
    except KeyboardInterrupt as e:
        interrupted(e)
    console.print(verify_table(result))
    if result.misplaced:  # a full disk: the results are where this says, not at --json
        fail("; ".join(result.misplaced), code=1)
    say(f"results: {json_out}")
    if result.vllm is None:
        assert result.vllm_failure is not None  # why vLLM's client has no result
        fail(result.vllm_failure, code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

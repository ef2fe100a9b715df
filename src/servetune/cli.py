"""The `servetune` command line: bench, tune, report, memory, model, demo."""

import json
import math
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servetune import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest vLLM configuration for a model, workload and latency target.")
model_app = typer.Typer(no_args_is_help=True, help="Models servetune can write itself.")
app.add_typer(model_app, name="model")
console = Console(stderr=True)


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def one_line_errors():
    """Turn the errors a user can cause into one line and a non-zero exit."""
    from servetune.bench import ServerUnreachable
    from servetune.engine import VllmNotFound
    from servetune.workload import WorkloadError

    try:
        yield
    except (UsageError, WorkloadError, ServerUnreachable, VllmNotFound, ValueError) as e:
        fail(str(e))


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


SloOption = Annotated[list[str], typer.Option("--slo", help="An SLO, e.g. ttft_p99_ms=1000 (repeatable).")]
EngineArgOption = Annotated[list[str], typer.Option(
    "--engine-arg", help="A vLLM engine arg as key=value, e.g. max-num-seqs=64 (repeatable).")]


@model_app.command("tiny")
def model_tiny(out: Annotated[Path, typer.Option(help="Directory to write the model into.")]) -> None:
    """Write the embedded tiny Llama (random weights, fixed seed, own tokenizer): same bytes every time."""
    from servetune.tinymodel import write_tiny_model

    write_tiny_model(out)
    console.print(f"wrote the tiny model to {out}")


def _summary_table(title: str, metrics: dict, server: dict | None) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("completed / failed", f"{metrics['completed']} / {metrics['failed']}"),
        ("duration (s)", f"{metrics['duration']:.2f}"),
        ("request throughput (req/s)", f"{metrics['request_throughput']:.2f}"),
        ("output throughput (tok/s)", f"{metrics['output_throughput']:.1f}"),
        ("TTFT mean / p99 (ms)", f"{metrics['mean_ttft_ms']:.1f} / {metrics['p99_ttft_ms']:.1f}"),
        ("TPOT mean / p99 (ms)", f"{metrics['mean_tpot_ms']:.2f} / {metrics['p99_tpot_ms']:.2f}"),
        ("ITL mean / p99 (ms)", f"{metrics['mean_itl_ms']:.2f} / {metrics['p99_itl_ms']:.2f}"),
        ("E2EL mean / p99 (ms)", f"{metrics['mean_e2el_ms']:.1f} / {metrics['p99_e2el_ms']:.1f}"),
    ]
    if metrics.get("request_goodput") is not None:
        rows.append(("goodput (req/s)", f"{metrics['request_goodput']:.2f}"))
    if metrics.get("steady_request_rate") is not None:
        rows.append(("steady completion rate (req/s)", f"{metrics['steady_request_rate']:.2f}"))
    if server is not None:
        rows.append(("preemptions", f"{server.get('num_preemptions', 0):.0f}"))
    if metrics["errors"]:
        rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in metrics["errors"].items())))
    for name, value in rows:
        table.add_row(name, value)
    return table


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
) -> None:
    """Drive load against a vLLM server (running, or launched with --launch) and report its metrics."""
    with one_line_errors():
        result = _bench(json_out, model, base_url, launch, engine_arg, tokenizer, workload, input_len, output_len,
                        num_prompts, request_rate, burstiness, max_concurrency, endpoint, seed, warmup, goodput)
    total = result["completed"] + result["failed"]
    if result["completed"] == 0 or (total and result["failed"] / total > max_failed_fraction):
        fail(f"{result['failed']} of {total} requests failed ({result['errors']}); the run is unusable "
             f"(records kept in {json_out.with_suffix('.records.jsonl')})", code=1)


def _bench(json_out, model, base_url, launch, engine_arg, tokenizer, workload, input_len, output_len, num_prompts,
           request_rate, burstiness, max_concurrency, endpoint, seed, warmup, goodput) -> dict:
    from servetune.bench import check_server, measure_level
    from servetune.engine import Engine, EngineFailed, serve_command
    from servetune.engine.args import parse_pairs
    from servetune.loadgen import Target
    from servetune.workload import WorkloadSpec, build_requests, load_tokenizer, load_workload

    if launch == (base_url is not None):
        raise UsageError("give exactly one of --base-url URL (a running server) or --launch")
    if engine_arg and not launch:
        raise UsageError("--engine-arg needs --launch")
    spec = load_workload(workload) if workload else WorkloadSpec.random(input_len, output_len, num_prompts or 1000)
    overrides = {"num_requests": num_prompts, "request_rate": request_rate, "burstiness": burstiness,
                 "max_concurrency": max_concurrency, "endpoint": endpoint, "seed": seed}
    spec = WorkloadSpec.model_validate(spec.model_dump() | {k: v for k, v in overrides.items() if v is not None})
    slo = {k: float(v) for k, v in parse_pairs(goodput).items()}
    engine_args = parse_pairs(engine_arg)
    tok = load_tokenizer(tokenizer or model)
    requests = build_requests(spec, tok, count=spec.num_requests + warmup)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    output: dict = {"servetune_version": __version__, "date": datetime.now(timezone.utc).isoformat(),
                    "model": model, "workload": spec.model_dump()}

    def run(url: str) -> dict:
        target = Target(url, model, spec.endpoint)
        check_server(target)
        with progress_bar() as bar:
            task = bar.add_task("requests", total=len(requests))
            level = measure_level(target, requests, request_rate=spec.request_rate, burstiness=spec.burstiness,
                                  max_concurrency=spec.max_concurrency, warmup_requests=warmup, seed=spec.seed,
                                  goodput_slo=slo or None, on_record=lambda r: bar.advance(task))
        level.load.save(json_out.with_suffix(".records.jsonl"))
        console.print(_summary_table(f"servetune bench: {model}", level.metrics, level.server))
        return level.metrics | {"server_metrics": level.server}

    if launch:
        engine = Engine(model, engine_args, json_out.with_suffix(".server.log"))
        console.print(f"launching: {serve_command(model, engine.engine_args)}")
        try:
            with progress_bar() as bar:
                bar.add_task("starting vLLM", total=None)
                facts = engine.start()
        except EngineFailed as e:
            output["engine"] = {"config": engine.engine_args, "failure": e.failure.to_dict()}
            write_json(json_out, output)
            fail(f"vLLM did not start ({e.failure.kind}): {e.failure.reason} (log: {e.failure.log_path})", code=1)
        try:
            output["engine"] = {"config": engine.engine_args, "startup": facts.to_dict(),
                                "vllm_version": engine.vllm.version, "device": engine.vllm.device_type,
                                "command": serve_command(model, engine.engine_args)}
            output |= run(engine.base_url)
            output["engine"]["alive_at_end"] = engine.alive()
        finally:
            engine.stop()
    else:
        output |= run(base_url)
    write_json(json_out, output)
    return output


def jsonable(value):
    """`value` with infinite floats as the string "inf" (strict JSON has no Infinity) and paths as text."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(jsonable(value), indent=2) + "\n")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

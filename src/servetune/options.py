"""What each command takes, declared once: a model per command whose fields are its options (type, default, flag,
help). The CLI builds each command's line from its model (`cli.command`); `resolve` checks the values into what the
command runs (`BenchOptions`, `TuneOptions`, a `VerifyPlan`), naming the option in the one line a bad one gives
(UsageError); the tests build the same models. Heavy modules are imported where a value is checked, so that
`servetune --help` stays quick."""

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, cast

from pydantic import BaseModel, ConfigDict
from typer import Option

from servetune.device import DeviceKind
from servetune.errors import ServetuneError
from servetune.jsonio import check_writable
from servetune.knobs import optional_help
from servetune.measure.slo import GOODPUT_KEYS, NO_SLO, Objective, Slos
from servetune.search.strategies import strategy_help
from servetune.timelimit import GUESS_LAUNCH_S, duration, parse_duration
from servetune.trial.run import MIN_WINDOW_S

if TYPE_CHECKING:
    from servetune.measure.benchrun import BenchOptions
    from servetune.tuner.loop import TuneOptions
    from servetune.verify import TunePick, VerifyPlan
    from servetune.workload import WorkloadSpec


MIN_TIME_LIMIT_S = GUESS_LAUNCH_S[DeviceKind.CPU][0]  # vLLM's first launch on a CPU, as the time plan guesses it
MAX_TIME_LIMIT_S = 7 * 86_400.0


class UsageError(ServetuneError):
    """A bad command-line option: reported as one line, exit code 2."""


class _Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# The panels a command's --help groups its options into (Typer's rich_help_panel), and help texts commands share.
MODEL_PANEL, SEARCH_PANEL, LEVELS_PANEL = "Model, workload and SLOs", "Search", "Load levels"
FIXED_PANEL = "Every config, reference configs and the head-to-head"
TIME_PANEL, STORAGE_PANEL, CLUSTER_PANEL = "Time", "Outputs and study storage", "Parallel trials and clusters"
SERVER_PANEL, LOAD_PANEL, RESULTS_PANEL = "Server", "Load", "Results"
SLO_HELP = "An SLO as NAME=MS: ttft_p99_ms, tpot_p99_ms, itl_p99_ms or e2el_p99_ms, e.g. itl_p99_ms=30 (repeatable)."
TOKENIZER_HELP = "Tokenizer to build the prompts with (a path or hub name); default: the model's."


def timeout_option(panel: str) -> Any:
    """--request-timeout, shown in `panel` of its command's help."""
    return Option("--request-timeout", metavar="SECONDS", rich_help_panel=panel,
                  help="Seconds without a byte from the server after which a request fails (kind timeout); default: "
                       "30 s plus the level's tokens at 1,000 tokens/s.")


class BenchArgs(_Args):
    """`servetune bench`: drive load against a vLLM server (running, or launched with --launch) and report its
    metrics."""

    model: Annotated[str, Option("--model", metavar="MODEL", rich_help_panel=SERVER_PANEL,
                                 help="Served model name; with --launch, the model's directory (or hub name).")]
    base_url: Annotated[Optional[str], Option(metavar="URL", rich_help_panel=SERVER_PANEL,
                                              help="A running OpenAI-compatible server.")] = None
    launch: Annotated[bool, Option(rich_help_panel=SERVER_PANEL,
                                   help="Launch vLLM with --engine-arg, bench it, stop it.")] = False
    engine_arg: Annotated[list[str], Option(
        metavar="KEY=VALUE", rich_help_panel=SERVER_PANEL,
        help="With --launch, a vLLM engine arg as KEY=VALUE, e.g. max-num-seqs=64 (repeatable).")] = []
    tokenizer: Annotated[Optional[str], Option(metavar="PATH", rich_help_panel=LOAD_PANEL,
                                               help=TOKENIZER_HELP)] = None
    workload: Annotated[Optional[Path], Option(metavar="PATH", rich_help_panel=LOAD_PANEL,
                                               help="A workload YAML file (instead of random prompts).")] = None
    input_len: Annotated[int, Option(min=1, metavar="TOKENS", rich_help_panel=LOAD_PANEL,
                                     help="Each random prompt's length.")] = 1024
    output_len: Annotated[int, Option(min=1, metavar="TOKENS", rich_help_panel=LOAD_PANEL,
                                      help="Each random request's reply length.")] = 128
    num_prompts: Annotated[Optional[int], Option(min=1, metavar="N", rich_help_panel=LOAD_PANEL,
                                                 help="Requests to send; default: the workload's, else 1000.")] = None
    request_rate: Annotated[Optional[float], Option(metavar="RATE", rich_help_panel=LOAD_PANEL,
                                                    help="Requests per second, or inf (all at once); "
                                                         "default: the workload's (inf for random prompts).")] = None
    burstiness: Annotated[Optional[float], Option(metavar="SHAPE", rich_help_panel=LOAD_PANEL,
                                                  help="Gamma shape of the arrivals; 1 = Poisson.")] = None
    max_concurrency: Annotated[Optional[int], Option(min=1, metavar="N", rich_help_panel=LOAD_PANEL,
                                                     help="Most requests in flight at once.")] = None
    endpoint: Annotated[Optional[str], Option(metavar="NAME", rich_help_panel=LOAD_PANEL,
                                              help="completions or chat.")] = None
    seed: Annotated[Optional[int], Option(metavar="N", rich_help_panel=LOAD_PANEL,
                                          help="Seed of the prompts and arrivals; default: the workload's.")] = None
    warmup: Annotated[int, Option(min=0, metavar="N", rich_help_panel=LOAD_PANEL,
                                  help="Warm-up requests, not measured.")] = 0
    goodput: Annotated[list[str], Option(
        metavar="NAME=MS", rich_help_panel=RESULTS_PANEL,
        help=f"Per-request SLO for goodput ({', '.join(GOODPUT_KEYS)}), e.g. ttft_ms=500.")] = []
    max_failed_fraction: Annotated[float, Option(metavar="FRACTION", rich_help_panel=RESULTS_PANEL,
                                                 help="Exit 1 when more requests fail than this.")] = 0.05
    request_timeout: Annotated[Optional[float], timeout_option(RESULTS_PANEL)] = None
    json_out: Annotated[Path, Option("--json", metavar="PATH", rich_help_panel=RESULTS_PANEL, help="Write the "
                                     "results here (vllm bench serve's field names), each request's records beside.")]

    def resolve(self) -> "BenchOptions":
        """Every option checked before any server is asked or launched."""
        from servetune.measure.benchrun import BenchOptions

        request_timeout_s = check_timeout(self.request_timeout)
        if self.launch == (self.base_url is not None):
            raise UsageError("give exactly one of --base-url URL (a running server) or --launch")
        if self.engine_arg and not self.launch:
            raise UsageError("--engine-arg needs --launch")
        if self.launch:
            check_lock_directory()
        model = local_model(self.model) if self.launch else self.model
        return BenchOptions(json_out=self.json_out, model=model, workload=self._workload(), base_url=self.base_url,
                            goodput_slo=self._goodput_slo(), engine_args=engine_args(self.engine_arg),
                            tokenizer=self.tokenizer, warmup=self.warmup, request_timeout_s=request_timeout_s)

    def _workload(self) -> "WorkloadSpec":
        """The workload file, or random lengths, with the load options on top; a bad one named."""
        from servetune.workload import WorkloadSpec, load_workload

        spec = (load_workload(self.workload) if self.workload
                else WorkloadSpec.random(self.input_len, self.output_len, self.num_prompts or 1000))
        for name, (field, option) in _BENCH_LOAD.items():
            if (value := getattr(self, field)) is not None:
                with about(option):
                    spec = WorkloadSpec.model_validate(spec.model_dump() | {name: value})
        return spec

    def _goodput_slo(self) -> dict[str, float]:
        from servetune.measure.slo import parse_goodput

        goodput = pairs(self.goodput, "--goodput")
        with about("--goodput"):
            return parse_goodput(goodput)


# the workload's fields the bench options set: (field, option)
_BENCH_LOAD = {"num_requests": ("num_prompts", "--num-prompts"), "request_rate": ("request_rate", "--request-rate"),
               "burstiness": ("burstiness", "--burstiness"),
               "max_concurrency": ("max_concurrency", "--max-concurrency"), "endpoint": ("endpoint", "--endpoint"),
               "seed": ("seed", "--seed")}


class TuneArgs(_Args):
    """`servetune tune`: search vLLM configs for the most goodput under SLOs (or throughput), measured on the real
    engine."""

    model: Annotated[str, Option(metavar="PATH", rich_help_panel=MODEL_PANEL,
                                 help="Model directory (or hub name) to serve.")]
    workload: Annotated[Path, Option(metavar="PATH", rich_help_panel=MODEL_PANEL,
                                     help="Workload YAML file: prompt and reply lengths, arrivals, rate.")]
    out: Annotated[Path, Option(metavar="DIR", rich_help_panel=STORAGE_PANEL,
                                help="Output directory: summary.json, best.yaml, report.html, the study.")]
    slo: Annotated[list[str], Option("--slo", metavar="NAME=MS", rich_help_panel=MODEL_PANEL, help=SLO_HELP)] = []
    objective: Annotated[Objective, Option(metavar="NAME", rich_help_panel=MODEL_PANEL,
                                           help="goodput (highest rate within SLOs) or throughput (at rate "
                                                "inf).")] = Objective.GOODPUT
    strategy: Annotated[str, Option(metavar="NAME", rich_help_panel=SEARCH_PANEL, help=strategy_help())] = "optuna"
    budget: Annotated[int, Option(min=1, metavar="N", rich_help_panel=SEARCH_PANEL,
                                  help="Servers to launch, vLLM's defaults included.")] = 6
    study: Annotated[Optional[str], Option(
        metavar="URL", rich_help_panel=STORAGE_PANEL,
        help="Optuna storage URL, e.g. postgresql+psycopg://user@host/db; default sqlite in OUT.")] = None
    resume: Annotated[bool, Option(rich_help_panel=STORAGE_PANEL,
                                   help="Continue the study in OUT (or --study).")] = False
    engine_arg: Annotated[list[str], Option(metavar="KEY=VALUE", rich_help_panel=FIXED_PANEL,
                                            help="A vLLM engine arg every config gets, vLLM's defaults included, "
                                                 "as KEY=VALUE, e.g. max-model-len=8192 (repeatable).")] = []
    reference_config: Annotated[list[Path], Option(
        metavar="PATH", rich_help_panel=FIXED_PANEL,
        help="A vLLM config YAML to measure as it is, beside the search (repeatable).")] = []
    knob: Annotated[list[str], Option(metavar="NAME", rich_help_panel=SEARCH_PANEL,
                                      help=f"An optional knob to search too (repeatable): {optional_help()}.")] = []
    tokenizer: Annotated[Optional[str], Option(metavar="PATH", rich_help_panel=MODEL_PANEL,
                                               help=TOKENIZER_HELP)] = None
    level_requests: Annotated[int, Option(
        min=1, metavar="N", rich_help_panel=LEVELS_PANEL,
        help="Requests a load level's steady window aims to count; it also sends a fill and a tail, and stops "
             "as soon as its verdict is decided.")] = 600
    min_level_requests: Annotated[int, Option(min=1, metavar="N", rich_help_panel=LEVELS_PANEL,
                                              help="Fewest requests a level's verdict rests on.")] = 40
    max_levels: Annotated[int, Option(min=0, metavar="N", rich_help_panel=LEVELS_PANEL,
                                      help="Most load levels per trial in the rate search.")] = 6
    level_window: Annotated[float, Option(
        min=1.0, metavar="SECONDS", rich_help_panel=LEVELS_PANEL,
        help="Shortest steady window of a load level: a longer one passes fewer rates above what the server "
             "sustains near its limit, at more time per level.")] = MIN_WINDOW_S
    confidence: Annotated[float, Option(
        min=0.5, max=0.999, metavar="P", rich_help_panel=LEVELS_PANEL,
        help="Confidence of each level's pass and fail verdicts.")] = 0.95
    time_limit: Annotated[Optional[str], Option(
        metavar="DURATION", rich_help_panel=TIME_PANEL,
        help="Wall-clock budget of the whole tune, launches and head-to-head included, e.g. 25m, 1h30m: "
             "servetune launches only what still fits and stops there with its best answer.")] = None
    seed: Annotated[int, Option(min=0, max=2**32 - 1, metavar="N", rich_help_panel=SEARCH_PANEL,
                                help="Seed of the search (the prompts take the workload's).")] = 0
    parallel: Annotated[Optional[int], Option(
        min=1, metavar="N", rich_help_panel=CLUSTER_PANEL,
        help="Trials at once: on this host, each on its own GPUs (CPU: its own cores); "
             "with --ray-address, at most this many (default: one per GPU of the cluster).")] = None
    ray_address: Annotated[Optional[str], Option(
        metavar="HOST:PORT", rich_help_panel=CLUSTER_PANEL,
        help="Run trials as Ray tasks on this cluster (e.g. 10.0.0.1:6379); every node needs servetune, vLLM "
             "and the model at the same path.")] = None
    confirm: Annotated[bool, Option(
        rich_help_panel=FIXED_PANEL,
        help="After the search, launch vLLM's defaults again at the pick's goodput rate (the head-to-head) "
             "before recommending it over them (--no-confirm: recommend the search's result as it is).")] = True
    request_timeout: Annotated[Optional[float], timeout_option(LEVELS_PANEL)] = None
    min_model_len: Annotated[Optional[int], Option(
        min=1, metavar="TOKENS", rich_help_panel=SEARCH_PANEL,
        help="Configs launch with the model's own context; where servetune tightens max-model-len (no "
             "chunked prefill, a KV cache too small for the context), never below this many tokens.")] = None

    gpu_hour_price: Annotated[Optional[float], Option(
        metavar="USD", rich_help_panel=MODEL_PANEL,
        help="What one GPU costs an hour: each config's cost per million output tokens at its goodput rate "
             "(summary.json, the report).")] = None

    def resolve(self) -> "TuneOptions":
        """Every option checked: the model directory, workload file, `key=value` SLOs and engine args, reference
        config files, strategy, objective, the time limit and the levels' request timeout."""
        from servetune.measure.slo import parse_slo
        from servetune.search.strategies import REGISTRY
        from servetune.trial.run import LevelOptions
        from servetune.tuner.loop import TuneOptions
        from servetune.workload import load_workload
        from servetune.workload.load import reply_lengths

        if self.strategy not in REGISTRY:
            raise UsageError(f"--strategy: unknown strategy {self.strategy!r}; choose from {', '.join(REGISTRY)}")
        check_lock_directory()
        slo_pairs = pairs(self.slo, "--slo")
        with about("--slo"):
            slos = parse_slo(slo_pairs)
        time_limit_s = self._time_limit_s()
        levels = LevelOptions(requests=self.level_requests, min_requests=self.min_level_requests,
                              max_levels=self.max_levels, confidence=self.confidence,
                              request_timeout_s=self.request_timeout, window_s=self.level_window)
        workload = load_workload(self.workload)
        self._check_levels_decide(slos, reply_lengths(workload))
        with about("--reference-config"):
            references = [read_config_yaml(path) for path in self.reference_config]
        opts = TuneOptions(
            model=local_model(self.model), workload=workload, out=self.out, slo=slos,
            objective=self.objective, strategy=self.strategy, budget=self.budget, storage=self.study,
            resume=self.resume, engine_args=engine_args(self.engine_arg), references=references,
            optional_knobs=tuple(self.knob), tokenizer=self.tokenizer, levels=levels, seed=self.seed,
            parallel=self.parallel, ray_address=self.ray_address, confirm=self.confirm, time_limit_s=time_limit_s,
            min_model_len=self.min_model_len, gpu_hour_price=self.gpu_hour_price)
        check_timeout(opts.levels.request_timeout_s)
        self._check_study()
        return opts

    def _check_levels_decide(self, slos: Slos, replies: tuple[float, float] | None) -> None:
        """Every SLO can be decided by a level: TPOT and ITL need replies of 2 tokens or more (`replies`: the
        workload's longest and mean reply, where known), and a level of --level-requests can pass each SLO: it needs
        `verdict.least_counted` requests counted after it fills up, and a few more for the fill."""
        from servetune.measure.slo import ITL, TPOT, TTFT
        from servetune.measure.verdict import least_counted
        from servetune.trial.run import FILL_SPARE

        between = [s for s in slos if s.latency in (TPOT, ITL)]
        if between and replies is not None and replies[0] < 2:
            raise UsageError(f"--slo {between[0].name}: every reply of the workload is 1 token long, and "
                             f"{between[0].latency.label} is measured between a reply's tokens: give the workload's "
                             f"output_len at least 2 tokens, or bound {TTFT.slo} or e2el_p99_ms")
        gaps = replies[1] - 1 if replies is not None else math.inf  # an ITL level counts gaps
        counted = least_counted(slos, self.confidence, self.min_level_requests, gaps)
        if slos and self.level_requests < counted + FILL_SPARE:
            per_request = any(s.latency.per_request is not None for s in slos)
            why = (" (--min-level-requests)" if counted == self.min_level_requests
                   else "" if per_request else f" ({gaps:.0f} gaps each)")
            raise UsageError(
                f"--level-requests {self.level_requests}: no level could pass {', '.join(slos.as_dict())}: at "
                f"{self.confidence:.0%} it passes only on at least {counted} requests{why} counted after the level "
                f"fills up, and filling it takes more; use at least {counted + 100} (the default is 600)")

    def _check_study(self) -> None:
        """--study readable as SQLAlchemy reads it (its password remembered, so that nothing prints it), and with
        --resume a study in the storage: checked without writing anything, so that a --resume with nothing to
        resume leaves no --out directory behind. (A study found without --resume is refused once its lock is
        taken: a tuner holding it is named.)"""
        from servetune.study.storage import check_storage, default_storage

        check_study_url(self.study)
        if self.resume:
            check_storage(self.study or default_storage(self.out), resume=True)

    def _time_limit_s(self) -> float | None:
        return None if self.time_limit is None else time_limit_s(self.time_limit)


class DemoArgs(_Args):
    """`servetune demo`: build the tiny model, measure this machine and tune the model on it: a small budget within a
    time limit, each level decided at 95% confidence, the pick held against vLLM's defaults."""

    out: Annotated[Path, Option(
        metavar="DIR", help="Output directory: the tiny model and the tune's outputs.")] = Path("out/demo")
    budget: Annotated[int, Option(min=1, metavar="N", help="Servers to launch, vLLM's defaults included.")] = 3
    time_limit: Annotated[str, Option(metavar="DURATION", help="Wall-clock budget of the demo: the machine measured, "
                                                               "then the tune (see `tune --time-limit`).")] = "9m"
    resume: Annotated[bool, Option(help="Continue the demo's study in OUT.")] = False

    def limit_s(self) -> float:
        """The demo's time limit in seconds."""
        return time_limit_s(self.time_limit)

    def tune(self, model: Path, itl_slo_ms: float, time_limit_s: float, reference: Path | None = None) -> TuneArgs:
        """The tune of the tiny model written to `model`, under p99 ITL <= `itl_slo_ms`, within `time_limit_s` (at
        least what a tune is allowed: the machine's measure may leave less); with a `reference` config, that config
        and the defaults alone (budget 2)."""
        from servetune.demo import WORKLOAD

        return TuneArgs(model=str(model.resolve()), workload=WORKLOAD, out=self.out, slo=[f"itl_p99_ms={itl_slo_ms:g}"],
                        strategy="optuna", budget=2 if reference else self.budget, resume=self.resume, seed=0,
                        time_limit=f"{max(MIN_TIME_LIMIT_S, time_limit_s):.0f}s", level_requests=400, max_levels=4,
                        reference_config=[reference] if reference else [])


class ReportArgs(_Args):
    """`servetune report`: write the HTML report (Pareto front, load curves, parameter effects, every trial) of a
    study."""

    out: Annotated[Path, Option(metavar="DIR", help="Directory to write report.html, charts and exports into.")]
    study: Annotated[Optional[str], Option(metavar="URL",
                                           help="Optuna storage URL; default: the sqlite study in OUT.")] = None

    def resolve(self) -> str:
        """The study's storage URL, once `out` is known to be writable."""
        from servetune.study.storage import default_storage

        check_study_url(self.study)
        try:
            check_writable(self.out / "report.html")
        except OSError as e:
            raise UsageError(f"--out: cannot write into {self.out}: {e.strerror or e}") from None
        return self.study or default_storage(self.out)


class MemoryArgs(_Args):
    """`servetune memory`: predict, without launching, whether a config fits and how many KV-cache tokens it gets."""

    model: Annotated[str, Option(metavar="PATH", help="Model directory or its config.json.")]
    device_memory_gib: Annotated[float, Option(metavar="GIB", help="Device memory (GiB); on CPU, the machine's RAM.")]
    gpu_memory_utilization: Annotated[Optional[float], Option(
        metavar="FRACTION", help="The config's gpu-memory-utilization; default: vLLM's.")] = None
    max_model_len: Annotated[Optional[int], Option(
        metavar="TOKENS", help="The config's max-model-len; default: vLLM's (the model's context).")] = None
    max_num_batched_tokens: Annotated[Optional[int], Option(
        metavar="TOKENS", help="The config's max-num-batched-tokens; default: vLLM's.")] = None
    max_num_seqs: Annotated[Optional[int], Option(
        metavar="N", help="The config's max-num-seqs; default: vLLM's.")] = None
    enforce_eager: Annotated[bool, Option("--enforce-eager", help="The config runs eagerly (no CUDA graphs).")] = False
    cpu_kvcache_space_gib: Annotated[Optional[float], Option(metavar="GIB",
                                                             help="CPU: the KV cache size (GiB).")] = None
    device_name: Annotated[str, Option(metavar="NAME",
                                       help="GPU name, e.g. H200 (vLLM's defaults depend on it).")] = ""
    as_json: Annotated[bool, Option("--json", help="Print JSON.")] = False

    def engine_args(self) -> dict[str, Any]:
        """The config to predict (None: vLLM's default)."""
        return {"gpu_memory_utilization": self.gpu_memory_utilization, "max_model_len": self.max_model_len,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                "enforce_eager": self.enforce_eager or None, "cpu_kvcache_space_gib": self.cpu_kvcache_space_gib}


class VerifyArgs(_Args):
    """`servetune verify`: measure a config at a rate with servetune's client and with vLLM's `vllm bench serve` on
    the same prompts, and print both side by side with the SLO verdicts."""

    out: Annotated[Optional[Path], Option(
        metavar="DIR", help="A tune's output directory: its model, best config, SLOs, workload and recommended rate, "
                            "unless given below.")] = None
    config: Annotated[Optional[Path], Option(metavar="PATH",
                                             help="A `vllm serve --config` YAML, e.g. a tune's best.yaml.")] = None
    model: Annotated[Optional[str], Option(metavar="PATH", help="Model directory (or hub name) to serve.")] = None
    workload: Annotated[Optional[Path], Option(metavar="PATH", help="Workload YAML file: the prompts' lengths, "
                                                                    "burstiness, max_concurrency, endpoint.")] = None
    rate: Annotated[Optional[float], Option("--rate", metavar="RATE", help="Request rate (req/s).")] = None
    slo: Annotated[list[str], Option("--slo", metavar="NAME=MS", help=SLO_HELP)] = []
    num_prompts: Annotated[int, Option(
        min=1, metavar="N", help="Requests each client sends; servetune's statistical test of a TTFT, TPOT or E2EL "
                                 "p99 needs 299 after the level fills up to pass at 95%.")] = 400
    json_out: Annotated[Optional[Path], Option(
        "--json", metavar="PATH", help="Write both clients' numbers here; beside it the prompts, records, logs "
                                       "(default with --out: OUT/verify.json).")] = None

    def resolve(self) -> tuple["VerifyPlan", Path]:
        """The plan and the JSON path, with what is not given taken from the tune in `out`; each value checked
        and named in the one line a bad or missing one gives."""
        from servetune.measure.slo import parse_slo
        from servetune.verify import VerifyPlan, read_tune
        from servetune.workload import WorkloadSpec, load_workload

        with about("--out"):
            tuned = read_tune(self.out) if self.out is not None else None
        needed = {"--config": self.config, "--model": self.model, "--workload": self.workload, "--rate": self.rate,
                  "--json": self.json_out}
        if tuned is None and (missing := [name for name, value in needed.items() if value is None]):
            raise UsageError(f"{', '.join(missing)}: needed without --out TUNE_DIR")
        pick = cast("TunePick", tuned)  # read below only for an option not given, and then --out was (above)
        if self.rate is None and pick.rate is None:
            raise UsageError(f"--out: the tune in {self.out} holds no rate (no config held the SLOs at a rate it "
                             "measured, or it tuned throughput): give --rate to verify its config at a rate you choose")
        with about("--slo"):
            slos = parse_slo(pairs(self.slo, "--slo")) if self.slo else tuned.slo if tuned else NO_SLO
        with about("--config"):
            engine_args = read_config_yaml(self.config) if self.config is not None else pick.config
        model = local_model(self.model) if self.model is not None else pick.model
        spec = load_workload(self.workload) if self.workload is not None else pick.workload
        rate = self.rate if self.rate is not None else pick.rate
        with about("--rate"):
            spec = WorkloadSpec.model_validate(spec.model_dump() | {"request_rate": rate,
                                                                    "num_requests": self.num_prompts})
        with about("--workload" if self.workload is not None else "--out"):
            plan = VerifyPlan(model=model, config=engine_args, workload=spec, slo=slos,
                              tune_note=tuned.note if tuned else None)
        json_out = self.json_out or cast(Path, self.out) / "verify.json"  # --json is needed without --out
        writable(json_out, "--json")
        check_lock_directory()
        return plan, json_out


class ModelTinyArgs(_Args):
    """`servetune model tiny`: write the embedded tiny Llama (random weights, fixed seed, own tokenizer): same bytes
    every time."""

    out: Annotated[Path, Option(metavar="DIR", help="Directory to write the model into.")]


@contextmanager
def about(option: str) -> Iterator[None]:
    """Name `option` in the one line a bad value of it raises (a ServetuneError, or pydantic's
    ValidationError from checking it)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as e:
        raise UsageError(f"{option}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    except ServetuneError as e:
        raise UsageError(f"{option}: {e}") from None


def pairs(values: Sequence[str], option: str) -> dict[str, Any]:
    """`key=value` strings of a repeatable option as a dict; a bad one is reported naming `option`."""
    from servetune.engine.args import parse_pairs

    with about(option):
        return parse_pairs(list(values))


def engine_args(values: Sequence[str]) -> dict[str, Any]:
    """--engine-arg's `key=value` pairs, each value checked against what its declaration takes (`knobs.checked`). A
    `config=FILE` is read here (`read_config_yaml`), never by vLLM: its flags, under the pairs given beside it."""
    args = pairs(values, "--engine-arg")
    config = args.pop("config", None)
    if config is None:
        return checked_args(args, "--engine-arg")
    if not isinstance(config, str) or not config:
        raise UsageError(f"--engine-arg: config={config}: not the path of a vLLM config file")
    with about("--engine-arg"):
        from_file = read_config_yaml(Path(config))
    return from_file | checked_args(args, "--engine-arg")


def checked_args(args: dict[str, Any], where: str) -> dict[str, Any]:
    """Engine args with each value checked against what its declaration takes (`knobs.checked`), and none of
    servetune's own (`engine.args.SERVETUNES_OWN`); UsageError naming `where`, the argument and what it takes (or
    what to use instead), for the first bad one."""
    from servetune.engine.args import SERVETUNES_OWN
    from servetune.knobs import checked

    if own := next((key for key in args if key in SERVETUNES_OWN), None):
        raise UsageError(f"{where}: {own.replace('_', '-')}: {SERVETUNES_OWN[own]}")
    try:
        return {key: checked(key, value) for key, value in args.items()}
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def check_study_url(study: str | None) -> None:
    """A --study URL SQLAlchemy reads as it was meant, its password remembered so that no message prints it."""
    from servetune.redact import misread_password, remember
    from servetune.study.storage import storage_url

    if study is None:
        return
    remember(study)
    if misread_password(study):
        raise UsageError("--study: the password holds an unescaped '@' (SQLAlchemy would take what follows it for "
                         "the host): write it as %40")
    storage_url(study)


def check_lock_directory() -> None:
    """Before any work, a launch's port-lock directory made (or found) this user's alone (`servetune.private`); a
    neighbour's in its place is refused in one line."""
    from servetune.engine.ports import port_locks

    try:
        port_locks()
    except FileNotFoundError:  # no temporary directory can be written at all: the command's own write check says so
        pass


def time_limit_s(text: str) -> float:
    """--time-limit in seconds (`timelimit.parse_duration`): at least vLLM's first launch on a CPU (a limit that
    holds no launch ran the first trial past it all the same), at most MAX_TIME_LIMIT_S."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--time-limit: {e}") from None
    if seconds < MIN_TIME_LIMIT_S:
        least = duration(MIN_TIME_LIMIT_S)
        raise UsageError(f"--time-limit {text}: less than vLLM's first launch on a machine takes (~{least} on a CPU, "
                         f"more on a GPU): give at least {least}")
    if seconds > MAX_TIME_LIMIT_S:
        raise UsageError(f"--time-limit {text}: more than 7 days: leave --time-limit out for a tune without one")
    return seconds


def check_timeout(request_timeout: float | None) -> float | None:
    if request_timeout is not None and not request_timeout > 0:
        raise UsageError(f"--request-timeout: {request_timeout:g} is not a positive number of seconds")
    return request_timeout


def writable(path: Path, option: str) -> None:
    """UsageError naming `option` unless a file can be written at `path`."""
    try:
        check_writable(path)
    except OSError as e:
        raise UsageError(f"{option}: cannot write {path}: {e.strerror or e}") from None


def local_model(model: str) -> str:
    """A model directory on this machine as an absolute path (servers start in /); a hub name as given. A
    name that can only be a path (/..., ./..., ../..., ~/...) must be a directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if model.startswith(("/", "./", "../", "~")):
        raise UsageError(f"--model: {model}: no such model directory")
    return model


def read_config_yaml(path: Path) -> dict[str, Any]:
    """Engine args from a `vllm serve --config` YAML file (its `model` key is ignored), read within bounds
    (`safeyaml`), each value checked against what its declaration takes."""
    import yaml

    from servetune import safeyaml

    try:
        data = safeyaml.load_file(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, safeyaml.TooBig) as e:
        raise UsageError(f"{path}: cannot read the config: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"{path}: a vLLM config file is a mapping of flag names to values")
    return checked_args({k.replace("-", "_"): v for k, v in data.items() if k != "model"}, str(path))

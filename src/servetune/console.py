"""What the CLI prints, on stderr: progress bars, the bench and verify tables, the tuner's progress lines and its
result table. It reads the typed results (`LevelMetrics`, `Summary`, `VerifyResult`, `TrialOutcome`) and nothing
else."""

import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from servetune.engine.args import to_argv
from servetune.measure.benchrun import BenchHooks
from servetune.measure.slo import LATENCIES, NO_SLO, Slos, headline_latencies, latency
from servetune.study.outcome import headline_level
from servetune.trial.hooks import Hooks
from servetune.workload import RateUnit

if TYPE_CHECKING:
    from servetune.loadgen import RequestRecord
    from servetune.measure.benchrun import BenchRun
    from servetune.measure.metrics import LevelMetrics
    from servetune.study.outcome import TrialOutcome
    from servetune.study.results import Summary, SummaryEntry
    from servetune.verify import ClientResult, VerifyResult

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 and C1 controls but tab: a newline included


def printable(text: str) -> str:
    """`text` with each control character written as its escape (`\\n`, `\\x1b`): what a path, a model's name or
    a server's answer holds is shown, never acted on by the terminal, and every printed line is one line."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


class _Console(Console):
    """Rich's console, printing every text (a line, a table's cells and title) through `printable`."""

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(printable(text), **kwargs)


console = _Console(stderr=True)


def say(*lines: str) -> None:
    """Lines as they are (no markup, no highlighting)."""
    for line in lines:
        console.print(escape(line), highlight=False)


def warn(text: str) -> None:
    console.print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False)


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


class BenchProgress(BenchHooks):
    """`servetune bench`'s bars and lines."""

    def note(self, text: str) -> None:
        say(text)

    def warn(self, text: str) -> None:
        warn(text)

    @contextmanager
    def starting(self, command: str) -> Iterator[None]:
        console.print(f"launching: {command}")
        with progress_bar() as bar:
            bar.add_task("starting vLLM", total=None)
            yield

    @contextmanager
    def sending(self, total: int) -> Iterator[Callable[["RequestRecord"], None]]:
        with progress_bar(auto_refresh=False) as bar:
            yield count_records(bar, bar.add_task("requests", total=total))


def bench_table(title: str, metrics: "LevelMetrics", server: dict | None) -> Table:
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
    from servetune.measure.metrics import LATE_MS, SCHEDULE_LAG_BOUND_MS

    return (f"[bold yellow]warning:[/] the client fell behind its schedule: p99 schedule lag "
            f"{metrics.p99_schedule_lag_ms:.0f} ms > {SCHEDULE_LAG_BOUND_MS:g} ms, {metrics.late_requests} "
            f"requests sent more than {LATE_MS:g} ms late; these numbers measure the client, not the server "
            f"(servetune's event loop takes real-time priority where allowed: run it as root or with "
            f"CAP_SYS_NICE, or give it a CPU of its own)")


def show_bench(run: "BenchRun") -> None:
    """A bench run's table, and a warning when its client fell behind."""
    if run.metrics is None:
        return
    console.print(bench_table(f"servetune bench: {run.model}", run.metrics, run.server))
    if run.metrics.client_lagging:
        console.print(lagging_warning(run.metrics), highlight=False, soft_wrap=True)


class TuneProgress(Hooks):
    """Rich bars for the tuner: one over trials, one over the requests of the current load level. The bar is
    made with auto_refresh=False and redrawn from the load generator's thread (`count_records`), so no Rich
    thread competes with the real-time event loop during a level."""

    # Hooks.record, replaced by count_records' own function: one call less per request on the event loop's thread
    record: Callable[["RequestRecord"], None]  # type: ignore[assignment]

    def __init__(self, bar: Progress, budget: int, levels: bool = True, rate_unit: RateUnit = RateUnit.REQUESTS_PER_S,
                 slo: Slos = NO_SLO):
        self.bar, self.unit = bar, rate_unit  # a level's rate: req/s, or a trace's speed-up factor
        self.latencies = headline_latencies(slo)  # a trial's line shows their p99s
        self.trials = bar.add_task("trials", total=budget)
        self.level = bar.add_task("level", total=1, visible=False)
        self.record = count_records(bar, self.level)
        self.levels = levels  # one trial at a time: its load levels are shown too
        self.running: list[int] = []

    def _running(self) -> None:
        names = ", ".join(map(str, self.running))
        self.bar.update(self.trials, description=f"trial{'s' if len(self.running) > 1 else ''} {names}")

    def trial_started(self, number: int, config: dict, why: str) -> None:
        self.bar.start()
        self.running.append(number)
        self._running()
        if self.levels:
            self.bar.update(self.level, description="starting vLLM", total=None, completed=0, visible=True)
        console.print(f"trial {number} ({why}): {' '.join(to_argv(config)) or '(vLLM defaults)'}", highlight=False)

    def trial_skipped(self, number: int, config: dict, reason: str) -> None:
        console.print(f"  skipped {' '.join(to_argv(config))}: {reason}", highlight=False)

    def trial_finished(self, number: int, out: "TrialOutcome") -> None:
        self.running.remove(number)
        self._running()
        self.bar.advance(self.trials)
        console.print(f"  trial {number}: {out.describe()}{self._p99s(out)}", highlight=False)

    def _p99s(self, out: "TrialOutcome") -> str:
        """The p99s of the latencies the SLOs bound at the trial's headline level ("" where none finished)."""
        level = headline_level(out.levels)
        if level is None:
            return ""
        at = "at full load" if math.isinf(level.rate) else f"at {level.rate:.2f} {self.unit}"
        return f"; p99 {', '.join(f'{lat.label} {lat.p99(level.metrics):.1f}' for lat in self.latencies)} ms {at}"

    def trial_lost(self, number: int, reason: str) -> None:
        self.running.remove(number)
        self._running()
        console.print(f"  trial {number} lost ({reason}); its config runs again", highlight=False)

    def confirm_started(self, number: int, config: dict, rates: list[float]) -> None:
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

    def level_started(self, name: str, rate: float, n: int) -> None:
        self.bar.update(self.level, description=f"{name} @ {rate:.2f} {self.unit}", total=n, completed=0)
        self.bar.refresh()

    def note(self, text: str) -> None:
        console.print(text, highlight=False)


def show_answer(summary: "Summary", out: Path) -> None:
    """A tune's answer: its numbers in a table, each row's config in full below it, the answer in a sentence, then the
    command to run. Configs, command and paths are printed each on one line (`whole`): a terminal wraps them where
    it must, a log file keeps them whole, and nothing is cut to fit a column."""
    console.print(result_table(summary))
    for name, entry in _answer_rows(summary):
        whole(f"{name} (trial {entry.trial}): {' '.join(to_argv(entry.config)) or '(vLLM defaults)'}")
    say(summary.answer)
    if summary.limit_line:
        say(summary.limit_line)
    whole(f"report: {out / 'report.html'}")
    if summary.best is not None:
        whole(f"run it: {summary.best_command}")
        whole(f"outputs: {out}/ (state: {summary.state})")
    if summary.time is not None:
        say(f"time: {summary.time}")


def whole(text: str) -> None:
    """A line that must stay whole (a command, a config, a path): never wrapped or cut by the console."""
    console.print(escape(text), highlight=False, soft_wrap=True)


def result_table(summary: "Summary") -> Table:
    """The numbers of vLLM's defaults and of the best config (their configs are printed below it: `show_answer`)."""
    table = Table(title=f"servetune tune: {summary.objective} under {summary.slos}")
    latencies = headline_latencies(summary.slos)
    table.add_column("", no_wrap=True)  # the row's name: "best (trial 2)"
    for col in (f"goodput rate ({summary.rate_unit})", "throughput (req/s)", *(lat.p99_label for lat in latencies)):
        table.add_column(col)
    held = {"default": summary.default_rate, "best": summary.recommended_rate}
    for name, m in _answer_rows(summary):
        table.add_row(f"{name} (trial {m.trial})", _goodput(m.goodput_rate, held[name]),
                      _measured(m.request_throughput, ".2f"),
                      *(_measured(m.slo_p99.get(lat.slo), ".1f") for lat in latencies))
    return table


def _answer_rows(summary: "Summary") -> "list[tuple[str, SummaryEntry]]":
    """The answer's rows: vLLM's defaults, then the best config, each where there is one."""
    return [(name, entry) for name, entry in (("default", summary.default), ("best", summary.best)) if entry]


def _goodput(own: float | None, decided: float | None) -> str:
    """A row's goodput cell: its own search's rate, or the higher rate the head-to-head showed it holds."""
    if decided and own is not None and decided > own:
        return f"{decided:.2f} (head-to-head; its search: {own:.2f})"
    return _measured(own, ".2f")


def _measured(value: float | None, spec: str) -> str:
    """A table cell: the value, or "-" where it was never measured."""
    return "-" if value is None else format(value, spec)


_VERIFY_COUNTS = [("completed / failed", "{0.completed} / {0.failed}"),
                  ("prompt tokens", "{0.total_input_tokens:,}"),
                  ("output tokens", "{0.total_output_tokens:,}"),
                  ("request throughput (req/s)", "{0.request_throughput:.2f}"),
                  ("output throughput (tok/s)", "{0.output_throughput:.1f}")]
_STATS = ("mean", "p50", "p90", "p99")


def verify_table(result: "VerifyResult") -> Group:
    """Both clients side by side, each beside the server's view of its run; the SLOs against each client's p99 and
    the server's; then per SLO which client the server bears out, and servetune's statistical test."""
    lines = [f"{name}: {says}" for name, says in result.server_says.items()]
    assert result.servetune is not None  # a finished run's: servetune's client runs first (verify)
    lines += [f"{check.name}: servetune's test {check.test.decision} ({check.test.over} of {check.test.counted} "
              f"{latency(check.name).counts} over)" for check in result.servetune.slo if check.test]
    return Group(_clients_table(result), *([_slo_table(result)] if result.slo else []),
                 *(Text(line) for line in lines))


def _verify_columns(table: Table) -> Table:
    for column in ("", "servetune", "server", "vllm bench", "server"):
        table.add_column(column, justify="right" if column else "left")
    return table


def _clients_table(result: "VerifyResult") -> Table:
    """metric | servetune | server | vllm bench | server: each client's numbers, and the server's over its run."""
    table = _verify_columns(Table(
        title=f"servetune verify: {result.workload.num_requests} requests at {result.workload.request_rate:g} "
              "req/s, each client",
        caption="vllm bench: vllm bench serve; server: vLLM's own histograms (/metrics) over the run of the client "
                "left of it: exact means, quantiles linear inside a bucket (only as fine as vLLM's buckets)"))
    clients = (result.servetune, result.vllm)
    for label, fmt in _VERIFY_COUNTS:
        table.add_row(label, *(cell for client in clients for cell in (
            fmt.format(client.metrics) if client else "-",
            _server_count(client) if label.startswith("completed") else "")))
    for lat in LATENCIES:
        key = lat.label.lower()
        for stat in _STATS:
            table.add_row(f"{lat.label} {stat} (ms)", *(cell for client in clients for cell in (
                _ms(getattr(client.metrics, f"{stat}_{key}_ms")) if client else "-", _server_ms(client, key, stat))))
    for stat in ("mean", "p99"):
        table.add_row(f"queued {stat} (ms)", *(cell for client in clients
                                                 for cell in ("-", _server_ms(client, "queue", stat))))
    return table


def _slo_table(result: "VerifyResult") -> Table:
    """SLO | servetune | server | vllm bench | server: each client's p99 and verdict, the server's p99 range."""
    table = _verify_columns(Table(title="SLOs: p99 (ms) and verdict; the server's p99 over each run"))
    theirs = {check.name: check for check in result.vllm.slo} if result.vllm else {}
    assert result.servetune is not None  # a finished run's (verify_table)
    for ours in result.servetune.slo:
        cells = [cell for check in (ours, theirs.get(ours.name)) for cell in (
            (f"{_ms(check.p99_ms)} {_verdict(check.passed)}", check.server_p99.span() if check.server_p99 else "-")
            if check else ("-", "-"))]
        table.add_row(f"{ours.name} <= {ours.bound_ms:g}", *cells)
    return table


def _ms(value: float | None) -> str:
    """A latency cell: 1 decimal under 100 ms, whole ms above; "-" where there is none."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _server_count(client: "ClientResult | None") -> str:
    """The requests the server finished over a client's run (its E2EL histogram's count)."""
    seen = client.server.get("e2el") if client and client.server else None
    return f"{seen.histogram.count}" if seen else "-"


def _server_ms(client: "ClientResult | None", key: str, stat: str) -> str:
    """The server's mean, or its quantile's estimate, of latency `key` over a client's run."""
    seen = client.server.get(key) if client and client.server else None
    if seen is None:
        return "-"
    if stat == "mean":
        return _ms(seen.mean_ms)
    quantile = getattr(seen, stat)
    return _ms(quantile.estimate_ms if quantile else None)


def _verdict(passed: bool) -> str:
    return "[green]pass[/]" if passed else "[bold red]fail[/]"

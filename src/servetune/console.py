"""What the CLI prints, on stderr: progress bars, the bench and verify tables, the tuner's progress lines and its
result table. It reads the typed results (`LevelMetrics`, `Summary`, `VerifyResult`, `TrialOutcome`) and nothing
else."""

import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from servetune.engine.args import to_argv
from servetune.measure.benchrun import BenchHooks
from servetune.measure.slo import LATENCIES, REQUESTS_PER_S, headline_latencies, latency
from servetune.study.outcome import headline_level
from servetune.trial.hooks import Hooks

if TYPE_CHECKING:
    from servetune.loadgen import RequestRecord
    from servetune.measure.benchrun import BenchRun
    from servetune.measure.metrics import LevelMetrics
    from servetune.study.outcome import TrialOutcome
    from servetune.study.results import Summary
    from servetune.verify import VerifyResult

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

    def __init__(self, bar: Progress, budget: int, levels: bool = True, rate_unit: str = REQUESTS_PER_S,
                 slo: Mapping[str, float] | None = None):
        self.bar, self.unit = bar, rate_unit  # a level's rate: req/s, or a trace's speed-up factor
        self.latencies = headline_latencies(slo or {})  # a trial's line shows their p99s
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


def result_table(summary: "Summary") -> Table:
    table = Table(title=f"servetune tune: {summary.objective} under {summary.slo or 'no SLO'}")
    latencies = headline_latencies(summary.slo)
    for col in ("", f"goodput rate ({summary.rate_unit})", "throughput (req/s)",
                *(lat.p99_label for lat in latencies), "config"):
        table.add_column(col)
    held = (summary.default_rate, summary.recommended_rate)
    for (name, m), rate in zip((("default", summary.default), ("best", summary.best)), held):
        if m is None:
            continue
        table.add_row(f"{name} (trial {m.trial})", _goodput(m.goodput_rate, rate),
                      _measured(m.request_throughput, ".2f"),
                      *(_measured(m.slo_p99.get(lat.slo), ".1f") for lat in latencies),
                      " ".join(to_argv(m.config)) or "-")
    return table


def _goodput(own: float | None, decided: float | None) -> str:
    """A row's goodput cell: its own search's rate, or the higher rate the head-to-head showed it holds."""
    if decided and own is not None and decided > own:
        return f"{decided:.2f} (head-to-head; its search: {own:.2f})"
    return _measured(own, ".2f")


def _measured(value: float | None, spec: str) -> str:
    """A table cell: the value, or "-" where it was never measured."""
    return "-" if value is None else format(value, spec)


_VERIFY_ROWS = [("completed / failed", "{0.completed} / {0.failed}"),
                ("prompt / output tokens", "{0.total_input_tokens:,} / {0.total_output_tokens:,}"),
                ("request throughput (req/s)", "{0.request_throughput:.2f}"),
                ("output throughput (tok/s)", "{0.output_throughput:.1f}"),
                *((f"{t.label} mean / p99 (ms)", f"{{0.{t.mean_field}:.2f}} / {{0.{t.p99_field}:.2f}}")
                  for t in LATENCIES)]


def verify_table(result: "VerifyResult") -> Table:
    """Both clients side by side (metric | servetune | vllm bench serve | SLO | verdict), then a row per SLO."""
    table = Table(title=f"servetune verify: {result.workload.num_requests} requests at "
                        f"{result.workload.request_rate:g} req/s, each client",
                  caption="verdict: each client's point p99 of its N completed requests (ITL: of their gaps) "
                          "against the SLO; for servetune's client also the tuner's statistical test of the "
                          "fraction over the bound (pass, fail or undecided; a TTFT, TPOT or E2EL p99 cannot pass on "
                          "fewer than 299 requests after the level fills up)")
    for column in ("metric", "servetune", "vllm bench serve", "SLO", "verdict"):
        table.add_column(column, justify="right" if column in ("servetune", "vllm bench serve") else "left")
    ours, theirs = result.servetune, result.vllm
    for label, fmt in _VERIFY_ROWS:
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

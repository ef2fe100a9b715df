"""`servetune report` on synthetic studies shaped like `servetune tune` writes them."""

import csv
import html as html_text
import io
import json
import math
import re
import shlex

import optuna
import pytest
import yaml
from rich.console import Console

from servetune.console import result_table
from servetune.report import write_report
from servetune.report.charts import pareto_front
from servetune.study.outcome import SCHEMA_VERSION, TrialOutcome
from servetune.study.record import StudyRecord
from servetune.study.results import Results
from servetune.study.storage import STUDY_NAME, StudyError
from support import outcomes
from support.studies import KNOBS, OOM, failed, make_study, ran, tuned_study


def test_a_pick_below_the_models_context_says_what_it_refuses_in_best_yaml_and_the_report(tmp_path):
    params = {"max_num_batched_tokens": 4096, "max_num_seqs": 256, "enable_prefix_caching": True,
              "gpu_memory_utilization": 0.9}
    whole = params | {"enable_chunked_prefill": False, "max_model_len": 2320}
    why = "without chunked prefill vLLM needs max-num-batched-tokens >= max-model-len"
    storage = make_study(tmp_path / "study.db", [("default", {}, ran({}, 18, 16, 180)),
                                                 ("search", params, ran(whole, 30, 17, 140))],
                         more_attrs={1: {"model_len_reason": why}}, meta={"vllm_version": "0.32.0"})
    page = write_report(storage, tmp_path / "report")
    out = page.parent
    comment = (f"max-model-len 2320 (the model's context is 8192; tightened because {why}): requests over 2320 "
               "tokens (prompt + max_tokens), or prompts over 37120 characters, will be refused (vLLM 0.32.0 cuts "
               "the reply short instead where the prompt alone fits)")
    best_yaml = (out / "best.yaml").read_text()
    assert best_yaml.splitlines()[0] == f"# {comment}"
    assert yaml.safe_load(best_yaml)["max-model-len"] == 2320  # still a config vllm serve reads
    assert f"# {comment}\nexec vllm serve" in (out / "best_command.sh").read_text()
    html = html_text.unescape(page.read_text())
    assert f"Headroom:</b> {comment}." in html and f"# {comment}" in html  # near the command, and in best.yaml
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headroom"] == {"max_model_len": 2320, "context": 8192, "reason": why, "comment": comment}


def test_report_shows_every_trial_and_why_the_best_wins(tmp_path):
    page = write_report(tuned_study(tmp_path / "study.db"), tmp_path / "report")
    html = page.read_text()
    out = page.parent
    for number in (0, 1, 2, 3, 4, 6, 7, 9):
        assert f'id="trial-{number}"' in html
    assert OOM in html and "without chunked prefill" in html and "same config as trial 4" in html
    assert 'class="best" id="trial-4"' in html and 'class=" default" id="trial-0"' in html
    assert "Trial #4 beats vLLM&#39;s defaults" in html and "beyond measured resolution" in html
    shown = html_text.unescape(re.search(r'<pre id="best-command">(.*?)</pre>', html, re.S).group(1))
    assert shown.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct \\\n  --max-num-batched-tokens 8192 \\\n")
    assert "gpu-memory-utilization: 0.95" in html  # best.yaml
    for chart in ("pareto", "load", "effects", "importance"):
        assert (out / f"{chart}.png").stat().st_size > 10_000
        assert f'id="{chart}-chart" src="data:image/png;base64,' in html
    assert "http://" not in html and "https://" not in html  # works offline
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["trial"] == 4 and summary["best_beats_default"]
    assert summary["headroom"] is None and 'id="headroom"' not in html  # the model's own context: nothing refused
    assert (out / "best.yaml").read_text().startswith("model: ")
    assert shlex.split(shown.replace("\\\n", "")) == shlex.split(summary["best_command"])  # one flag a line
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert [t["trial"] for t in trials] == list(range(10))
    assert trials[0]["outcome"]["levels"][0]["rate"] == "inf" and trials[5]["state"] == "PRUNED"
    with open(out / "levels.csv") as f:
        levels = list(csv.DictReader(f))
    assert len(levels) == sum(len(t.get("outcome", {}).get("levels", [])) for t in trials)
    assert levels[0]["rate"] == "inf" and {"p99_tpot_ms", "server_num_preemptions"} <= set(levels[0])


def test_report_of_a_study_whose_only_trial_failed(tmp_path):
    storage = make_study(tmp_path / "study.db", [("default", {}, failed({}, "oom", OOM))])
    html = write_report(storage, tmp_path / "report").read_text()
    assert "No config has a measured rate yet" in html and OOM in html and 'id="trial-0"' in html
    assert "nothing to plot" in html and "needs at least 4 completed searched trials" in html
    assert not (tmp_path / "report" / "pareto.png").exists()


def test_report_of_a_throughput_study(tmp_path):
    page = write_report(tuned_study(tmp_path / "study.db", "throughput"), tmp_path / "report")
    html = page.read_text()
    assert "throughput (req/s)" in html and 'class="best" id="trial-4"' in html
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["objective"] == "throughput" and summary["gain"] == pytest.approx(30 / 18 - 1)


def test_a_gain_within_the_resolution_keeps_the_defaults(tmp_path):
    close = dict(zip(KNOBS, (8192, 256, True, 0.9)))
    storage = make_study(tmp_path / "study.db", [("default", {}, ran({}, 18, 16, 180)),
                                                 ("search", close, ran(dict(close), 18.3, 16, 180))])
    html = write_report(storage, tmp_path / "report").read_text()
    assert "the highest, trial #1, measured" in html and "Keep vLLM&#39;s defaults" in html
    assert 'class="best default" id="trial-0"' in html and "not beyond measured resolution" in html


def test_pareto_front_keeps_the_configs_nothing_beats():
    points = [outcomes.row(n, value=v, slo_p99={"ttft_p99_ms": lat}) for n, v, lat in
              [(0, 5, 100), (1, 7, 120), (2, 6, 150), (3, 9, 300), (4, 9, 400), (5, 4, 90)]]
    assert [p.trial for p in pareto_front(points, "ttft_p99_ms")] == [5, 0, 1, 3]


def test_report_needs_a_servetune_study(tmp_path):
    with pytest.raises(StudyError, match="no servetune study"):
        write_report(f"sqlite:///{tmp_path / 'empty.db'}", tmp_path / "report")
    assert not (tmp_path / "empty.db").exists()


def test_an_outcome_stored_before_the_schema_version_reads_and_stays_as_stored():
    old = failed({}, "oom", OOM).stored()
    del old["schema_version"]
    old["failure"] = {"kind": "oom", "reason": OOM, "log_path": "/out/trials/0003/server.log"}
    kept = json.loads(json.dumps(old))
    read = TrialOutcome.read(old)
    assert read.failure.log == "server.log" and read.schema_version == SCHEMA_VERSION  # migrated on read
    assert old == kept


def test_a_version_1_level_reads_with_the_verdict_its_p99s_gave():
    from support.outcomes import level, ok

    stored = ok(levels=[level(rate=2.0), level(rate=3.0, passed=False, reasons=["tpot_p99_ms 30.0 > 25"])]).stored()
    stored["schema_version"] = 1
    for lv in stored["levels"]:
        del lv["verdict"], lv["tests"], lv["stopped"]
    read = TrialOutcome.read(stored)
    assert [(lv.verdict, lv.passed, lv.tests) for lv in read.levels] == [("pass", True, []), ("fail", False, [])]


def test_a_trace_studys_rates_are_speed_ups_in_the_report_and_the_head_to_head(tmp_path):
    from servetune.study.record import StudyRecord
    from servetune.study.results import Results
    from servetune.tuner.confirm import decide

    trace = {"trace": {"path": "trace.csv"}, "request_rate": 1.0}
    params = dict(zip(KNOBS, (8192, 256, True, 0.9)))
    storage = make_study(tmp_path / "study.db", [("default", {}, ran({}, 18, 16, 180)),
                                                 ("search", params, ran(dict(params), 30, 17, 140))],
                         meta={"workload": trace})
    record = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage))
    default, pick = Results(record).rows
    defaults_fail = outcomes.level("confirm", pick.goodput_rate, verdict="fail",
                                   reasons=["tpot_p99_ms: 9 of 60 requests over 40 ms"])
    record.write_confirmation(decide(pick, default, defaults_fail, None, "x trace speed"))
    html = html_text.unescape(write_report(storage, tmp_path / "report").read_text())
    assert f"the defaults fail at {pick.goodput_rate:.2f} x trace speed (tpot_p99_ms: 9 of 60" in html
    assert "goodput<small>x trace speed</small>" in html and "goodput (x trace speed within SLOs)" in html
    assert "req/s;" not in html and "req/s within" not in html


def test_defaults_that_hold_the_picks_rate_head_to_head_show_that_rate_in_the_clis_table(tmp_path):
    from servetune.study.record import StudyRecord
    from servetune.study.results import Results
    from servetune.tuner.confirm import decide

    params = dict(zip(KNOBS, (4096, 128, True, 0.95)))
    storage = make_study(tmp_path / "study.db", [("default", {}, ran({}, 18, 16, 180)),
                                                 ("search", params, ran(dict(params), 30, 17, 140))])
    record = StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage))
    default, pick = Results(record).rows
    record.write_confirmation(decide(pick, default, outcomes.level("confirm", pick.goodput_rate), None))
    console = Console(file=io.StringIO(), width=200)
    console.print(result_table(Results(record).summary))
    rows = [line for line in console.file.getvalue().splitlines() if "(trial 0)" in line]
    held = f"{pick.goodput_rate:.2f} (head-to-head; its search: {default.goodput_rate:.2f})"
    assert [row.split("│")[1:3] for row in rows] == [[" default (trial 0) ", f" {held:<20} "],
                                                    [" best (trial 0)    ", f" {held:<20} "]], rows

def test_a_multi_turn_studys_report_shows_its_turns(tmp_path):
    from servetune.measure.metrics import TurnMetrics

    def turn(tokens: float, p99_ttft: float) -> TurnMetrics:
        return TurnMetrics(completed=20, mean_input_tokens=tokens, mean_ttft_ms=p99_ttft / 2, median_ttft_ms=0,
                           std_ttft_ms=0, p99_ttft_ms=p99_ttft, mean_tpot_ms=3.0, median_tpot_ms=0, std_tpot_ms=0,
                           p99_tpot_ms=4.5)

    per_turn = {"1": turn(256, 40.0), "2": turn(550, 61.0), "3": turn(845, 93.0)}
    levels = [outcomes.level("capacity", math.inf, per_turn=per_turn),
              outcomes.level("search", 4.0, per_turn=per_turn), outcomes.level("search", 5.0, passed=False)]
    storage = make_study(tmp_path / "study.db", [("default", {}, outcomes.ok(
        levels=levels, goodput_rate=4.0, goodput_bracket=(4.0, 5.0), request_throughput=9.0))])
    html = write_report(storage, tmp_path / "report").read_text()
    section = html[html.index('<section id="per-turn">'):html.index('<section id="effects">')]
    assert "recommended</b> (trial #0), at 4.00 req/s" in section and "the defaults" not in section
    assert [row.count("<tr>") for row in section.split("<tbody>")[1:]] == [3]
    assert '<td class="n">845</td>' in section and "46.5 · 93.0" in section
    single = make_study(tmp_path / "single.db", [("default", {}, ran({}, 18, 16, 180))])
    assert 'id="per-turn"' not in write_report(single, tmp_path / "single").read_text()


def test_a_study_with_ttft_itl_and_e2el_slos_headlines_their_p99s(tmp_path):
    slo = {"ttft_p99_ms": 1500.0, "itl_p99_ms": 35.0, "e2el_p99_ms": 9000.0}

    def measured(rate: float, itl: float) -> TrialOutcome:
        """Capacity, a pass at `rate` (p99 ITL `itl`) and a fail above it."""
        p99s = {"completed": 300, "p99_ttft_ms": 900.0, "p99_tpot_ms": 25.0, "p99_itl_ms": itl, "p99_e2el_ms": 7000.0}
        over = p99s | {"p99_ttft_ms": 4000.0, "p99_itl_ms": 80.0, "p99_e2el_ms": 20000.0}
        levels = [outcomes.level("capacity", math.inf, passed=False, request_throughput=2 * rate, **over),
                  outcomes.level("search", rate, **p99s), outcomes.level("search", 1.5 * rate, passed=False, **over)]
        return outcomes.ok(levels=levels, goodput_rate=rate, goodput_bracket=(rate, 1.5 * rate),
                           request_throughput=2 * rate, p99_ttft_ms=900.0, p99_tpot_ms=25.0)

    storage = make_study(tmp_path / "study.db", [("default", {}, measured(4.0, 31.0)),
                                                 ("search", {"max_num_seqs": 64}, measured(8.0, 33.5))], slo=slo)
    page = write_report(storage, tmp_path / "report")
    html = page.read_text()
    summary = json.loads((page.parent / "summary.json").read_text())
    assert summary["best"]["slo_p99"] == {"ttft_p99_ms": 900.0, "itl_p99_ms": 33.5, "e2el_p99_ms": 7000.0}
    assert summary["default"]["slo_p99"]["itl_p99_ms"] == 31.0
    assert "p99 TTFT · ITL · E2EL" in html and "900.0 · 33.5 · 7,000.0" in html  # the headline card
    assert all(f"<th>p99 {label}<small>ms</small></th>" in html for label in ("TTFT", "ITL", "E2EL"))
    assert "<th>p99 TPOT" not in html
    with open(page.parent / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["itl_p99_ms"] for row in rows] == ["31.0", "33.5"] and "p99_tpot_ms" in rows[0]
    console = Console(file=io.StringIO(), width=200)
    console.print(result_table(Results(StudyRecord(optuna.load_study(study_name=STUDY_NAME, storage=storage))).summary))
    header = console.file.getvalue().splitlines()[2]
    assert all(f"p99 {label} (ms)" in header for label in ("TTFT", "ITL", "E2EL")) and "TPOT" not in header

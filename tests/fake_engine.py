"""Test double: `servetune.engine.Engine` backed by tests/fake_server.py, for the commands that launch vLLM.

    python tests/fake_engine.py verify ARGS...   (`servetune verify ARGS...` with this engine)
    python tests/fake_engine.py tune ARGS...     (`servetune tune ARGS...`: its trials launch this engine; the fake
                                                  server has no /tokenize, so each trial finds it is not vLLM)

The server streams one token per FAKE_TOKEN_DELAY_MS ms (default 20). With FAKE_VLLM_CLIENT_S=S, vLLM's client
(`verify.run_vllm_bench`) is a stand-in that waits S seconds and fails: a run stopped while vLLM's client runs. With
FAKE_VLLM_CLIENT_LATE_MS=L it is a stand-in that sends the dataset with servetune's client and reports every TTFT and
E2EL L ms longer than measured: a client whose clock starts early.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from servetune.engine import InstalledVllm, StartupFacts

FAKE_SERVER = Path(__file__).with_name("fake_server.py")


class FakeEngine:
    """The parts of `Engine` a command uses, with a fake server for vLLM."""

    def __init__(self, model: str, engine_args: dict, log_path: Path, **_: object):
        self.model, self.engine_args, self.log_path = model, dict(engine_args), Path(log_path)
        self.python, self.vllm, self.secret = sys.executable, InstalledVllm("0.0-fake", "cpu", {}), "fake-secret"
        self.host, self.port, self.proc = "127.0.0.1", None, None

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.address

    def start(self) -> StartupFacts:
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms",
                                      os.environ.get("FAKE_TOKEN_DELAY_MS", "20")], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[1])
        self.log_path.write_text(f"fake server on port {self.port}\n")
        return StartupFacts()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _vllm_client_stand_in(argv, log, result, timeout_s, env=None) -> str:
    time.sleep(float(os.environ["FAKE_VLLM_CLIENT_S"]))
    return "the stand-in for vLLM's client does not measure"


def _late_vllm_client(argv, log, result, timeout_s, env=None) -> None:
    """The dataset at the rate `argv` asks, sent by servetune's client, its JSON written with every TTFT and E2EL
    statistic FAKE_VLLM_CLIENT_LATE_MS later."""
    from servetune.loadgen import LoadShape, Target, run_load_sync
    from servetune.measure.metrics import summarize
    from servetune.workload import RequestSpec

    option = {name: value for name, value in zip(argv, argv[1:]) if name.startswith("--") and value[:2] != "--"}
    specs = [RequestSpec(prompt=line["prompt"], prompt_len=len(line["prompt"].split()),
                         output_len=line["output_tokens"])
             for line in map(json.loads, Path(option["--dataset-path"]).read_text().splitlines())]
    load = run_load_sync(Target(option["--base-url"], option["--model"], "completions"), specs,
                         LoadShape(request_rate=float(option["--request-rate"])))
    late = float(os.environ["FAKE_VLLM_CLIENT_LATE_MS"])
    metrics = summarize(load).model_dump()
    metrics |= {key: value + late for key, value in metrics.items()
                if key.split("_")[1:] in (["ttft", "ms"], ["e2el", "ms"])}
    Path(result).write_text(json.dumps(metrics))


if __name__ == "__main__":
    from servetune import cli, verify
    from servetune.trial import run

    verify.Engine = run.Engine = FakeEngine
    if "FAKE_VLLM_CLIENT_S" in os.environ:
        verify.run_vllm_bench = _vllm_client_stand_in
    if "FAKE_VLLM_CLIENT_LATE_MS" in os.environ:
        verify.run_vllm_bench = _late_vllm_client
    sys.argv = ["servetune", *sys.argv[1:]]
    cli.main()

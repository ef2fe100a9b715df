"""A disk that fills during a trial, in the test's own process: one line, exit 1, and summary.json says what was
kept. On a real full disk, and in the processes a user runs: tests/integration/test_full_disk.py."""

import errno
import json
import os

import pytest
import typer

from servetune import cli
from support.standins import StandIn, options


class RecordsUnwritable(StandIn):
    """The second trial's level records cannot be written: the disk filled during it (its work raises ENOSPC, as
    `LoadResult.save` does)."""

    def submit(self, job):
        if len(self.jobs) == 1:
            self.jobs.append(job)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(job.out_dir / "level-01.records.jsonl"))
        return super().submit(job)


def test_a_disk_that_fills_during_a_trial_is_one_line_and_summary_json_says_what_was_kept(tiny_model, tmp_path,
                                                                                         monkeypatch, capsys):
    """No OSError traceback, exit 1; summary.json is no longer `running`: it says the tune stopped
    there, and keeps the trial measured before."""
    out = tmp_path / "out"
    monkeypatch.setattr("servetune.tuner.loop.make_executor", lambda *args: RecordsUnwritable({0: 5.0}, out))
    monkeypatch.setattr("servetune.interrupt.handle_signals", lambda: None)  # pytest keeps its own
    with pytest.raises(typer.Exit) as stop:
        cli._tune_guarded(options(tiny_model, out, None, budget=2))
    assert stop.value.exit_code == 1
    err = capsys.readouterr().err
    records = out / "trials" / "0001" / "level-01.records.jsonl"
    assert " ".join(err[err.index("error: "):].split()) == (
        f"error: the tune stopped: cannot write {records} (No space left on device); the study keeps what was "
        f"measured before, and the outputs in {out} say so (state: interrupted): free space there and continue with "
        "the same command and --resume")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted" and summary["trials"] == 1
    assert summary["not_done"] == [f"stopped: cannot write {records} (No space left on device): the trial running "
                                   "then runs again on --resume"]

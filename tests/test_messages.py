"""The messages and leftovers a user sees: a refused resume shows where the values differ, however long
they are; a refused --resume on a missing --out leaves no directory; a second bench on one --json is refused and
the first's files are kept."""

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from servetune.study.storage import SHOWN, StudyError, _shown
from servetune.tuner.loop import tune
from test_study_lock import options
from test_tune_stops import StandIn

ROOT = Path(__file__).resolve().parents[1]
SERVETUNE = [sys.executable, "-m", "servetune"]
FAKE_SERVER = Path(__file__).with_name("fake_server.py")


def test_a_refused_resume_shows_only_what_differs_and_where_long_values_differ():
    assert _shown({"requests": 600, "confidence": 0.95, "max_levels": 6}, {"requests": 400, "confidence": 0.95,
                                                                          "max_levels": 6}) == \
        ('{"requests": 600}', '{"requests": 400}')
    assert _shown({}, {"max_num_seqs": 8}) == ("{}", '{"max_num_seqs": 8}')
    old = [{f"knob_{i:02d}": i for i in range(40)}]
    new = [{**old[0], "knob_39": -1}]
    was, now = _shown(old, new)
    assert was.startswith("...") and now.startswith("...") and len(was) <= SHOWN + 3
    assert was.endswith('"knob_39": 39}]') and now.endswith('"knob_39": -1}]')


def test_a_resume_with_another_level_option_names_it_with_both_values(tiny_model, tmp_path):
    out = tmp_path / "out"
    tune(options(tiny_model, out, None), executor=StandIn({0: 5.0}, out))
    changed = options(tiny_model, out, None, resume=True)
    changed = replace(changed, levels=replace(changed.levels, requests=40))
    with pytest.raises(StudyError, match=r"^--resume: the level options \(.*\) differs from the study's: it was "
                                         r'\{"requests": 20\}, now \{"requests": 40\}; resume with'):
        tune(changed, executor=StandIn({1: 6.0}, out))


def test_a_resume_with_another_level_window_names_it_and_the_default_one_resumes(tiny_model, tmp_path):
    """A study stores its level window only where it is not the default, as every study made before --level-window
    did not store one: those resume, and a resume with another window is refused by name."""
    out = tmp_path / "out"
    tune(options(tiny_model, out, None), executor=StandIn({0: 5.0}, out))
    longer = options(tiny_model, out, None, resume=True)
    longer = replace(longer, levels=replace(longer.levels, window_s=60.0))
    with pytest.raises(StudyError, match=r"differs from the study's: it was \{\}, now \{\"window_s\": 60.0\}"):
        tune(longer, executor=StandIn({1: 6.0}, out))
    assert tune(options(tiny_model, out, None, resume=True), executor=StandIn({1: 6.0}, out)).trials >= 1


@pytest.mark.integration
def test_a_refused_resume_on_a_missing_out_leaves_no_directory(tiny_model, tmp_path):
    for study in ([], ["--study", f"sqlite:///{tmp_path / 'none.db'}"]):
        proc = subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml",
                               "--out", str(tmp_path / "new" / "out"), "--slo", "tpot_p99_ms=50", "--resume", *study],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and "--resume: no study to resume in sqlite:///" in proc.stderr, proc.stderr
        assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_second_bench_on_one_json_is_refused_and_the_first_is_kept(tiny_model, tmp_path):
    fake = subprocess.Popen([sys.executable, str(FAKE_SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{fake.stdout.readline().split()[1]}"
        argv = [*SERVETUNE, "bench", "--base-url", url, "--model", "fake", "--tokenizer", str(tiny_model),
                "--input-len", "8", "--output-len", "4", "--num-prompts", "4", "--json", str(tmp_path / "o.json")]
        first = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        kept = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
        second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        with urllib.request.urlopen(url + "/stats") as stats:
            sent = json.load(stats)["requests"]
    finally:
        fake.kill()
        fake.wait()
    assert second.returncode == 2 and second.stderr.strip() == (
        f"error: --json: {tmp_path / 'o.json'} exists (an earlier run's): move it away, or give another --json")
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()} == kept
    assert sorted(kept) == ["o.json", "o.records.jsonl"] and sent == 4


@pytest.mark.integration
def test_control_characters_in_what_is_printed_are_escaped(tmp_path):
    """An --out holding ESC and a newline reached the terminal as they were (a colour change, a
    line of the user's making); every printed line shows them escaped, one line each."""
    odd = tmp_path / "a\x1b[31mred\nerror: fake\x9b"
    wide = os.environ | {"COLUMNS": "500"}  # no line wrapped at the console's width
    made = subprocess.run([*SERVETUNE, "model", "tiny", "--out", str(odd)], capture_output=True, text=True,
                          timeout=120, env=wide)
    refused = subprocess.run([*SERVETUNE, "report", "--out", str(odd)], capture_output=True, text=True, timeout=120,
                             env=wide)
    shown = str(tmp_path) + "/a\\x1b[31mred\\nerror: fake\\x9b"
    assert made.returncode == 0 and made.stderr.splitlines() == [f"wrote the tiny model to {shown}"]
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [f"error: no servetune study in sqlite:///{shown}/study.db: no such file"]

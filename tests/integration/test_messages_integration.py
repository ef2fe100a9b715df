"""The messages and leftovers a user sees in the CLI: a refused --resume on a missing --out leaves no directory; a
second bench on one --json is refused and the first's files are kept; control characters in what is printed are
escaped."""

import hashlib
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from support.paths import FAKE_SERVER, ROOT

SERVETUNE = [sys.executable, "-m", "servetune"]


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

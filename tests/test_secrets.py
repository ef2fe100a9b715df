"""No password printed or written: a storage URL is shown as SQLAlchemy's URL renders it with the
password hidden, whatever the password holds (`/`, `@`, `:`, spaces, %-escapes), and the password is hidden in any
other text too; a tune of a real PostgreSQL study with such a password leaves it in no output, and the CLI prints it
nowhere."""

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from conftest import postgres_server
from servetune.options import TuneArgs, UsageError
from servetune.redact import redact, remember, shown_url
from servetune.study.storage import StudyLock
from servetune.tuner.loop import tune
from test_study_lock import options
from test_tune_stops import StandIn

ROOT = Path(__file__).resolve().parents[1]
SERVETUNE = [sys.executable, "-m", "servetune"]
PASSWORDS = ["se/cret2", "a:b:c9", "two words", "p@ss/w:rd %41x", "100%sure"]


def forms(password: str) -> set[str]:
    """The ways a password may be written: as it is and %-escaped (a space as %20 or +)."""
    return {password, quote(password, safe=""), quote_plus(password)}


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_storage_url_is_shown_without_its_password_whatever_it_holds(password):
    url = f"postgresql+psycopg://alice:{quote(password, safe='')}@db.example:5432/tunes?sslmode=require"
    assert shown_url(url) == "postgresql+psycopg://alice:***@db.example:5432/tunes?sslmode=require"
    text = redact(f"cannot open {url}; connect(password={quote(password, safe='')}) as alice with '{password}'")
    assert not any(form in text for form in forms(password)), text
    assert "alice" in text and "db.example:5432/tunes" in text


def test_a_password_typed_unescaped_is_hidden_and_refused_where_sqlalchemy_would_misread_it(tmp_path):
    for url, shown in (("postgresql://alice:se/cret2@h/db", "postgresql://alice:***@h/db"),
                       ("postgresql://alice:two words@h/db", "postgresql://alice:***@h/db"),
                       ("postgresql://alice:p@ss3@h/db", "postgresql://alice:***@h/db")):
        assert shown_url(url) == shown
        assert redact(f"error at {url}: done") == f"error at {shown}: done"
    args = TuneArgs(model="m", workload=ROOT / "examples" / "chat.yaml", out=tmp_path, slo=["tpot_p99_ms=50"],
                    study="postgresql://alice:p@ss3@h/db")
    with pytest.raises(UsageError, match=r"^--study: the password holds an unescaped '@' .*: write it as %40$"):
        args.resolve()


def test_a_remembered_password_is_hidden_in_any_text_but_a_short_one_only_in_urls():
    remember("postgresql://bob:tree%20frog@h/db")
    assert redact("auth failed for bob with tree frog, tree%20frog or tree+frog") == \
        "auth failed for bob with ***, *** or ***"
    remember("postgresql://bob:ab@h/db")
    assert redact("a cab at postgresql://bob:ab@h/db") == "a cab at postgresql://bob:***@h/db"


@pytest.mark.integration
def test_a_tune_of_a_postgresql_study_leaves_its_password_nowhere(tiny_model, tmp_path, capfd):
    password = PASSWORDS[3]
    with postgres_server(password) as (storage, _):
        out = tmp_path / "out"
        summary = tune(options(tiny_model, out, storage), executor=StandIn({0: 5.0}, out))
        assert summary.trials == 1 and (out / "best_command.sh").exists() and (out / "report.html").exists()
        cli = [subprocess.run([*SERVETUNE, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
               for args in (["report", "--study", storage, "--out", str(tmp_path / "report")],
                            ["tune", "--model", str(tiny_model), "--workload", "examples/chat.yaml", "--out",
                             str(tmp_path / "again"), "--slo", "tpot_p99_ms=50", "--study", storage])]
        held = StudyLock(tmp_path, storage).acquire()
        try:
            cli.append(subprocess.run([*SERVETUNE, "tune", "--model", str(tiny_model), "--workload",
                                       "examples/chat.yaml", "--out", str(tmp_path / "again"), "--slo",
                                       "tpot_p99_ms=25", "--study", storage, "--resume"],
                                      capture_output=True, text=True, timeout=300, cwd=ROOT))
        finally:
            held.release()
    report, exists, locked = cli
    assert report.returncode == 0 and (tmp_path / "report" / "summary.json").exists(), report.stderr
    assert exists.returncode == 2 and "postgresql+psycopg://postgres:***@127.0.0.1:" in exists.stderr
    assert "already holds a study" in exists.stderr
    assert locked.returncode == 2 and "is being tuned by pid" in locked.stderr, locked.stderr
    printed = capfd.readouterr()
    texts = [printed.out, printed.err, *(p.stdout + p.stderr for p in cli)]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert len(texts) > 10
    for form in forms(password) | forms("p@ss"):
        assert not any(form in text for text in texts), form

"""No password printed or written: a storage URL is shown as SQLAlchemy's URL renders it with the
password hidden, whatever the password holds (`/`, `@`, `:`, spaces, %-escapes), and the password is hidden in any
other text too. A tune of a real PostgreSQL study, and the CLI: tests/integration/test_secrets_integration.py."""

from urllib.parse import quote

import pytest

from servetune.options import TuneArgs, UsageError
from servetune.redact import redact, remember, shown_url
from support.passwords import PASSWORDS, forms
from support.paths import ROOT


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

"""Credentials out of what servetune prints and writes. A storage URL (`--study`) is shown as SQLAlchemy's URL renders
it with the password hidden, and its password is remembered, as typed and as decoded, so that `redact` hides it in any
text, also where no URL pattern finds it (a password holding a space). A `scheme://user:password@host` and a
`password=...` in other text are hidden by pattern."""

import re
from urllib.parse import quote, quote_plus, unquote

import sqlalchemy

HIDDEN = "***"
# a password is up to the last '@' of the word: an unescaped '@' in it ends it no sooner
_URL_PASSWORD = re.compile(r"([A-Za-z][\w+.-]*://[^:/\s@]*):(\S*)@")
_KEY_PASSWORD = re.compile(r"\b(password|passwd)=[^\s&'\"]+", re.IGNORECASE)
# the password of a URL as typed: after the user's ':' and up to the last '@' (an unescaped '@' or a space in it)
_TYPED_PASSWORD = re.compile(r"^[A-Za-z][\w+.-]*://[^:/@]*:(.*)@", re.DOTALL)
MIN_REMEMBERED = 4  # a shorter password is hidden in URLs only: replacing it everywhere would garble the text
_remembered: set[str] = set()


def remember(url: str) -> None:
    """Hide `url`'s password from now on wherever `redact` meets it: as typed, %-decoded and %-encoded."""
    typed = _TYPED_PASSWORD.match(url)
    if typed is None or not typed.group(1):
        return
    password = typed.group(1)
    forms = {password, unquote(password), quote(unquote(password), safe=""), quote_plus(unquote(password))}
    _remembered.update(form for form in forms if len(form) >= MIN_REMEMBERED)


def shown_url(url: str) -> str:
    """`url` as servetune prints it: SQLAlchemy's rendering with the password as *** (remembered for `redact`)."""
    remember(url)
    try:
        rendered = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        rendered = url
    return redact(rendered)


def redact(text: str) -> str:
    """`text` with every remembered password, the password of every `scheme://user:password@host` and every
    `password=...` as ***."""
    for secret in sorted(_remembered, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return _KEY_PASSWORD.sub(rf"\1={HIDDEN}", _URL_PASSWORD.sub(rf"\1:{HIDDEN}@", text))


def misread_password(url: str) -> bool:
    """Whether SQLAlchemy would read part of `url`'s password as its host: an unescaped '@' in the password."""
    try:
        host = sqlalchemy.engine.make_url(url).host
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return False
    return host is not None and "@" in host

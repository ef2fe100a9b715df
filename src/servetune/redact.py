"""Credentials out of what servetune prints: a `--study` URL's password, a DSN's password=..."""

import re

_URL_PASSWORD = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")
_KEY_PASSWORD = re.compile(r"\b(password|passwd)=[^\s&'\"]+", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` and every `password=...` as ***."""
    return _KEY_PASSWORD.sub(r"\1=***", _URL_PASSWORD.sub(r"\1:***@", text))

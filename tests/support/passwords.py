"""Passwords as awkward as a user may choose, and the ways each may be written."""

from urllib.parse import quote, quote_plus

PASSWORDS = ["se/cret2", "a:b:c9", "two words", "p@ss/w:rd %41x", "100%sure"]


def forms(password: str) -> set[str]:
    """The ways a password may be written: as it is and %-escaped (a space as %20 or +)."""
    return {password, quote(password, safe=""), quote_plus(password)}

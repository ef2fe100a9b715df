"""The errors a user can cause: bad input, a missing server or study. The CLI prints one line and exits 2 for
any `ServetuneError`; anything else is a bug and keeps its traceback."""


class ServetuneError(Exception):
    """Bad input or set-up, said in one line naming the problem."""


class StudyError(ServetuneError):
    """A study cannot be created, resumed or read as asked."""

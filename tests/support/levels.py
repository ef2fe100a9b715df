"""A level's statistical test fed its records, as a level feeds it."""

from servetune.loadgen.records import RequestRecord
from servetune.measure.verdict import Decision, LevelTest


def fed(test: LevelTest, records: list[RequestRecord]) -> LevelTest:
    """`test` fed these records as they finish, until it decides, then finished (the level's end)."""
    for r in sorted(records, key=lambda r: r.end_ns):
        if test.add(r) != Decision.UNDECIDED:
            break
    test.finish()
    return test

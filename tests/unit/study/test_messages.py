"""The messages a user sees: a refused resume shows where the values differ, however long they are, and names the
level option or window that differs. In the CLI: tests/integration/test_messages_integration.py."""

from dataclasses import replace

import pytest

from servetune.study.storage import SHOWN, StudyError, _shown
from servetune.tuner.loop import tune
from support.standins import StandIn, options


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

"""Memory and time within bounds whatever the input: YAML whose aliases expand without end, or a file that never
ends, is refused before anything is built from it (workload files, --reference-config, --engine-arg config files).
In the CLI and against tests/fake_server.py's faults: tests/integration/test_bounds_integration.py."""

from pathlib import Path

import pytest

from servetune import safeyaml
from servetune.options import TuneArgs, UsageError
from servetune.workload import WorkloadError, load_workload
from support.bombs import BOMB
from support.paths import EXAMPLES


def test_yaml_aliases_that_expand_without_end_are_refused_and_ordinary_ones_read():
    for text in (BOMB, "&a [*a]"):  # a bomb, and an alias that names itself
        with pytest.raises(safeyaml.TooBig, match="aliases expand to more than 1,000,000 values"):
            safeyaml.load(text)
    assert safeyaml.load("base: &b {type: fixed, value: 8}\nother: *b\n") == {
        "base": {"type": "fixed", "value": 8}, "other": {"type": "fixed", "value": 8}}


def test_a_workload_file_that_is_a_bomb_or_never_ends_is_refused(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(WorkloadError, match=r"bomb\.yaml: its aliases expand to more than 1,000,000 values"):
        load_workload(tmp_path / "bomb.yaml")
    with pytest.raises(WorkloadError, match="/dev/zero: more than 1 MiB: not a workload or config file"):
        load_workload(Path("/dev/zero"))


@pytest.mark.parametrize("config", ["bomb", "/dev/zero"])
def test_a_reference_config_that_is_a_bomb_or_never_ends_is_refused_naming_the_option(tiny_model, tmp_path, config):
    path = tmp_path / "bomb.yaml" if config == "bomb" else Path(config)
    if config == "bomb":
        path.write_text(BOMB)
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], reference_config=[path])
    with pytest.raises(UsageError, match=rf"^--reference-config: {path}: cannot read the config: (its aliases|more)"):
        args.resolve()
    assert not (tmp_path / "out").exists()


def test_an_engine_arg_config_file_is_read_within_bounds_and_its_values_checked_before_launch(tiny_model, tmp_path):
    """`--engine-arg config=FILE` is read as --reference-config is (bombs and endless files
    refused, values checked), its flags launched as engine args under those given beside it; vLLM never reads it."""
    (tmp_path / "bomb.yaml").write_text(BOMB)
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], engine_arg=[f"config={tmp_path / 'bomb.yaml'}"])
    with pytest.raises(UsageError, match=rf"^--engine-arg: {tmp_path / 'bomb.yaml'}: cannot read the config: "
                                         "its aliases expand to more than 1,000,000 values"):
        args.resolve()
    (tmp_path / "c.yaml").write_text("max-num-seqs: 8\nmax-model-len: 2k\nenforce-eager: true\n")
    given = args.model_copy(update={"engine_arg": [f"config={tmp_path / 'c.yaml'}", "max-num-seqs=16"]}).resolve()
    assert given.engine_args == {"max_num_seqs": 16, "max_model_len": 2000, "enforce_eager": True}
    (tmp_path / "c.yaml").write_text("max-num-seqs: abc\n")
    with pytest.raises(UsageError, match=rf"^--engine-arg: {tmp_path / 'c.yaml'}: max-num-seqs=abc: not a "
                                         "whole number above 0"):
        args.model_copy(update={"engine_arg": [f"config={tmp_path / 'c.yaml'}"]}).resolve()
    assert not (tmp_path / "out").exists()

"""What a fresh Python imports: the modules a user runs import neither vLLM nor pytest; under `make test-fast`
(tests/no_vllm/) no Python the tests start can import vLLM; under `make test-unit` (tests/conftest.py) a test that
starts a process must be marked `integration`."""

import os
import subprocess
import sys

import pytest

from support.paths import SRC, TESTS


@pytest.mark.integration
def test_the_cli_tuner_and_report_import_neither_vllm_nor_pytest():
    """vLLM is probed in a subprocess (`servetune.engine`), never imported by the tool itself; pytest is for
    `servetune.testing` only."""
    code = ("import sys, servetune.cli, servetune.tuner, servetune.report; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'pytest', '_pytest')))")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.integration
def test_servetune_no_vllm_hides_vllm_from_every_python_the_tests_start(tmp_path):
    """What `make test-fast` runs under (tests/no_vllm/): with SERVETUNE_NO_VLLM=1 and that directory on
    PYTHONPATH, a child Python cannot import vLLM (a probe, a server, a worker would fail) and logs the attempt."""
    log = tmp_path / "attempts.log"
    no_vllm = TESTS / "no_vllm"
    env = os.environ | {"SERVETUNE_NO_VLLM": "1", "SERVETUNE_NO_VLLM_LOG": str(log),
                        "PYTHONPATH": os.pathsep.join([str(no_vllm), str(SRC)])}
    code = "try:\n    import vllm.platforms\nexcept ImportError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.strip() == "No module named 'vllm' (SERVETUNE_NO_VLLM=1 hides vLLM)", out.stderr[-2000:]
    assert log.read_text().split()[1] == "vllm"


@pytest.mark.integration
def test_under_make_test_unit_a_test_that_starts_a_process_must_be_marked_integration(tmp_path):
    """What `make test-unit` runs under (SERVETUNE_UNIT=1, tests/conftest.py): a test that starts a process fails
    unless it is marked `integration`; one that starts none passes."""
    (tmp_path / "test_x.py").write_text(
        "import multiprocessing, subprocess, pytest\n"
        "def test_unmarked():\n    subprocess.run(['true'])\n"
        "def test_unmarked_worker():\n    multiprocessing.Process(target=print).start()\n"
        "@pytest.mark.integration\ndef test_marked():\n    subprocess.run(['true'])\n"
        "def test_in_process():\n    pass\n")
    env = os.environ | {"SERVETUNE_UNIT": "1", "PYTHONPATH": str(TESTS)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          "-rf", str(tmp_path / "test_x.py")], capture_output=True, text=True, timeout=120, env=env)
    failed = sorted(line.split("::")[1].split()[0] for line in out.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == ["test_unmarked", "test_unmarked_worker"], out.stdout[-3000:]
    assert "mark this test `integration`" in out.stdout and "2 failed, 2 passed" in out.stdout

"""What the installed vLLM accepts (`engine.installed.probe`): a CPU build's answer kept for the next servetune,
asked again when the install or the VLLM_* environment changes; a GPU's asked every time."""

import json
import os
import stat
import tempfile

import pytest

from servetune.device import DeviceKind
from servetune.engine.installed import probe

pytestmark = pytest.mark.integration  # starts processes


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """An interpreter stand-in with a vLLM package of its own, which counts the probes it answers; its answer's
    device type is the file `device`. Lock and cache directories under the test's own TMPDIR."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "device").write_text("cpu")
    answer = {"vllm_version": "0.0.1", "flags": {"max_num_seqs": {"kind": "int"}}}
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ]; then echo {package / '__init__.py'}; exit 0; fi
echo probed >> {tmp_path / 'probes'}
printf '%s' '{json.dumps(answer)[:-1]}, "device_type": "'"$(cat {tmp_path / 'device'})"'"}}'
""")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    probe.cache_clear()
    yield python, package, tmp_path
    probe.cache_clear()


def probes(tmp_path) -> int:
    return len((tmp_path / "probes").read_text().splitlines()) if (tmp_path / "probes").exists() else 0


def test_a_cpu_builds_answer_is_kept_until_its_install_or_environment_changes(fake_python, monkeypatch):
    python, package, tmp_path = fake_python
    first = probe(str(python))
    probe.cache_clear()
    assert probe(str(python)) == first and first.on_cpu and probes(tmp_path) == 1
    assert first.kind is DeviceKind.CPU
    probe.cache_clear()
    (package / "__init__.py").write_text("# upgraded\n")
    assert probe(str(python)) == first and probes(tmp_path) == 2
    probe.cache_clear()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    probe(str(python))
    assert probes(tmp_path) == 3
    kept = tmp_path / "shared" / f"servetune-{os.geteuid()}" / "probes"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700 and len(list(kept.iterdir())) == 3


def test_a_gpus_answer_is_asked_every_time(fake_python):
    python, _, tmp_path = fake_python
    (tmp_path / "device").write_text("cuda")
    assert not probe(str(python)).on_cpu and probe(str(python)).kind is DeviceKind.GPU  # vLLM's "cuda": a GPU
    probe.cache_clear()
    probe(str(python))
    assert probes(tmp_path) == 2

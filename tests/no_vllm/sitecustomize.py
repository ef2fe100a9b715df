"""vLLM hidden, as if it were not installed: with SERVETUNE_NO_VLLM=1, `import vllm` (and any `vllm.*`) raises
ModuleNotFoundError. tests/conftest.py runs this file in the test process and puts this directory first on
PYTHONPATH, so every Python the tests start (a probe, a server, a worker, a `servetune` command) imports it as
its sitecustomize too. `make test-fast` (`pytest -m "not vllm"`) runs that way: a test that needs vLLM without
the `vllm` marker fails there. With SERVETUNE_NO_VLLM_LOG=FILE each refused import is also appended to FILE
(process id, module, command line), to find an attempt that a test caught and passed anyway."""

import importlib.abc
import os
import sys


class NoVllm(importlib.abc.MetaPathFinder):
    """A finder ahead of all others that refuses vLLM's modules."""

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            if os.environ.get("SERVETUNE_NO_VLLM_LOG"):
                with open(os.environ["SERVETUNE_NO_VLLM_LOG"], "a") as log:
                    log.write(f"{os.getpid()} {name} {' '.join(sys.argv)}\n")
            raise ModuleNotFoundError(f"No module named {name!r} (SERVETUNE_NO_VLLM=1 hides vLLM)", name=name)
        return None


if os.environ.get("SERVETUNE_NO_VLLM") == "1" and not any(type(f).__name__ == "NoVllm" for f in sys.meta_path):
    sys.meta_path.insert(0, NoVllm())

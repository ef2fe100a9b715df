"""Test support shipped with servetune, for code that extends it: `servetune.testing.executors` is the contract
suite every executor passes (Inline, LocalPool, RayCluster, and yours), as Optuna ships its storage tests
(`optuna.testing.pytest_storages`).

The suites import pytest, which servetune does not depend on: nothing outside `servetune.testing` imports
this package, so `import servetune` and the CLI never need pytest."""

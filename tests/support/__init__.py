"""What tests of more than one file share: paths, synthetic outcomes and studies, stand-in executors and jobs,
workloads and command lines. Importable as `support` wherever pytest runs a test (tests/conftest.py puts tests/ on
sys.path), and from the Pythons a test starts once tests/ is on their path."""

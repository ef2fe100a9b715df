"""Where the tests find the checkout's files, wherever under tests/ a test module lies."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"
FIXTURES = TESTS / "fixtures"
FAKE_SERVER = TESTS / "fake_server.py"
FAKE_ENGINE = TESTS / "fake_engine.py"

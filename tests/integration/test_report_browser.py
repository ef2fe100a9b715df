"""The report in headless Chromium: it loads offline without console errors and shows its charts.

Drives Debian's /usr/bin/chromium through the DevTools protocol over `--remote-debugging-pipe` (JSON messages
ended by NUL on fds 3 and 4), so it needs no driver or websocket client. With SERVETUNE_SAVE_SCREENSHOT set,
the screenshot also goes to docs/report-screenshot.png.
"""

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import time
from pathlib import Path

import pytest

from servetune.engine.memory import ModelShape
from servetune.report import write_report
from servetune.report.data import load_study
from support.paths import ROOT
from support.shapes import LLAMA3_8B
from support.studies import tuned_study

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]
DOCS_SCREENSHOT = ROOT / "docs" / "report-screenshot.png"
WIDTH = 1280

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (Debian chromium)")]

PAGE_STATE = """(() => {
  const chart = document.getElementById("pareto-chart");
  return {
    pareto: chart ? {complete: chart.complete, naturalWidth: chart.naturalWidth,
                     shownWidth: chart.getBoundingClientRect().width} : null,
    brokenImages: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length,
    images: document.images.length,
    trialRows: document.querySelectorAll("tbody tr[id^='trial-']").length,
    tableFits: [...document.querySelectorAll(".scroll")].every(e => e.scrollWidth <= e.clientWidth),
    recommended: document.querySelector("tr.best td")?.textContent.trim(),
    height: document.documentElement.scrollHeight,
  };
})()"""


class DevTools:
    """A Chromium started with --remote-debugging-pipe, and the protocol's request/response over it."""

    def __init__(self, profile: Path, log: Path):
        to_browser, from_browser = os.pipe(), os.pipe()
        # the browser's ends moved above 9 first, so that dup2 onto 3 and 4 cannot overwrite one another
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser[0], from_browser[1])]
        self.pid = os.posix_spawn(CHROMIUM, [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                  os.environ, file_actions=[
                                      (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
                                      (os.POSIX_SPAWN_OPEN, 2, str(log), os.O_WRONLY | os.O_CREAT, 0o644),
                                      (os.POSIX_SPAWN_DUP2, theirs[0], 3), (os.POSIX_SPAWN_DUP2, theirs[1], 4)])
        for fd in (*theirs, to_browser[0], from_browser[1]):
            os.close(fd)
        self.out, self.inp = to_browser[1], from_browser[0]
        self.buffer, self.next_id, self.events = b"", 0, []

    def send(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._receive(deadline))
        return next(e for e in self.events if e.get("method") == method)

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            if not select.select([self.inp], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError, EOFError):
            pass
        for _ in range(100):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.out)
        os.close(self.inp)


def problems(events: list[dict]) -> list[str]:
    """Console errors and warnings, uncaught exceptions, failed loads, and requests that left the machine."""
    found = []
    for e in events:
        params = e.get("params", {})
        if e.get("method") == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning", "assert"):
            found.append(f"console.{params['type']}: {[a.get('value') for a in params['args']]}")
        elif e.get("method") == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif e.get("method") == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
            found.append(f"log: {params['entry']['text']}")
        elif e.get("method") == "Network.loadingFailed":
            found.append(f"load failed: {params.get('errorText')}")
        elif e.get("method") == "Network.requestWillBeSent" and not params["request"]["url"].startswith(
                ("file:", "data:")):
            found.append(f"network request: {params['request']['url']}")
    return found


# A GPU study's meta: the roofline's section, its column and a cost column in the trials table.
ON_H200 = {"device_name": "NVIDIA H200", "work": {"output": 256.0, "prefill": 1280.0, "context": 1408.0},
           "model_shape": vars(ModelShape.from_config(LLAMA3_8B, param_count=8_030_261_248)), "gpu_hour_price": 3.5}


@pytest.mark.parametrize("meta", [{}, ON_H200], ids=["cpu", "h200"])
def test_report_renders_in_chromium(tmp_path, meta):
    storage = tuned_study(tmp_path / "study.db")
    record = load_study(storage)
    record.study.set_user_attr("meta", record.stored_meta | meta)
    page = write_report(storage, tmp_path / "report")
    browser = DevTools(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session)
        browser.send("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=900, deviceScaleFactor=1,
                     mobile=False)
        browser.send("Page.navigate", session, url=page.as_uri())
        browser.wait_for("Page.loadEventFired")
        state = browser.send("Runtime.evaluate", session, expression=PAGE_STATE, returnByValue=True)["result"]["value"]
        browser.send("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=state["height"],
                     deviceScaleFactor=1, mobile=False)
        shot = browser.send("Page.captureScreenshot", session, format="png")["data"]
    finally:
        browser.close()
    screenshot = tmp_path / "report-screenshot.png"
    screenshot.write_bytes(base64.b64decode(shot))
    if os.environ.get("SERVETUNE_SAVE_SCREENSHOT") and not meta:
        shutil.copyfile(screenshot, DOCS_SCREENSHOT)

    assert problems(browser.events) == []
    assert state["pareto"]["complete"] and state["pareto"]["naturalWidth"] > 1000
    assert state["pareto"]["shownWidth"] > 800
    assert state["images"] == 5 and state["brokenImages"] == 0
    assert state["trialRows"] == 8 and state["recommended"] == "4"
    assert state["tableFits"], f"the trials table needs a horizontal scrollbar at {WIDTH} px"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 50_000

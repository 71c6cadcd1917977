"""Headless Chromium driven over the Chrome DevTools protocol on a pipe
(``--remote-debugging-pipe``: commands on fd 3, replies on fd 4, NUL-separated JSON), so the
browser tests need no Python package and no downloaded browser; `open_report` loads a report at
1400 px and returns what the page shows."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI") == "true"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome"))
                 if p), None)


def need_chromium() -> str:
    """The browser, or a skip (a failure under CI=true, where .ci/run installs it)."""
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("chromium is not installed (CI=true): .ci/run must `apt-get install -y chromium`")
        pytest.skip("chromium not on PATH (apt-get install -y chromium; CI=true makes this a failure)")
    return CHROMIUM


class CDP:
    """A minimal DevTools-protocol client over chromium's debugging pipe."""

    def __init__(self, chromium: str, profile: str):
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # move the child's ends above 9 so the shell's 3<& / 4>& cannot clobber them
        to_r, from_w = (self._high(fd) for fd in (to_r, from_w))
        args = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
            "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank",
        ]
        # bash maps our pipe ends onto fds 3 (commands in) and 4 (replies out)
        script = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", script, chromium, *args], pass_fds=(to_r, from_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    @staticmethod
    def _high(fd: int) -> int:
        hi = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return hi

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == self._id:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.extend(self._read(deadline))

    def _read(self, deadline: float) -> list[dict]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply from chromium")
        ready, _, _ = select.select([self._from_r], [], [], left)
        if not ready:
            raise TimeoutError("no reply from chromium")
        chunk = os.read(self._from_r, 1 << 20)
        if not chunk:
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
            raise RuntimeError(f"chromium closed the pipe: {err}")
        self._buf += chunk
        *msgs, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in msgs if m]

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self._to_w)
        os.close(self._from_r)


def open_report(index: Path, out_png: Path) -> dict[str, Any]:
    profile = tempfile.mkdtemp(prefix="canzona-chromium-")
    cdp = CDP(CHROMIUM, profile)  # type: ignore[arg-type]
    try:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.send(f"{domain}.enable", session=sid)
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        cdp.send("Page.navigate", {"url": index.resolve().as_uri()}, session=sid)
        cdp.wait_event("Page.loadEventFired", timeout=60)
        check = """(() => {
            const imgs = Array.from(document.images).map(i => ({id: i.id, complete: i.complete, w: i.naturalWidth}));
            const h = document.querySelector('table#headline');
            // every table against the box it sits in: wider means a sideways scroll that hides columns
            const tables = Array.from(document.querySelectorAll('table')).map(t => ({
                id: t.id, width: t.scrollWidth, box: t.parentElement.clientWidth,
                boxScroll: t.parentElement.scrollWidth}));
            const note = document.getElementById('invocations-note');
            const verdicts = Array.from(document.querySelectorAll('#verdicts li')).map(li => li.textContent.trim());
            return {imgs, headline: !!h, headlineRows: h ? h.tBodies[0].rows.length : 0, verdicts,
                    sweepConfig: !!document.getElementById('sweep-config'),
                    tables, viewport: window.innerWidth, note: note ? note.textContent : null,
                    title: document.title, height: document.documentElement.scrollHeight};
        })()"""
        # images are data URIs: decoded by load, but give decode a moment on slow machines
        for _ in range(20):
            info = cdp.send("Runtime.evaluate", {"expression": check, "returnByValue": True}, session=sid)["result"]["value"]
            if all(i["complete"] and i["w"] > 0 for i in info["imgs"]):
                break
            time.sleep(0.25)
        shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                   "clip": {"x": 0, "y": 0, "width": 1400, "height": min(info["height"], 16000), "scale": 1}},
                        session=sid, timeout=120)
        out_png.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for e in cdp.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif m == "Runtime.exceptionThrown":
                errors.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        info["errors"] = errors
        return info
    finally:
        cdp.close()
        shutil.rmtree(profile, ignore_errors=True)

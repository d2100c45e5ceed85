"""Headless Chromium for the report tests, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read protocol messages (JSON, each ended by a NUL byte)
on its file descriptor 3 and answer on 4 — what Puppeteer and Playwright use — so the tests need
no websocket client and no browser download: Debian's ``chromium`` package is enough.
:func:`find_chromium` looks for it (``$MECHKIT_CHROMIUM`` first) and, where it is missing and this
process may install packages (root, or sudo without a password), installs it with apt-get once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
WIDTH, HEIGHT = 1280, 900


def _which() -> str | None:
    override = os.environ.get("MECHKIT_CHROMIUM")
    if override:
        return shutil.which(override)  # a name on PATH or a path, if executable
    return next((p for p in map(shutil.which, NAMES) if p), None)


def find_chromium(install: bool = True) -> tuple[str | None, str]:
    """``(path, "")`` of a Chromium binary, installing Debian's ``chromium`` where it is missing and
    allowed (``MECHKIT_INSTALL_CHROMIUM=0`` forbids it); else ``(None, why)``."""
    found = _which()
    if found:
        return found, ""
    if os.environ.get("MECHKIT_CHROMIUM"):
        return None, f"MECHKIT_CHROMIUM={os.environ['MECHKIT_CHROMIUM']} is not an executable"
    if not install or os.environ.get("MECHKIT_INSTALL_CHROMIUM") == "0":
        return None, "no chromium on PATH and installing is off (apt-get install chromium, or set MECHKIT_CHROMIUM)"
    if not shutil.which("apt-get"):
        return None, "no chromium on PATH and no apt-get to install it (set MECHKIT_CHROMIUM to a Chromium binary)"
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        return None, "no chromium on PATH and no permission to install it (run: sudo apt-get install chromium)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_cmd = [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    log = ""
    for attempt in (install_cmd, [*prefix, "apt-get", "update", "-q"], install_cmd):
        done = subprocess.run(attempt, capture_output=True, text=True, env=env, timeout=600)
        log = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        if attempt is install_cmd and done.returncode == 0:
            break
    found = _which()
    return found, "" if found else f"apt-get install chromium failed: {log[0]}"


def _high(*fds: int) -> tuple[int, ...]:
    """The descriptors moved to 5 or above (close-on-exec), so the child's dup2 onto 3 and 4 clobbers neither."""
    import fcntl

    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved


class Chromium:
    """One headless browser; :meth:`open` loads a page at 1280 px and reports what the tests check."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="mechkit-chromium-")
        to_child, self._write = _high(*os.pipe())
        self._read, from_child = _high(*os.pipe())

        def fds() -> None:  # in the child: the protocol pipe on 3 (commands) and 4 (answers)
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        # Python's own descriptors are not inherited (PEP 446), so close_fds=False passes only 0-4.
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--remote-debugging-pipe", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={self.profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        # Nothing may leave the machine: requests off it are blocked, and every request is recorded, so a
        # page that tries one (a CDN script, a web font) fails the test even though it could not load it.
        self.call("Network.setBlockedURLs", session=True, urls=["http://*", "https://*", "ws://*", "wss://*", "ftp://*"])
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)

    # -- protocol ------------------------------------------------------------------------------
    def _send(self, message: dict) -> None:
        os.write(self._write, json.dumps(message).encode() + b"\0")

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: bool = False, timeout: float = 30.0, **params: Any) -> dict:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._receive(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"page script failed: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    # -- what the tests use ----------------------------------------------------------------------
    def open(self, path: Path, screenshot: Path | None = None) -> dict:
        """Load ``path``; return its width, images, console errors, requests beyond the file and the texts the
        tests look for."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        state = self.evaluate(_PROBE)
        state["console_errors"] = self._errors()
        state["external_requests"] = self.external_requests()
        self.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        state["scroll_width_open"] = self.evaluate("document.documentElement.scrollWidth")
        if screenshot is not None:
            self.evaluate("document.querySelectorAll('details').forEach(d => d.open = false)")
            self.screenshot(screenshot)
        return state

    def external_requests(self) -> list[str]:
        """URLs the page asked for beyond itself and its inline data (``file:``, ``data:``, ``about:``)."""
        urls = [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]
        return [u for u in urls if not u.startswith(("file:", "data:", "about:"))]

    def centre(self, selector: str) -> tuple[float, float]:
        """The viewport centre of the first element matching ``selector``, scrolled into view."""
        box = self.evaluate(f"""(() => {{ const el = document.querySelector({json.dumps(selector)});
            el.scrollIntoView({{block: 'center'}}); const r = el.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2]; }})()""")
        return box[0], box[1]

    def mouse(self, selector: str, click: bool = False) -> None:
        """Move the real mouse onto the element (hover), and press and release it there with ``click``."""
        x, y = self.centre(selector)
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)
        if click:
            for kind in ("mousePressed", "mouseReleased"):
                self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        """The whole page as it is now (PNG)."""
        height = self.evaluate("document.documentElement.scrollHeight")
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": WIDTH, "height": min(height, 12000), "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))

    def _errors(self) -> list[str]:
        errors = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(params["entry"].get("text", ""))
        return errors

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may be gone already
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)


_PROBE = """(() => {
  const de = document.documentElement;
  const wide = [...document.body.querySelectorAll('*')]
    .filter(el => el.getBoundingClientRect().right > window.innerWidth + 0.5 && !el.closest('.scroll'))
    .slice(0, 5).map(el => el.tagName.toLowerCase() + (el.className ? '.' + el.className : ''));
  const top = sel => { const el = document.querySelector(sel); return el ? el.getBoundingClientRect().top : null; };
  return {
    inner_width: window.innerWidth, scroll_width: de.scrollWidth, body_scroll_width: document.body.scrollWidth,
    too_wide: wide,
    images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth})),
    finding: (document.querySelector('.finding') || {}).textContent || null,
    finding_top: top('.finding'), headline_top: top('figure'), table_top: top('table'),
    title: document.title,
  };
})()"""

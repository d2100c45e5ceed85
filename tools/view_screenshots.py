"""Screenshots of the interactive views for the docs, taken in headless Chromium from real runs.

    python tools/view_screenshots.py            # runs detect and attention on the embedded model if needed

It runs (unless their reports exist already)

    mechkit detect --model llama --out mechkit-runs/docs/detect
    mechkit attention --model llama --from mechkit-runs/docs/detect --out mechkit-runs/docs/attention

opens each ``report.html`` at 1280 px with nothing allowed off the machine, and saves the headline figure
with its interactive grid (detect: the strongest induction head's pattern, open as the page opens it)
to ``docs/img/analyses/attention-detect.png`` and ``attention.png``; ``attention.json`` records the pages'
sizes, the findings and the commands. Needs Chromium (``apt-get install chromium`` or ``$MECHKIT_CHROMIUM``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.chromium drives the browser

from tests.chromium import Chromium, find_chromium  # noqa: E402

IMG = ROOT / "docs" / "img" / "analyses"
RUNS = Path("mechkit-runs") / "docs"
DETECT = f"mechkit detect --model llama --out {RUNS / 'detect'}"
ATTENTION = f"mechkit attention --model llama --from {RUNS / 'detect'} --out {RUNS / 'attention'}"

_BOX = """(() => { const el = document.querySelector('.mk-pair'); el.scrollIntoView();
  const r = el.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()"""


def _run(command: str) -> Path:
    out = ROOT / shlex.split(command)[-1]
    if not (out / "report.json").exists():
        print("$", command, flush=True)
        subprocess.run(shlex.split(command), cwd=ROOT, check=True)
    return out


def _shot(browser: Chromium, page: Path, target: Path) -> dict:
    state = browser.open(page)
    if state["console_errors"] or state["external_requests"] or state["scroll_width"] > state["inner_width"]:
        raise SystemExit(f"{page}: {state['console_errors']} {state['external_requests']} "
                         f"width {state['scroll_width']}")
    x, y, w, h = browser.evaluate(_BOX)
    shot = browser.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                        clip={"x": max(0, x - 8), "y": max(0, y - 8), "width": w + 16, "height": h + 16, "scale": 1})
    target.write_bytes(base64.b64decode(shot["data"]))
    return {"page": str(page.relative_to(ROOT)), "bytes": page.stat().st_size,
            "shown": browser.evaluate("document.querySelector('svg.mk-pattern').dataset.head")}


def main() -> None:
    binary, why = find_chromium()
    if binary is None:
        raise SystemExit(f"no Chromium: {why}")
    detect, attention = _run(DETECT), _run(ATTENTION)
    browser = Chromium(binary)
    try:
        record = {"detect": _shot(browser, detect / "report.html", IMG / "attention-detect.png"),
                  "attention": _shot(browser, attention / "report.html", IMG / "attention.png")}
    finally:
        browser.close()
    for name, out in (("detect", detect), ("attention", attention)):
        record[name]["finding"] = json.loads((out / "report.json").read_text())["finding"]
        record[name]["report_json_bytes"] = (out / "report.json").stat().st_size
    record["commands"] = [DETECT, ATTENTION, "python tools/view_screenshots.py"]
    record["date"] = dt.date.today().isoformat()
    (IMG / "attention.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(record, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()

"""Opens the desktop window (``app.main(["--desktop"])``) and drives it from pywebview's own thread, the way a
person would: it waits for the app inside the webview, switches tabs through the webview's JavaScript bridge, and
for the closing scenarios starts a training and closes the window with Alt+F4, answering the question with a key.

    python tests/desktop_driver.py SCENARIO RESULT.json [CONFIG.yaml] [SCREENSHOT.png]

SCENARIO: "tabs" (then closes), "close-stop" (Return: OK, stop) or "close-keep" (Escape: Cancel, keep training).
What it saw goes to RESULT.json; the window's process exit status is this script's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dragon_ui.ui import app, desktop  # noqa: E402

scenario, result_path = sys.argv[1], Path(sys.argv[2])
config_path = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
screenshot = Path(sys.argv[4]) if len(sys.argv) > 4 else None
seen: dict = {"scenario": scenario}


def save() -> None:
    result_path.write_text(json.dumps(seen), encoding="utf-8")


def until(window, script: str, seconds: float = 120.0):
    """Evaluate ``script`` in the page until it gives something truthy."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = window.evaluate_js(script)
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"the page never answered {script!r}")


def xdotool(*args: str) -> str:
    return subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=30).stdout.strip()


def window_screenshot(path: Path) -> None:
    """The window as the screen shows it, title bar and frame included (the window manager's frame extents)."""
    from PIL import ImageGrab

    window_id = xdotool("search", "--name", f"^{desktop.TITLE}$").split()[0]
    info = subprocess.run(["xwininfo", "-id", window_id], capture_output=True, text=True).stdout
    field = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in info.splitlines())}
    x, y = int(field["Absolute upper-left X"]), int(field["Absolute upper-left Y"])
    width, height = int(field["Width"]), int(field["Height"])
    extents = subprocess.run(["xprop", "-id", window_id, "_NET_FRAME_EXTENTS"], capture_output=True, text=True).stdout
    left, right, top, bottom = (int(v) for v in extents.split("=")[1].split(",")) if "=" in extents else (0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    ImageGrab.grab(bbox=(x - left, y - top, x + width + right, y + height + bottom), xdisplay=None).save(path)


def drive(window) -> None:
    try:
        seen["title"] = until(window, "document.querySelector('#tab-model-button') && document.title")
        window.evaluate_js("document.querySelector('#tab-model-button').click()")
        seen["model_tab"] = bool(until(window, "(() => { const d = document.querySelector('#model-hardware-device');"
                                                " return d && d.offsetParent !== null; })()"))
        window.evaluate_js("document.querySelector('#tab-data-button').click()")
        if screenshot is not None:
            # the Data tab's preview of the bundled example
            until(window, "((document.querySelector('#data-counts') || {}).innerText || '').includes('rows')")
            time.sleep(2)
            window_screenshot(screenshot)
        if scenario == "tabs":
            window.destroy()
            return
        from dragon_ui.config import RunConfig
        from dragon_ui.engine import training

        handle = training.start(RunConfig.from_file(config_path))
        seen["run_dir"] = str(handle.run_dir)
        deadline = time.monotonic() + 180
        while (handle.run.read_status().get("step") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        save()
        xdotool("search", "--sync", "--name", f"^{desktop.TITLE}$", "windowactivate", "--sync", "key", "alt+F4")
        time.sleep(3)  # the question's dialog takes the focus
        xdotool("key", "Return" if scenario == "close-stop" else "Escape")
    except BaseException as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
        window.destroy()
    finally:
        save()


status = app.main(["--desktop"], desktop_driver=drive)
seen["exit"] = status
save()
sys.exit(status)

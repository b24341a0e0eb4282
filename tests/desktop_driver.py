"""Opens the desktop window (``app.main(["--desktop"])``) and drives it from pywebview's own thread, the way a
person would: it waits for the app inside the webview, switches tabs through the webview's JavaScript bridge, and
for the closing scenarios starts a training and closes the window as its title bar's close button does, answering the
question with a key.

    python tests/desktop_driver.py SCENARIO RESULT.json [CONFIG.yaml] [SCREENSHOT.png]

SCENARIO: "tabs" (then closes), "close-stop" (Return: OK, stop) or "close-keep" (Escape: Cancel, keep training), or
"downloads": the YAML and the adapter zip saved through the real save dialog (clicked and typed into with xdotool;
the folder is CONFIG's argument), and an outside link, which goes to the browser; or "reattach": the window a second
start opens on the process that trains in the background (CONFIG is that run's id, which the Train tab must show).
What it saw goes to RESULT.json; the window's process exit status is this script's.
"""

from __future__ import annotations

import faulthandler
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
faulthandler.enable()  # a test that gives up on this process sends SIGABRT: every thread's stack


STARTED = time.monotonic()


def reached(phase: str) -> None:
    """When the scenario reached ``phase``, in seconds since this process started: where a slow run spent its time."""
    seen.setdefault("seconds", {})[phase] = round(time.monotonic() - STARTED, 1)
    save()


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


def window_geometry(window_id: str) -> dict[str, str]:
    """What xwininfo says of a window: "Absolute upper-left X/Y" is its client area (the page) on the screen."""
    info = subprocess.run(["xwininfo", "-id", window_id], capture_output=True, text=True).stdout
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in info.splitlines())}


def real_click(window, selector: str) -> None:
    """A mouse click at the element's centre: the window's client area on the screen plus the element's place."""
    window.evaluate_js(f"document.querySelector({selector!r}).scrollIntoView({{block: 'center'}})")
    rect = settled_place(window, selector)
    window_id = xdotool("search", "--onlyvisible", "--name", f"^{desktop.TITLE}$").split()[0]
    xdotool("windowactivate", "--sync", window_id)
    field = window_geometry(window_id)
    x = int(field["Absolute upper-left X"]) + int(rect["x"] + rect["width"] / 2)
    y = int(field["Absolute upper-left Y"]) + int(rect["y"] + rect["height"] / 2)
    xdotool("mousemove", "--sync", str(x), str(y), "click", "1")


def settled_place(window, selector: str, seconds: float = 10.0) -> dict:
    """The element's place in the page once it stops moving (a scroll, a layout still under way)."""
    script = f"JSON.stringify(document.querySelector({selector!r}).getBoundingClientRect())"
    deadline = time.monotonic() + seconds
    place = window.evaluate_js(script)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        place, before = window.evaluate_js(script), place
        if place == before:
            break
    return json.loads(place)


def save_through_the_dialog(window, selector: str, target: Path) -> bool:
    """Click ``selector`` and type ``target`` into the save dialog it opens, as a person would; whether the file
    came. A click that found no dialog is tried again (the page may still be moving things under the mouse)."""
    for attempt in range(1, 4):
        real_click(window, selector)
        deadline = time.monotonic() + 15
        while not (dialog := xdotool("search", "--onlyvisible", "--name", "^Save file$").split()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
        if dialog:
            break
        seen.setdefault("clicks_without_a_dialog", []).append(target.name)
    else:
        return False
    xdotool("windowactivate", "--sync", dialog[0])
    deadline = time.monotonic() + 15
    while xdotool("getactivewindow") != dialog[0] and time.monotonic() < deadline:  # keys go to the dialog
        time.sleep(0.1)
    xdotool("key", "ctrl+a")  # the file name field has the focus, holding the suggested name
    xdotool("type", "--delay", "20", str(target))
    xdotool("key", "Return")
    # Qt writes the file under its own name and renames it once complete: the target appears whole.
    deadline = time.monotonic() + 30
    while not (target.is_file() and target.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.3)
    return target.is_file()


def downloads(window, folder: Path) -> None:
    import webbrowser
    import zipfile

    import yaml

    window.evaluate_js("document.querySelector('#tab-model-button').click()")
    # the check, the estimate and the YAML's file come together: a valid check means the button has its file
    until(window, "((document.querySelector('#model-check') || {}).innerText || '').includes('The settings are valid')",
          240)
    until(window, "[...document.querySelectorAll('button')].some(b => b.innerText.includes('The whole configuration'))")
    window.evaluate_js("[...document.querySelectorAll('button')].find(b => b.innerText.includes('The whole "
                       "configuration')).click()")
    until(window, "(() => { const b = document.querySelector('#model-download'); return b && !b.disabled && "
                  "b.offsetParent !== null; })()")
    target = folder / "my-run.yaml"
    seen["yaml_saved"] = save_through_the_dialog(window, "#model-download", target)
    seen["yaml_model"] = yaml.safe_load(target.read_text())["model"]["id"] if seen["yaml_saved"] else None

    window.evaluate_js("document.querySelector('#tab-compare-button').click()")
    until(window, "(() => { const b = document.querySelector('#compare-zip'); return b && !b.disabled && "
                  "b.offsetParent !== null; })()")
    window.evaluate_js("document.querySelector('#compare-zip').click()")
    until(window, "!!document.querySelector('#compare-zip-file a')", 120)
    target = folder / "adapter.zip"
    seen["zip_saved"] = save_through_the_dialog(window, "#compare-zip-file a", target)
    seen["zip_files"] = sorted(zipfile.ZipFile(target).namelist()) if seen["zip_saved"] else None

    opened: list[str] = []
    webbrowser.open = lambda url, *args, **kwargs: opened.append(url) or True
    window.evaluate_js("(() => { const a = document.createElement('a'); a.href = 'https://huggingface.co/docs/trl';"
                       " a.target = '_blank'; a.id = 'outside'; a.textContent = 'TRL'; document.body.prepend(a);"
                       " a.click(); })()")
    deadline = time.monotonic() + 15
    while not opened and time.monotonic() < deadline:  # the window hands the link to the system's browser
        time.sleep(0.2)
    seen["browser_opened"] = opened
    seen["still_here"] = window.evaluate_js("location.pathname") == "/"


def window_screenshot(path: Path) -> None:
    """The window as the screen shows it, title bar and frame included (the window manager's frame extents)."""
    from PIL import ImageGrab

    window_id = xdotool("search", "--name", f"^{desktop.TITLE}$").split()[0]
    field = window_geometry(window_id)
    x, y = int(field["Absolute upper-left X"]), int(field["Absolute upper-left Y"])
    width, height = int(field["Width"]), int(field["Height"])
    extents = subprocess.run(["xprop", "-id", window_id, "_NET_FRAME_EXTENTS"], capture_output=True, text=True).stdout
    left, right, top, bottom = (int(v) for v in extents.split("=")[1].split(",")) if "=" in extents else (0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    ImageGrab.grab(bbox=(x - left, y - top, x + width + right, y + height + bottom), xdisplay=None).save(path)


def close_like_the_title_bar(window_id: int) -> None:
    """Ask the window manager to close the window (EWMH's _NET_CLOSE_WINDOW), as its close button does; it then asks
    the app (WM_DELETE_WINDOW). Not Alt+F4 typed through XTEST: the window manager's key binding does not fire while
    another client holds the keyboard, and 1 close in 6 was lost that way (the window active, no closing event)."""
    import ctypes

    class ClientMessage(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                    ("display", ctypes.c_void_p), ("window", ctypes.c_ulong), ("message_type", ctypes.c_ulong),
                    ("format", ctypes.c_int), ("data", ctypes.c_long * 5)]

    class Event(ctypes.Union):
        _fields_ = [("client", ClientMessage), ("pad", ctypes.c_long * 24)]

    x11 = ctypes.cdll.LoadLibrary("libX11.so.6")
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XInternAtom.restype = x11.XDefaultRootWindow.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XDefaultRootWindow.argtypes = x11.XFlush.argtypes = x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    x11.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    display = x11.XOpenDisplay(None)
    if not display:
        raise RuntimeError("could not open the X display to close the window")
    try:
        event = Event()
        event.client.type, event.client.window, event.client.format = 33, window_id, 32  # 33: ClientMessage
        event.client.message_type = x11.XInternAtom(display, b"_NET_CLOSE_WINDOW", 0)
        event.client.data[1] = 2  # from a user's action (a pager or a close button)
        substructure = (1 << 19) | (1 << 20)  # SubstructureNotify and SubstructureRedirect: to the window manager
        x11.XSendEvent(display, x11.XDefaultRootWindow(display), 0, substructure, ctypes.byref(event))
        x11.XFlush(display)
    finally:
        x11.XCloseDisplay(display)


def the_question(main_window: str, seconds: float = 60.0) -> str:
    """The id of the closing question's dialog once it is on the screen: the window of the app's title that is not
    the main one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        others = [found for found in xdotool("search", "--onlyvisible", "--name", f"^{desktop.TITLE}$").split()
                  if found != main_window]
        if others:
            return others[0]
        time.sleep(0.2)
    active = subprocess.run(["xdotool", "getactivewindow"], capture_output=True, text=True).stdout.strip()
    raise TimeoutError(f"the closing question never appeared (main window {main_window}, active window {active!r})")


def drive(window) -> None:
    from dragon_ui.engine import training

    try:
        seen["title"] = until(window, "document.querySelector('#tab-model-button') && document.title")
        window.evaluate_js("document.querySelector('#tab-model-button').click()")
        seen["model_tab"] = bool(until(window, "(() => { const d = document.querySelector('#model-hardware-device');"
                                                " return d && d.offsetParent !== null; })()"))
        window.evaluate_js("document.querySelector('#tab-data-button').click()")
        if screenshot is not None:
            # the Data tab's preview of the bundled example
            until(window, "((document.querySelector('#data-counts') || {}).innerText || '').includes('rows')")
            until(window, "((document.querySelector('#data-rendered') || {}).innerText || '').includes('Row 1') && "
                          "document.fonts.status === 'loaded'")
            settled_place(window, "#data-rendered")
            window_screenshot(screenshot)
        if scenario == "downloads":
            downloads(window, Path(config_path))
        if scenario == "reattach":
            seen["url"] = window.get_current_url()
            window.evaluate_js("document.querySelector('#tab-train-button').click()")
            seen["train_tab"] = until(window, f"((document.querySelector('#train-status') || {{}}).innerText || '')"
                                              f".includes({config_path!r})", 60)  # the training run's id
        if scenario in ("tabs", "downloads", "reattach"):
            window.destroy()
            return
        from dragon_ui.config import RunConfig
        from dragon_ui.engine import queue
        from dragon_ui.engine.workers import Workers
        from dragon_ui.public import LAPTOP

        reached("page")
        # In a training process of the app's, as Start does: the window's app sees it (training.active_runs).
        run = queue.submit_start(RunConfig.from_file(config_path, policy=LAPTOP), policy=LAPTOP, workers=Workers())
        seen["run_dir"] = str(run.path)
        deadline = time.monotonic() + 180
        while (run.read_status().get("step") or 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        if (run.read_status().get("step") or 0) < 1:
            raise TimeoutError(f"the run had not finished a step after 180 s: {run.read_status()}")
        reached("step 1")
        # Whether the window heard the close at all: without it, a lost key; with it, the question went missing.
        window.events.closing += lambda: reached("closing event")
        (main_window,) = xdotool("search", "--sync", "--name", f"^{desktop.TITLE}$").split()
        close_like_the_title_bar(int(main_window))
        question = the_question(main_window)  # a second window of that title: the dialog asking what to do
        reached("question")
        xdotool("windowactivate", "--sync", question, "key",
                "Return" if scenario == "close-stop" else "Escape")
    except BaseException as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
        for handle in training.active_runs():
            handle.stop()  # else closing the window asks about it, and nobody is here to answer
            handle.wait(60)
        window.destroy()
    finally:
        save()


status = app.main(["--desktop"], desktop_driver=drive)  # ends the process itself once the window has opened
seen["exit"] = status
save()
sys.exit(status)

"""Dragon GRPO Studio in a window of its own: ``python app.py --desktop`` or ``make desktop``.

The window (pywebview: WebKit on macOS, WebView2 on Windows, Qt WebEngine or GTK WebKit on Linux) shows the same
Gradio app, served by this process on 127.0.0.1 on a free port, so nothing else on the network sees it. Closing the
window while a run trains asks whether to stop it (a checkpoint is saved) or to keep training in the background;
the process then ends when its last run has finished, and ``make desktop`` (or ``make run``) shows it again
meanwhile. Where no window can be opened (no screen, no web view), one sentence says what to install and the app
opens in the browser instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Literal, NoReturn
from pathlib import Path

from .. import ASSETS_DIR
from ..system.disk import cache_dir
from ..runstore import write_json_atomic
from ..studio.backend import Studio

TITLE = "Dragon GRPO Studio"
ICON = ASSETS_DIR / "icon.png"
DEFAULT_SIZE = (1280, 900)
MIN_SIZE = (900, 600)
INSTALL = ("pip install -r requirements-desktop.txt (make desktop does it; for an installed package, "
           "pip install 'dragon-grpo-studio[desktop]')")
CLOSE_QUESTION = ("A run is still training. Stop it now? A checkpoint is saved first.\n\n"
                  "OK stops the training. Cancel keeps it training in the background after the window closes; "
                  "make desktop (or make run) shows it again.")
# What a window finds of an earlier window's process that still trains in the background (its address and pid).
SERVER_FILE = ".desktop-server.json"

Driver = Callable[[object], None]  # runs with the window once it is shown (tests and screenshots drive it)
Gui = Literal["native", "qt", "gtk"]  # the system's own web view, Qt WebEngine, or GTK's WebKit


def window_backend() -> tuple[Gui | None, str | None]:
    """(pywebview's GUI to use, None) where a window can open here, else (None, the sentence saying why)."""
    if importlib.util.find_spec("webview") is None:
        return None, f"The desktop window needs pywebview: {INSTALL}."
    if sys.platform in ("darwin", "win32"):  # the system's own web view (WebKit, WebView2)
        return "native", None
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None, "There is no screen here (neither DISPLAY nor WAYLAND_DISPLAY is set), so no window can open."
    if _qt_window_opens():
        return "qt", None
    if _gtk_webkit_present():
        return "gtk", None
    return None, (f"No web view for the window was found: {INSTALL}, and on Debian or Ubuntu also "
                  "sudo apt install libxcb-cursor0 libxkbcommon-x11-0 libegl1 (or GTK's: sudo apt install "
                  "gir1.2-webkit2-4.1 python3-gi).")


def _qt_window_opens() -> bool:
    """Whether Qt WebEngine starts on this screen, tried in a child process: a Qt missing a system library ends its
    process at once ("could not load the Qt platform plugin"), which must not be this one."""
    if importlib.util.find_spec("PyQt6") is None or importlib.util.find_spec("qtpy") is None:
        return False
    probe = "from PyQt6.QtWidgets import QApplication; from PyQt6 import QtWebEngineWidgets; QApplication([])"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _gtk_webkit_present() -> bool:
    try:
        import gi

        gi.require_version("WebKit2", "4.1")
        return True
    except (ImportError, ValueError):
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(studio: Studio, serve: Callable[..., str], driver: Driver | None = None) -> int:
    """Open the window on this process's app (served by ``serve(host, port)``, which returns its address), or on
    the app of an earlier window's process that still trains; the browser where no window can open. Once a window
    has opened, the process ends here (_leave) when it is done."""
    gui, why_not = window_backend()
    if gui is None:
        print(f"{why_not} Opening Dragon GRPO Studio in your browser instead.", file=sys.stderr)
        serve("127.0.0.1", free_port(), inbrowser=True, block=True)
        return 0
    earlier = running_server(studio.runs_dir)
    if earlier is not None:
        print(f"A run is training in the background (process {earlier['pid']}); this window shows it.")
        _open_window(earlier["url"], gui, driver, guarded_for=None)
        _leave(0)
    url = serve("127.0.0.1", free_port(), inbrowser=False, block=False)
    guard = _open_window(url, gui, driver, guarded_for=studio)
    _leave(_after_the_window(studio, url, stop=guard is not None and guard.decided == "stop"))


def _leave(status: int) -> NoReturn:
    """End the process once the window is closed and nothing of the app's is left to do, without running Qt
    WebEngine's C++ destructors. pywebview leaves its web profile and page to Python's garbage collector, which at
    interpreter exit may release the profile first; Qt then aborts the whole process ("Release of profile requested
    but WebEnginePage still not deleted", then SIGABRT), taking its exit status, and any run still training, with
    it. Everything is saved by now; the logs and the standard streams are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _open_window(url: str, gui: Gui, driver: Driver | None, guarded_for: Studio | None) -> CloseGuard | None:
    """Show the window until it is closed; ``guarded_for``: its closing asks about a run this app trains (the
    returned guard says what was answered)."""
    if gui in ("qt", "gtk"):
        _load_tritons_llvm_first()
    import webview

    if gui == "qt" and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Qt WebEngine is Chromium, which will not start its sandbox as root (containers, CI).
        os.environ["QTWEBENGINE_CHROMIUM_FLAGS"] = (os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "") + " --no-sandbox").strip()
    webview.settings["ALLOW_DOWNLOADS"] = True  # a save dialog for each download (the YAML, zips, launch folder)
    webview.settings["OPEN_EXTERNAL_LINKS_IN_BROWSER"] = True
    width, height = remembered_size()
    window = webview.create_window(TITLE, url, width=width, height=height, min_size=MIN_SIZE, text_select=True,
                                   zoomable=True)
    if window is None:  # pywebview makes none only for a window added to a GUI loop already running
        raise RuntimeError("The window could not be made.")
    if gui == "qt":
        # pywebview reads the storage path when its Qt module is imported, inside start(): patch it after that, and
        # before the window's view exists ("initialized" runs on the main thread, between the two).
        window.events.initialized += lambda renderer: _mend_qt_downloads()
    window.events.resized += lambda width, height: remember_size(width, height)
    guard = CloseGuard(window, guarded_for) if guarded_for is not None else None
    if guard is not None:
        window.events.closing += guard.on_closing
    # Not private: the browser storage keeps the draft settings from one start to the next, as a browser tab does.
    webview.start(driver, (window,), gui=None if gui == "native" else gui, private_mode=False,
                  storage_path=str(cache_dir() / "webview"), icon=str(ICON) if ICON.is_file() else None)
    return guard


def _load_tritons_llvm_first() -> None:
    """Import triton (torch's CUDA builds install it) before the window's web view loads the system's OpenGL.

    Both bring an LLVM: Mesa's libLLVM (its software renderer, the only one on a machine without a GPU, and its AMD
    drivers) and the copy built into triton. With triton loaded after Mesa's LLVM, the process dies of SIGSEGV
    inside triton's library the first time something imports torch._dynamo (the app's warm-up, a training's first
    step), after Chromium's "Failed to load vulkan" and "Failed to connect to the bus" lines; loaded first, both
    work (Debian 12: Mesa 22.3 with LLVM 15, triton 3.8, Qt 6.11). A fifth of a second, where triton is installed."""
    if importlib.util.find_spec("triton") is not None:
        with contextlib.suppress(Exception):  # a broken triton: torch will say so where it is needed
            import triton  # noqa: F401


# --------------------------------------------------------------------------------------------------------------------
# Downloads in the Qt window. pywebview 6.2's Qt handler shows the save dialog and then calls Qt 5's download.setPath,
# which Qt 6 lacks: the AttributeError escapes a PyQt6 slot, which aborts the whole program, server included.


def ask_save_path(parent, title: str, suggested: str, name_filter: str) -> str:
    """The path the person chose in the save dialog, "" if they cancelled (tests may replace this function)."""
    from qtpy.QtWidgets import QFileDialog

    path, _ = QFileDialog.getSaveFileName(parent, title, suggested, name_filter)
    return path


def save_download(view, download) -> None:
    """Ask where to save a download the page started, then let Qt save it there. It runs inside Qt's signal on the
    GUI thread: Qt 6 cancels a request nobody accepted by the time the signal returns."""
    try:
        qt6 = hasattr(download, "setDownloadFileName")
        name = download.downloadFileName() if qt6 else Path(download.path()).name
        name = Path(name or download.url().path() or "download").name
        suffix = Path(name).suffix.lstrip(".")
        folder = download.downloadDirectory() if qt6 else ""
        suggested = str(Path(folder if folder and Path(folder).is_dir() else Path.home()) / name)
        chosen = ask_save_path(view, "Save file", suggested,
                               f"*.{suffix};;All files (*)" if suffix else "All files (*)")
        if not chosen:
            download.cancel()
            return
        path = Path(chosen).resolve()
        if qt6:
            download.setDownloadDirectory(str(path.parent))
            download.setDownloadFileName(path.name)
        else:
            download.setPath(str(path))
        download.accept()
    except Exception as exc:  # noqa: BLE001 - escaping a PyQt6 slot would abort the program
        print(f"The download could not be saved: {exc}", file=sys.stderr)
        with contextlib.suppress(Exception):
            download.cancel()


def _mend_qt_downloads() -> None:
    sys.modules["webview.platforms.qt"].BrowserView.on_download_requested = save_download


class CloseGuard:
    """Asks, when the window closes while a run trains, whether to stop it or keep it training in the background."""

    def __init__(self, window, studio: Studio) -> None:
        self.window, self.studio = window, studio
        self.decided: str | None = None  # "stop" or "keep" once asked; then the window may close

    def on_closing(self) -> bool:
        if self.decided is not None or not self.studio.runs.trainings():
            return True
        threading.Thread(target=self._ask, name="dragon-close-question", daemon=True).start()
        return False  # closes once the question is answered

    def _ask(self) -> None:
        stop = self.window.create_confirmation_dialog(TITLE, CLOSE_QUESTION)
        self.decided = "stop" if stop else "keep"
        for handle in self.studio.runs.trainings() if stop else []:
            handle.stop()
        self.window.destroy()


def _after_the_window(studio: Studio, url: str, stop: bool) -> int:
    """Once the window is closed: wait for the runs its closing stopped (``stop``) to save; keep serving the runs
    that train on in the background until they and the runs queued after them have finished, so no process is left
    behind."""
    trainings = studio.runs.trainings()
    if not trainings:
        return 0
    names = ", ".join(handle.run.id for handle in trainings)
    if stop:
        print(f"Stopping {names}; a checkpoint is being saved...")
        for handle in trainings:
            handle.wait()
        return 0
    marker = studio.runs_dir / SERVER_FILE
    write_json_atomic(marker, {"url": url, "pid": os.getpid()})
    print(f"{names} train{'s' if len(trainings) == 1 else ''} on in the background; make desktop (or make run) shows "
          "it again. This process ends when the last run has finished.")
    try:
        while studio.runs.trainings() or studio.runs.waiting():
            time.sleep(2)
    finally:
        marker.unlink(missing_ok=True)
    print("The last run has finished.")
    return 0


def running_server(runs_dir: Path) -> dict | None:
    """The address and pid of an earlier window's process still serving this runs folder, if it answers."""
    try:
        server = json.loads((runs_dir / SERVER_FILE).read_text(encoding="utf-8"))
        os.kill(int(server["pid"]), 0)
        urllib.request.urlopen(server["url"], timeout=3).close()
        return server
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _size_file() -> Path:
    return cache_dir() / "desktop.json"


def remembered_size() -> tuple[int, int]:
    try:
        saved = json.loads(_size_file().read_text(encoding="utf-8"))
        return max(MIN_SIZE[0], int(saved["width"])), max(MIN_SIZE[1], int(saved["height"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_SIZE


def remember_size(width: int, height: int) -> None:
    try:
        write_json_atomic(_size_file(), {"width": int(width), "height": int(height)})
    except OSError:
        pass  # a read-only home: the next window opens at the default size

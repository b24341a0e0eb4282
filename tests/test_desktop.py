"""The desktop window, for real: ``python app.py --desktop`` opens a pywebview window (Qt WebEngine) on a virtual
screen (Xvfb, with openbox for the title bar and closing), and tests/desktop_driver.py drives it through the
webview's JavaScript bridge and with xdotool's keys. Without a screen the app says why in one sentence and falls
back to the browser."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import tiny_config

from dragon_ui.runstore import RunDir
from dragon_ui.ui import desktop

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "desktop_driver.py"
SCREEN = "1600x1200x24"  # room for the window and its frame
NEEDED = ("Xvfb", "openbox", "xdotool", "xprop")

pytestmark = pytest.mark.browser


def answers(command: list[str], env: dict, what: str, saying: str = "", seconds: float = 30.0) -> None:
    """Wait until ``command`` succeeds (and prints ``saying``): the X server or window manager is up."""
    deadline = time.monotonic() + seconds
    while True:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode == 0 and saying in done.stdout:
            return
        assert time.monotonic() < deadline, f"{what} did not start: {done.stderr or done.stdout}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def screen():
    """A virtual screen with a window manager: its DISPLAY. CI installs what it needs (.ci/run)."""
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} missing: .ci/run installs them")
        pytest.skip(f"needs {', '.join(missing)} (Debian: xvfb openbox xdotool x11-utils)")
    # Xvfb picks a free display and names it (-displayfd): a number chosen here could be taken by another X
    # server (one left behind by a killed test run took it, and this one then met that server's windows).
    chosen, told = os.pipe()
    # -noreset: an X server resets itself when its last client leaves, and refuses connections meanwhile. The probe
    # below was the only client, so the window manager that started next met a server being reset, now and then,
    # and could not open the display (2 starts in 40 here).
    server = subprocess.Popen(["Xvfb", "-displayfd", str(told), "-screen", "0", SCREEN, "-nolisten", "tcp", "-noreset"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(told,))
    os.close(told)
    with os.fdopen(chosen) as named:
        number = named.readline().strip()
    assert number.isdigit(), "the virtual screen did not start (Xvfb named no display)"
    display = f":{number}"
    on_screen = {**os.environ, "DISPLAY": display}
    manager = None
    try:
        answers(["xdotool", "getdisplaygeometry"], on_screen, "the virtual screen")
        manager = subprocess.Popen(["openbox"], env=on_screen, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        answers(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], on_screen, "the window manager", "window id")
        yield display
    finally:
        for process in (manager, server):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)


def drive(display: str, tmp_path: Path, scenario: str, config: Path | None = None, screenshot: Path | None = None,
          timeout: float = 240) -> tuple[dict, subprocess.CompletedProcess]:
    result = tmp_path / "seen.json"
    answers(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], {**os.environ, "DISPLAY": display},
            "the window manager (still)", "window id", seconds=5)  # the closing scenarios need it
    env = {**os.environ, "DISPLAY": display, "DRAGON_UI_RUNS_DIR": str(tmp_path / "runs"),
           "DRAGON_UI_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(DRIVER), scenario, str(result), str(config or "")]
    if screenshot is not None:
        command.append(str(screenshot))
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # the driver's faulthandler prints every thread's stack
            out, err = process.communicate()
            seen = json.loads(result.read_text()) if result.is_file() else {}
            pytest.fail(f"the window's process was still running after {timeout:.0f} s; it had seen {seen}\n"
                        f"{out[-2000:]}\n{err[-12000:]}")
    seen = json.loads(result.read_text()) if result.is_file() else {}
    return seen, subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.mark.timeout(300)
def test_the_app_lives_inside_a_real_window(screen, tmp_path):
    shot = Path(os.environ.get("DRAGON_UI_SCREENSHOTS") or tmp_path) / "desktop.png"
    seen, done = drive(screen, tmp_path, "tabs", screenshot=shot)
    assert done.returncode == 0 and "error" not in seen, (seen.get("error"), seen, done.stderr[-3000:])
    assert seen["title"] == desktop.TITLE  # the page loaded inside the webview
    assert seen["model_tab"] is True  # a tab switch through the webview's JavaScript bridge
    from PIL import Image

    with Image.open(shot) as picture:
        width, height = picture.size
        assert width >= desktop.DEFAULT_SIZE[0] and height > desktop.DEFAULT_SIZE[1]  # the frame and title bar too


def training_config(tmp_path: Path, tiny_model_dir: Path, steps: int) -> Path:
    config = tiny_config(tiny_model_dir, tmp_path, tmp_path / "runs")
    config["training"].update(max_steps=steps, save_steps=1000)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.timeout(400)
def test_closing_while_training_and_choosing_stop_saves_a_checkpoint_and_ends(screen, tmp_path, tiny_model_dir):
    seen, done = drive(screen, tmp_path, "close-stop", training_config(tmp_path, tiny_model_dir, steps=2000))
    assert done.returncode == 0 and "error" not in seen, (seen.get("error"), seen, done.stderr[-3000:])
    status = json.loads((Path(seen["run_dir"]) / "status.json").read_text())
    assert status["state"] == "cancelled" and status["latest_checkpoint"].startswith("checkpoint-")
    assert status["step"] < 2000
    assert "Stopping" in done.stdout
    assert not (tmp_path / "runs" / desktop.SERVER_FILE).exists()


@pytest.mark.timeout(400)
def test_closing_while_training_and_choosing_keep_trains_on_and_then_ends(screen, tmp_path, tiny_model_dir):
    seen, done = drive(screen, tmp_path, "close-keep", training_config(tmp_path, tiny_model_dir, steps=40))
    assert done.returncode == 0 and "error" not in seen, (seen.get("error"), seen, done.stderr[-3000:])
    status = json.loads((Path(seen["run_dir"]) / "status.json").read_text())
    assert status["state"] == "succeeded" and status["step"] == 40  # it trained to the end after the window closed
    assert "trains on in the background" in done.stdout and "make desktop" in done.stdout
    assert "The last run has finished." in done.stdout  # and the process ended by itself
    assert not (tmp_path / "runs" / desktop.SERVER_FILE).exists()


@pytest.mark.timeout(400)
def test_downloads_get_a_save_dialog_and_outside_links_open_in_the_browser(screen, tmp_path, _trained_tiny_run):
    """The Model tab's YAML and the Compare tab's adapter zip, each clicked with the mouse and saved through the real
    save dialog with the path typed in; a link to another site goes to the system browser, not into the window."""
    shutil.copytree(_trained_tiny_run, tmp_path / "runs" / _trained_tiny_run.name)
    saved = tmp_path / "saved"
    saved.mkdir()
    seen, done = drive(screen, tmp_path, "downloads", saved)
    assert done.returncode == 0 and "error" not in seen, (seen.get("error"), seen, done.stderr[-3000:])
    assert seen["yaml_saved"] and seen["yaml_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct", seen
    assert seen["zip_saved"] and {"README.txt", "adapter/README.md", "adapter/adapter_config.json"} <= set(seen["zip_files"])
    assert seen["browser_opened"] == ["https://huggingface.co/docs/trl"] and seen["still_here"]
    assert sorted(path.name for path in saved.iterdir()) == ["adapter.zip", "my-run.yaml"]  # nothing half-written


@pytest.mark.timeout(500)
def test_a_second_start_opens_its_window_on_the_training_that_went_on_in_the_background(screen, tmp_path,
                                                                                         tiny_model_dir):
    first_seen = tmp_path / "first"
    first_seen.mkdir()
    env = {**os.environ, "DISPLAY": screen, "DRAGON_UI_RUNS_DIR": str(tmp_path / "runs"),
           "DRAGON_UI_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    config = training_config(tmp_path, tiny_model_dir, steps=2000)
    first = subprocess.Popen([sys.executable, str(DRIVER), "close-keep", str(first_seen / "seen.json"), str(config)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        marker = tmp_path / "runs" / desktop.SERVER_FILE
        deadline = time.monotonic() + 300
        while not marker.is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert marker.is_file(), "the first window never left its training in the background"
        server = json.loads(marker.read_text())
        run_dir = Path(json.loads((first_seen / "seen.json").read_text())["run_dir"])

        seen, done = drive(screen, tmp_path, "reattach", run_dir.name)
        assert done.returncode == 0 and "error" not in seen, (seen.get("error"), seen, done.stderr[-3000:])
        assert seen["url"].rstrip("/") == server["url"].rstrip("/")  # the window shows the first process's app
        assert seen["train_tab"] and f"process {server['pid']}" in done.stdout
        assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # untouched by the second
    finally:
        RunDir(run_dir).request_stop() if "run_dir" in locals() else first.terminate()
        output, _ = first.communicate(timeout=180)
    assert first.returncode == 0, output[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "cancelled"
    assert not marker.exists()


# A bare web view that imports triton once its page has loaded (OpenGL is in the process by then, and with Mesa's
# software renderer the system's libLLVM), as torch._dynamo does when transformers first needs it; the window's own
# start (desktop._load_tritons_llvm_first) runs before Qt does.
LATE_TRITON = """
import sys
sys.path.insert(0, sys.argv[1])
from dragon_ui.ui import desktop
desktop._load_tritons_llvm_first()
from PyQt6.QtCore import QTimer
from PyQt6.QtWidgets import QApplication
from PyQt6.QtWebEngineWidgets import QWebEngineView
app = QApplication(sys.argv[:1])
view = QWebEngineView()
def loaded(ok):
    import triton
    print("page loaded:", ok, "triton", triton.__version__, flush=True)
    app.quit()
view.loadFinished.connect(loaded)
view.setHtml("<canvas width=200 height=100></canvas><p>the window</p>")
view.show()
QTimer.singleShot(60_000, app.quit)
app.exec()
"""


@pytest.mark.timeout(120)
def test_triton_imported_while_the_window_shows_leaves_it_running(screen):
    """torch's CUDA builds (what pip installs on Linux) bring triton, whose library carries an LLVM of its own:
    imported after Mesa's had come into the window's process, it crashed that process (SIGSEGV), the server and any
    training with it, at the first page action that imported transformers' generation code."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (torch's CPU build)")
    flags = os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "") + (" --no-sandbox" if os.geteuid() == 0 else "")
    env = {**os.environ, "DISPLAY": screen, "QTWEBENGINE_CHROMIUM_FLAGS": flags.strip()}
    done = subprocess.run([sys.executable, "-c", LATE_TRITON, str(REPO)], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0 and "page loaded: True" in done.stdout, (done.returncode, done.stderr[-3000:])


def test_without_a_screen_it_says_so_and_opens_the_browser(tmp_path, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    served: list = []
    assert desktop.run(object(), lambda *args, **kwargs: served.append(kwargs) or "") == 0
    assert served == [{"inbrowser": True, "block": True}]


def test_without_a_screen_the_reason_is_one_sentence(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    gui, why = desktop.window_backend()
    assert gui is None and why.startswith("There is no screen here") and why.count(". ") == 0


def test_without_pywebview_it_names_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "webview" else real(name, *a))
    gui, why = desktop.window_backend()
    assert gui is None and "pywebview" in why and "requirements-desktop.txt" in why


def test_the_window_remembers_its_size(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAGON_UI_CACHE", str(tmp_path))
    assert desktop.remembered_size() == desktop.DEFAULT_SIZE
    desktop.remember_size(1500, 1000)
    assert desktop.remembered_size() == (1500, 1000)
    desktop.remember_size(100, 100)  # never smaller than the app can use
    assert desktop.remembered_size() == desktop.MIN_SIZE

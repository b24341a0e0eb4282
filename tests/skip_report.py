"""A pytest plugin (``-p skip_report`` in pyproject.toml): when tests skipped, the run's end says why, one line per
distinct reason with how many skipped for it, and, where a reason is a browser or window tool this machine lacks,
the one command that installs everything the browser and window tests need.

Without chromium or Xvfb a newcomer's ``make test`` skips the browser and window tests; the summary alone says only
"28 skipped"."""

from __future__ import annotations

from collections import Counter

import pytest

# What the full suite needs from the system, Debian's names (Ubuntu's too), as .ci/run installs them: chromium for
# Playwright (the browser tests, tests/test_browser.py), its emoji font for the screenshots; for the window test
# (tests/test_desktop.py) a virtual screen, a window manager, xdotool's keys, xprop and xwininfo (x11-utils), and the
# X and GL libraries Qt WebEngine's wheels (pywebview[qt]) load. The README's Development section names the same.
SYSTEM_PACKAGES = (
    "chromium", "fonts-noto-color-emoji", "xvfb", "openbox", "xdotool", "x11-utils", "libxcb-cursor0",
    "libxkbcommon-x11-0", "libxcb-icccm4", "libxcb-image0", "libxcb-keysyms1", "libxcb-render-util0",
    "libxcb-xinerama0", "libxcb-xkb1", "libegl1", "libgl1",
)
INSTALL_COMMAND = "sudo apt-get install " + " ".join(SYSTEM_PACKAGES)
INSTALL_HINT = f"The browser and window tests need system packages; on Debian or Ubuntu: {INSTALL_COMMAND}"

# A skip reason naming one of these is a missing browser or window tool (the words the browser and window tests'
# skip messages use), which INSTALL_COMMAND installs.
SYSTEM_TOOLS = ("chromium", "xvfb", "openbox", "xdotool", "xprop", "xwininfo", "x11-utils")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skipped report gives, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr or "")
    reason = reason.removeprefix("Skipped: ").strip()
    return "" if reason == "Skipped" else reason


def needs_system_packages(reason: str) -> bool:
    lowered = reason.lower()
    return any(tool in lowered for tool in SYSTEM_TOOLS)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    skipped = [report for report in terminalreporter.stats.get("skipped", []) if report.skipped]
    if not skipped:
        return
    reasons = Counter(skip_reason(report) or "(no reason given)" for report in skipped)
    width = len(str(max(reasons.values())))
    terminalreporter.write_sep("=", f"{len(skipped)} skipped, by reason")
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:>{width}}  {reason}")
    if any(needs_system_packages(reason) for reason in reasons):
        terminalreporter.write_line(INSTALL_HINT, bold=True)

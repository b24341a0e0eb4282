"""tests/skip_report.py, the plugin that ends a run with why tests skipped and what to install: run on small test
files through pytester, and once on the real window test on a machine without its tools."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import skip_report

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "Debian's chromium is needed for the browser test: sudo apt-get install chromium"  # tests/test_browser.py's

SKIPPING = f"""
import pytest

@pytest.fixture
def page():
    pytest.skip({CHROMIUM!r})

@pytest.mark.parametrize("tab", ["data", "model", "train"])
def test_a_tab(page, tab):
    pass

@pytest.mark.skipif(True, reason="needs Xvfb, openbox (Debian: xvfb openbox xdotool x11-utils)")
def test_the_window():
    pass

def test_triton():
    pytest.skip("triton is not installed (torch's CPU build)")

def test_plain():
    assert True
"""


def section(output: str) -> list[str]:
    """The lines the plugin wrote: from its header to the line before pytest's last."""
    lines = output.splitlines()
    start = next((n for n, line in enumerate(lines) if re.search(r"=+ \d+ skipped, by reason =+", line)), None)
    return [] if start is None else lines[start:-1]


def test_skips_are_grouped_by_reason_with_the_install_line(pytester):
    pytester.makepyfile(test_app=SKIPPING)
    result = pytester.runpytest("-p", "skip_report", "-q")
    result.assert_outcomes(passed=1, skipped=5)
    lines = section(result.stdout.str())
    assert "5 skipped, by reason" in lines[0]
    assert lines[1:] == [  # the most common reason first, each once
        f"3  {CHROMIUM}",
        "1  needs Xvfb, openbox (Debian: xvfb openbox xdotool x11-utils)",
        "1  triton is not installed (torch's CPU build)",
        skip_report.INSTALL_HINT,
    ]


def test_skips_that_no_package_would_cure_get_no_install_line(pytester):
    pytester.makepyfile(test_gpu="""
        import pytest

        @pytest.mark.skipif(True, reason="bitsandbytes is not installed here")
        def test_4bit():
            pass

        @pytest.mark.skip
        def test_someday():
            pass
    """)
    result = pytester.runpytest("-p", "skip_report", "-q")
    result.assert_outcomes(skipped=2)
    lines = section(result.stdout.str())
    assert lines[1:] == ["1  bitsandbytes is not installed here", "1  unconditional skip"]
    assert "apt-get" not in result.stdout.str()


def test_a_run_without_skips_prints_nothing_more(pytester):
    pytester.makepyfile(test_fine="def test_one():\n    assert True\n\ndef test_two():\n    assert True\n")

    def output(*args: str) -> str:
        result = pytester.runpytest(*args)
        result.assert_outcomes(passed=2)
        return re.sub(r"in [\d.]+s", "in Ns", result.stdout.str())

    assert output("-p", "skip_report") == output()


def test_the_real_window_test_without_its_tools_says_what_to_install(pytester, monkeypatch):
    """tests/test_desktop.py on a PATH without Xvfb, openbox, xdotool or xprop, run with the repository's own settings
    (pyproject.toml registers the plugin)."""
    monkeypatch.setenv("PATH", str(pytester.mkdir("bare-path")))
    monkeypatch.delenv("CI", raising=False)  # in CI the missing tools fail the test instead
    result = pytester.runpytest_subprocess(str(ROOT / "tests" / "test_desktop.py"), "-k", "real_window or triton",
                                           "-p", "no:cacheprovider", "-q", timeout=240)
    result.assert_outcomes(skipped=2)
    assert section(result.stdout.str())[1:] == [
        "2  needs Xvfb, openbox, xdotool, xprop (Debian: xvfb openbox xdotool x11-utils)", skip_report.INSTALL_HINT]


def test_the_install_line_is_what_ci_installs_and_the_readme_names():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.search(r"apt-get install (.*?)>/dev/null", ci, re.DOTALL).group(1).replace("\\\n", " ")
    assert [word for word in shlex.split(command) if not word.startswith("-")] == list(skip_report.SYSTEM_PACKAGES)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert " ".join(skip_report.SYSTEM_PACKAGES) in readme


@pytest.mark.parametrize("reason, cured", [
    (CHROMIUM, True),
    ("needs Xvfb, openbox, xdotool, xprop (Debian: xvfb openbox xdotool x11-utils)", True),
    ("needs xprop (Debian: xvfb openbox xdotool x11-utils)", True),
    ("triton is not installed (torch's CPU build)", False),
    ("with a GPU here, the preview runs on it", False),
])
def test_which_reasons_the_packages_cure(reason, cured):
    assert skip_report.needs_system_packages(reason) is cured

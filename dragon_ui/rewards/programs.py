"""The command reward: a program that scores the reply (unit tests, a checker), run with a time limit. Refused in a
public demo (CommandReward.refused_in_public), as the custom Python function is (code.load_custom_function)."""

from __future__ import annotations

import os
import subprocess
import tempfile

from ..errors import RewardError
from ..system.processes import end_group
from .builtin import Scorer
from .spec import CommandReward
from .text import last_number

# Environment strings are capped by the kernel (128 KiB each); 32,000 characters stay below that even in UTF-8.
_ENV_TEXT_LIMIT = 32_000


def _env_text(text: str | None) -> str:
    """Environment values cannot hold NUL bytes and are size-capped by the kernel; keep them safe to pass."""
    return (text or "").replace("\0", "")[:_ENV_TEXT_LIMIT]


def command_scorer(spec: CommandReward, base_dir: str | None) -> Scorer:
    """Run a program per completion (no shell); score from its exit code or the last number it prints.

    input "stdin" sends the completion on standard input. input "file" writes it to a temporary file whose path
    replaces ``{completion_file}`` in argv (appended as the last argument when argv has no placeholder);
    ``{reference_file}`` works the same way in both modes. The program runs in ``base_dir`` (the config's folder)
    in its own session, so at the timeout the whole process group, grandchildren included, is killed.
    DRAGON_PROMPT and DRAGON_REFERENCE hold the prompt and reference (cut to 32,000 characters).
    """
    def score(prompt, completion, reference, row):
        with tempfile.TemporaryDirectory(prefix="dragon_reward_") as tmp:
            argv = list(spec.argv)
            if spec.input == "file" and not any("{completion_file}" in arg for arg in argv):
                argv.append("{completion_file}")
            for placeholder, filename, text in (("{completion_file}", "completion.txt", completion),
                                                ("{reference_file}", "reference.txt", reference or "")):
                if any(placeholder in arg for arg in argv):
                    path = os.path.join(tmp, filename)
                    with open(path, "w", encoding="utf-8") as handle:
                        handle.write(text)
                    argv = [arg.replace(placeholder, path) for arg in argv]
            env = dict(os.environ, DRAGON_PROMPT=_env_text(prompt), DRAGON_REFERENCE=_env_text(reference))
            stdin = completion.encode("utf-8") if spec.input == "stdin" else None
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=base_dir, env=env, start_new_session=True,
                )
            except FileNotFoundError:
                raise RewardError(f"command not found: {argv[0]!r} (is it installed and on the PATH?)") from None
            except PermissionError:
                raise RewardError(f"command is not executable: {argv[0]!r}") from None
            with proc:
                try:
                    out, err = proc.communicate(stdin, timeout=spec.timeout)
                except subprocess.TimeoutExpired:
                    end_group(proc, hard=True)
                    raise RewardError(f"timed out after {spec.timeout:g} s") from None
        if spec.score_from == "exit_code":
            return 1.0 if proc.returncode == 0 else 0.0
        if proc.returncode != 0:
            last_line = next((line for line in reversed(err.decode("utf-8", "replace").splitlines()) if line.strip()),
                             "")
            raise RewardError(f"exited with code {proc.returncode}: {last_line}".rstrip(": "))
        value = last_number(out.decode("utf-8", "replace"))
        if value is None:
            raise RewardError("printed no number on standard output")
        return min(1.0, max(0.0, (value - spec.min_score) / (spec.max_score - spec.min_score)))
    return score



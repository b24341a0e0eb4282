"""The ``math`` kind: the reply's final answer checked against the reference by math-verify, the checker behind TRL's
``accuracy_reward`` and open-r1. It knows that \\frac{1}{2}, 0.5 and 50\\% are one number, that {3,2,1} is the set
{1,2,3}, that \\sqrt{8} is 2\\sqrt{2}, and it reads intervals, equations and units.

The ``cosine_length`` kind is TRL's cosine-scaled reward, whose correctness check is math-verify too, so it is
computed by the same worker.

math-verify limits its own time with SIGALRM, which works only in a process's main thread, and a training scores in
a thread of its own. So the checks run in a worker process (started on first use, kept for the next ones), in its
main thread with math-verify's own time limits, and the caller waits at most :data:`LIMIT_S` for an answer: a check
that takes longer ends with that worker, and the next check starts a fresh one. The worker's memory is capped where
the system allows it. A training has a worker of its own (:data:`TRAINING`), so that what visitors of a public demo
send to the playground (:data:`PREVIEWS`, where a wait for the worker is limited too) never holds up a run. Checks
take turns by network address (system.processes.FairTurns), so one visitor's many slow checks cannot crowd out another's,
and the worker runs at a low priority.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable

from ..system.processes import (PACKAGE_PARENT, WAITING_PER_ASKER, FairTurns, TurnRefused, asker, child_environment,
                     lower_priority)
from ..errors import RewardError, one_line
from .text import extract_answer, require_reference

LIMIT_S = 10.0  # one reply: waiting for the worker (playground) and its answer, each at most this long
START_S = 60.0  # a worker's start (Python, sympy, math-verify's parser) on a busy machine
CHECK_S = 3  # math-verify's own limit on parsing one text and on one comparison, inside the worker: two parses and
# a comparison, the most a check makes, stay within LIMIT_S
MEMORY_BYTES = 2 * 2**30  # the worker's address space: Python, sympy and the parsed expressions
DELIMITERS = ("$", "\\(", "\\[", "\\boxed")
READY = "ready"


def _as_latex(text: str) -> str:
    """math-verify finds LaTeX only between delimiters; a bare reference or extracted answer ("\\frac{1}{2}", "0.5")
    is put between $…$ so it parses like the same text written in a paper."""
    return text if any(mark in text for mark in DELIMITERS) else f"${text}$"


def check(reference: str, answer: str, whole_reply: bool) -> bool:
    """math-verify's verdict on ``answer`` against ``reference``, in this process (the worker's main thread).
    ``whole_reply``: math-verify finds the answer itself (\\boxed{} first, then the last formula or number)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse(_as_latex(reference), extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=CHECK_S)
    if not gold:
        raise RewardError(f"math-verify cannot read the reference answer {reference[:60]!r}")
    given = parse(answer if whole_reply else _as_latex(answer),
                  extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
                  parsing_timeout=CHECK_S)
    return bool(given) and verify(gold, given, timeout_seconds=CHECK_S)


def cosine_length(reference: str, reply: str, token_count: int, max_tokens: int) -> float:
    """TRL's cosine-scaled reward of one reply, in this process (the worker's main thread, where the math-verify calls
    of TRL's ``accuracy_reward`` inside it keep time limits); only the reply's length in tokens matters."""
    from trl.rewards import get_cosine_scaled_reward

    _limit_trls_math_verify()
    score = get_cosine_scaled_reward(max_len=max_tokens)([[{"role": "assistant", "content": reply}]],
                                                         [_as_latex(reference)], [[0] * token_count])[0]
    if score is None:
        raise RewardError(f"math-verify cannot read the reference answer {reference[:60]!r}")
    return score


def _limit_trls_math_verify() -> None:
    """TRL's accuracy_reward gives math-verify 10 s for each of its two parses and 5 s to compare, 25 s in all, more
    than a reply may hold this shared worker (LIMIT_S); in this worker process its calls get CHECK_S each instead."""
    import trl.rewards.accuracy_rewards as accuracy

    if getattr(accuracy, "limited_by_dragon", False):
        return
    parse, verify = accuracy.parse, accuracy.verify
    accuracy.parse = lambda *args, parsing_timeout=None, **kwargs: parse(*args, parsing_timeout=CHECK_S, **kwargs)
    accuracy.verify = lambda *args, timeout_seconds=None, **kwargs: verify(*args, timeout_seconds=CHECK_S, **kwargs)
    setattr(accuracy, "limited_by_dragon", True)  # a mark of ours on TRL's module, which declares no such attribute


CHECKS: dict[str, Callable[..., object]] = {"verify": check, "cosine_length": cosine_length}


def serve() -> None:
    """The worker: one JSON request per line on standard input ([check, *arguments], a name in CHECKS), one answer
    per line on standard output ([true, value] or [false, why]), until standard input closes."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # not on Windows, or a lower hard limit already: keep that one
        pass
    lower_priority()
    import math_verify  # noqa: F401  (imported before the first check, which its time limit then measures alone)

    sys.stdout.write(json.dumps(READY) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        name, *arguments = json.loads(line)
        try:
            reply = [True, CHECKS[name](*arguments)]
        except BaseException as error:  # a timeout, a memory error, a parse failure: this reply only
            reply = [False, one_line(error)]
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class MathChecker:
    """The worker process, started with the same Python as the app (not a fork: the app holds a model and threads),
    and a thread that reads its answers, so that the wait for one can have a time limit on every platform. Checks
    take turns from any thread, fairly between network addresses (system.processes.FairTurns)."""

    def __init__(self) -> None:
        self._turns = FairTurns()
        self._process: subprocess.Popen | None = None
        self._answers: queue.Queue = queue.Queue()

    def verify(self, reference: str, answer: str, whole_reply: bool) -> bool:
        return self.ask("verify", reference, answer, whole_reply)

    def ask(self, check_name: str, *arguments):
        """The value of ``CHECKS[check_name](*arguments)``, computed by the worker."""
        try:
            with self._turns.turn(asker(), LIMIT_S):
                if self._process is None or self._process.poll() is not None:
                    self._start()
                answer = self._ask([check_name, *arguments])
        except TurnRefused as refused:
            if refused.crowded:
                raise RewardError(f"math-verify is checking {WAITING_PER_ASKER} other replies from your network "
                                  "address; this one was not checked") from None
            raise RewardError(f"math-verify was busy with other replies for {LIMIT_S:g} s; this one was not "
                              "checked") from None
        done, value = answer
        if not done:
            raise RewardError(value)
        return value

    def _ask(self, request: list) -> list:
        """The worker's answer to one request; a worker that is too slow or gone is replaced by the next check."""
        process = self._process
        assert process is not None and process.stdin is not None  # ask started it, writing to its input
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            answer = self._answers.get(timeout=LIMIT_S)
        except queue.Empty:
            self._stop()
            raise RewardError(f"math-verify took longer than {LIMIT_S:g} s on this reply") from None
        except OSError:  # the pipe is closed: the worker is gone
            answer = None
        if answer is None:  # the worker stopped (its memory limit)
            self._stop()
            raise RewardError("math-verify's worker stopped on this reply (out of memory)")
        return answer

    def _start(self) -> None:
        """A fresh worker, with the same Python as the app but not its secrets, away from the current folder (-P)."""
        self._answers = queue.Queue()
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-c", "from dragon_ui.rewards.math_answers import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
            env=child_environment(), cwd=PACKAGE_PARENT)
        threading.Thread(target=self._read, args=(self._process, self._answers), daemon=True,
                         name="dragon-math-verify").start()
        try:
            ready = self._answers.get(timeout=START_S)
        except queue.Empty:
            ready = None
        if ready != READY:
            self._stop()
            raise RewardError(f"math-verify's worker did not start within {START_S:g} s")

    @staticmethod
    def _read(process: subprocess.Popen, answers: queue.Queue) -> None:
        """Hand each answer line over; a closed pipe (the worker gone) is handed over as None."""
        assert process.stdout is not None  # _start reads its output
        for line in process.stdout:
            answers.put(json.loads(line))
        answers.put(None)

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
        self._process = None


TRAINING = MathChecker()  # a training run's checks (one run trains at a time)
PREVIEWS = MathChecker()  # everything else: the playground, the command line, "Evaluate now"


def math_scorer(spec, checker: MathChecker):
    """1 when math-verify finds the reply's answer (``spec.extract``: the whole reply, where math-verify looks for
    it, or the part an extraction mode takes) equal to the reference, else 0."""
    def score(prompt, completion, reference, row):
        reference = require_reference(reference)
        whole = spec.extract == "whole"
        answer = completion if whole else extract_answer(completion, spec.extract)
        if not answer.strip():
            return 0.0
        return float(checker.verify(reference, answer, whole))
    return score

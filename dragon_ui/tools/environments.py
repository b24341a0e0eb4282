"""Environments: tools with a state, one instance per conversation (TRL's ``environment_factory``). Each
conversation's environment is reset with its row, its public methods are the tools the model may call, and it may
score the conversation itself (``get_reward``), which the ``environment`` reward reads.

Two are bundled (a number-guessing game, and multi-step arithmetic with a submitted answer); your own is a Python
class (trusted mode only). Every environment reaches TRL wrapped in a :class:`Played`: its methods are called as
every tool is (bounds.answered: answers cut, nothing called after a stop), its ``reset`` is handed the row in words
(the question, the reference answer, the file's row), and its ``get_reward`` is hidden from TRL, which would
otherwise add it as a reward of its own with weight 1, outside the run's rewards, weights and charts.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Mapping

from ..chat import last_user_text
from ..errors import ConfigError, RewardError
from .bounds import answered
from .builtin import ToolError, calculator

NOT_TOOLS = ("reset", "get_reward")  # an environment's methods that the model is not shown (as TRL has it)
ENVIRONMENT_USAGE = ("class Environment: with reset(self, question, reference, row), methods with type hints and "
                     "docstrings (the model's tools) and, to score itself, get_reward(self)")


def _number(text, what: str) -> float:
    try:
        number = float(str(text).strip().replace(",", ""))
    except ValueError:
        raise ToolError(f"{what} must be a number, not {str(text)[:40]!r}") from None
    if not math.isfinite(number):
        raise ToolError(f"{what} must be a finite number, not {str(text)[:40]!r}")
    return number


class GuessNumber:
    """A number-guessing game: the row's reference answer is the secret, a whole number. Each guess is answered
    higher, lower or right. It scores itself: 1 for finding the number at the first guess, 0.1 less for each guess
    after it (at least 0.5), 0 for never finding it."""

    @classmethod
    def _playable(cls, reference: str | None) -> None:
        secret_number(reference)

    def reset(self, question: str, reference: str | None, row: dict) -> None:
        self.secret = secret_number(reference)
        self.guesses = 0
        self.found = False

    def guess(self, number: int) -> str:
        """Guess the secret number; the answer says whether the secret is higher, lower, or your guess is right.

        Args:
            number: Your guess, a whole number.
        """
        if self.found:
            return f"You found it already: it is {self.secret}."
        value = _number(number, "the guess")
        self.guesses += 1
        if value == self.secret:
            self.found = True
            return f"Right: the secret number is {self.secret}."
        return "The secret number is higher." if self.secret > value else "The secret number is lower."

    def get_reward(self) -> float:
        return max(0.5, 1.0 - 0.1 * (self.guesses - 1)) if self.found else 0.0


def _reference_number(reference: str | None, what: str = "the reference answer") -> float:
    return _number(reference if reference not in (None, "") else "none", what)


def secret_number(reference: str | None) -> int:
    """The guessing game's secret, the row's reference answer; ToolError saying why a row cannot be played."""
    value = _reference_number(reference, "the reference answer (the secret)")
    if value != int(value) or abs(value) > 10**12:
        raise ToolError(f"the reference answer (the secret) must be a whole number, not {reference!r}")
    return int(value)


class Arithmetic:
    """Multi-step arithmetic that scores itself: the model works things out with the calculator as often as it
    needs, then submits one result. 1 if that result equals the row's reference answer (a number), else 0."""

    @classmethod
    def _playable(cls, reference: str | None) -> None:
        _reference_number(reference)

    def reset(self, question: str, reference: str | None, row: dict) -> None:
        self.expected = _reference_number(reference)
        self.submitted: float | None = None

    def calculator(self, expression: str) -> str:
        """Work out an arithmetic expression exactly: + - * / ** and brackets (× and ÷ too).

        Args:
            expression: The arithmetic to work out, for example "(12 + 30) * 7".
        """
        return calculator(expression)

    def submit(self, answer: str) -> str:
        """Give your final result; only the first one you submit counts.

        Args:
            answer: Your result, a number.
        """
        if self.submitted is not None:
            return "You submitted a result already; only the first one counts."
        self.submitted = _number(answer, "the result")
        return "Submitted."

    def get_reward(self) -> float:
        if self.submitted is None:
            return 0.0
        return 1.0 if math.isclose(self.submitted, self.expected, rel_tol=1e-9, abs_tol=1e-9) else 0.0


BUNDLED = {"guess_number": GuessNumber, "arithmetic": Arithmetic}


class Played:
    """One conversation's environment as the run plays it: ``_inner`` is the environment itself. TRL calls
    ``reset(**example)`` with the run's stored example; the tool methods of a subclass (made by
    :func:`environment_factory`) call the environment's own methods. Nothing here is public but ``reset``, so TRL
    shows the model only the environment's tools."""

    _kind: type

    def __init__(self) -> None:
        self._inner = self._kind()

    def reset(self, **example) -> str | None:
        """The environment reset with the example's question, reference answer and file row; its first words to
        the model (added after the question, as TRL adds them), or None."""
        observation = self._inner.reset(**reset_arguments(example))
        if observation is not None and not isinstance(observation, str):
            raise ConfigError(f"{type(self._inner).__name__}.reset must return text (the model's first words from "
                              f"the environment) or None, not {type(observation).__name__}.")
        return observation


def reset_arguments(example: Mapping) -> dict:
    """What an environment's ``reset`` is handed of a run's example: the question (the last user message), the
    reference answer (None when empty) and the file's row (every column as text)."""
    prompt = example.get("prompt") or []
    return {"question": last_user_text(prompt) if isinstance(prompt, list) else str(prompt),
            "reference": example.get("reference") or None, "row": json.loads(example.get("row") or "{}")}


def episode_score(played: Played) -> float:
    """What the environment says its conversation earned (its ``get_reward()``); RewardError when it cannot."""
    get_reward = getattr(played._inner, "get_reward", None)
    if get_reward is None:
        raise RewardError(f"the environment {type(played._inner).__name__} does not score itself (it has no "
                          "get_reward)")
    return get_reward()


def tool_methods(kind: type) -> dict[str, Callable]:
    """An environment class's tools: its public functions but reset and get_reward (what TRL shows the model)."""
    return {name: function for name, function in inspect.getmembers(kind, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in NOT_TOOLS}


def environment_tools(environment: Played | type[Played]) -> list[Callable]:
    """What the model may call of a Played environment (a conversation's), or of its class (their schemas)."""
    kind = environment if inspect.isclass(environment) else type(environment)
    return [getattr(environment, name) for name in tool_methods(kind)]


def environment_class(spec, base_dir: str | None, where: str) -> type:
    """The class of an environment spec: a bundled one, or the user's (its code loaded here); ConfigError when it
    is not a class with ``reset``."""
    if spec.kind in BUNDLED:
        return BUNDLED[spec.kind]
    from ..rewards.code import load_function

    kind, label = load_function(spec.code, spec.file, spec.class_name, f"dragon_environment_{spec.name}", base_dir,
                                where, ENVIRONMENT_USAGE)
    if not inspect.isclass(kind) or not callable(getattr(kind, "reset", None)):
        raise ConfigError(f"{label}: {spec.class_name} must be a class with a reset method; define "
                          f"{ENVIRONMENT_USAGE}.")
    if not tool_methods(kind):
        raise ConfigError(f"{label}: {spec.class_name} has no public method for the model to call besides reset "
                          "and get_reward.")
    return kind


def environment_factory(spec, base_dir: str | None = None, should_stop: Callable[[], bool] | None = None,
                        where: str = "tools[0]") -> type[Played]:
    """What TRL's ``environment_factory`` takes for one environment spec: a class whose instances are Played
    environments, each method bounded as every tool is."""
    kind = environment_class(spec, base_dir, where)
    methods = {name: _bounded_method(name, function, should_stop) for name, function in tool_methods(kind).items()}
    return type(kind.__name__, (Played,), {"_kind": kind, "__doc__": kind.__doc__, **methods})


def _bounded_method(name: str, function: Callable, should_stop: Callable[[], bool] | None) -> Callable:
    """The environment's method ``name`` as the model calls it: the same schema (signature and docstring), called on
    the conversation's own environment through bounds.answered."""
    @functools.wraps(function)
    def method(self, **arguments):
        return answered(getattr(self._inner, name), arguments, should_stop)

    return method


def check_playable(played: type[Played], reference: str | None, where: str) -> None:
    """Refuse, before a run starts, a row a bundled environment cannot be reset with (its reference answer is not a
    number); a custom environment's rows are its own to check."""
    check = getattr(played._kind, "_playable", None)
    if check is None:
        return
    try:
        check(reference)
    except ToolError as error:
        raise ConfigError(f"{where}: the {played.__name__} environment cannot play it: {error}.") from None

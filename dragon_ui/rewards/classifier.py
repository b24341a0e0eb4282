"""The ``classifier`` kind: a sequence-classification model scores each reply, by one label's probability or logit.

The model itself is loaded by the engine (``engine/reward_models.py``) and handed in as a :class:`Classifier`, so that
validating and scoring rewards stay free of torch. A reward model asked one reply at a time would run a forward pass
per reply; :meth:`ClassifierScorer.prepare` scores a whole batch at once (training's, evaluation's, a playground
group), and the per-reply calls that follow read those scores.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError, RewardError

if TYPE_CHECKING:
    from .spec import ClassifierReward


class Classifier(Protocol):
    """A loaded sequence-classification model, as the engine hands it over."""

    name: str
    labels: dict[int, str]  # index -> label, the model's id2label
    multi_label: bool  # each label is its own yes/no (sigmoid), not one choice among them (softmax)

    def logits(self, texts: list[str]) -> list[list[float]]: ...


Classifiers = Callable[[str], Classifier]  # the model named in a reward's settings, loaded (once) on the run's device


def label_index(labels: dict[int, str], label: str, model: str, where: str) -> int:
    """The index of ``label`` among a classifier's ``labels``: a label name (any case), or its index written as a
    number; ``model`` names the classifier in the error."""
    names = {name.casefold(): index for index, name in labels.items()}
    if label.casefold() in names:
        return names[label.casefold()]
    if label.isascii() and label.isdigit() and int(label) in labels:
        return int(label)
    shown = ", ".join(f"{index} {name}" for index, name in sorted(labels.items()))
    raise ConfigError(f"{where}.label {label!r} is not a label of {model}; its labels are: {shown}.")


class ClassifierScorer:
    """One label's probability (or logit) for each reply; ``prepare`` scores a batch in one go."""

    def __init__(self, spec: ClassifierReward, classifiers: Classifiers | None, where: str):
        if classifiers is None:
            self._classifier, self._index = None, 0
        else:
            self._classifier = classifiers(spec.model)
            self._index = label_index(self._classifier.labels, spec.label, spec.model, where)
        self._logit = spec.output == "logit"
        self._lock = threading.Lock()
        self._prepared: dict[str, float] = {}

    def prepare(self, completions: list[str]) -> None:
        """Score these replies in one batch, for the calls that follow (only the latest batch is kept)."""
        texts = list(dict.fromkeys(completions))
        scores = dict(zip(texts, self._scores(texts), strict=True))
        with self._lock:
            self._prepared = scores

    def __call__(self, prompt, completion, reference, row) -> float:
        with self._lock:
            prepared = self._prepared.get(completion)
        return prepared if prepared is not None else self._scores([completion])[0]

    def _scores(self, texts: list[str]) -> list[float]:
        if self._classifier is None:
            raise RewardError("the classifier model is not loaded here (the run, evaluation and the Rewards tab "
                              "load it)")
        return [self._score(row, self._classifier.multi_label) for row in self._classifier.logits(texts)]

    def _score(self, logits: list[float], multi_label: bool) -> float:
        value = logits[self._index]
        if self._logit:
            return value
        if multi_label:
            return 1 / (1 + math.exp(-value)) if value >= 0 else math.exp(value) / (1 + math.exp(value))
        top = max(logits)
        return math.exp(value - top) / sum(math.exp(v - top) for v in logits)

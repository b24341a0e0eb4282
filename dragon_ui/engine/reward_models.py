"""Classifier models for the ``classifier`` reward kind: loaded once per model and device, shared by a training, its
evaluation and the playground, and asked in batches.

A classifier is loaded the way a starting model is (a Hub id, the Hugging Face cache when the Hub cannot be reached,
or a local folder), never with the repository's own code, and in a public demo only from the owner's allow-list.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

from ..config import ModelConfig
from ..errors import ConfigError, first_line
from ..rewards.classifier import label_index
from .libraries import import_all
from .models import resolve_model

BATCH = 16  # replies per forward pass
MAX_TOKENS = 512  # a reply longer than this is read up to here (most classifiers were trained on 512 at most)


@dataclass
class LoadedClassifier:
    """A sequence-classification model and its tokenizer on one device; ``logits`` takes turns (a lock) and
    remembers the last batch, which several rewards naming the same model ask for in a row."""

    name: str
    model: Any
    tokenizer: Any
    device: str
    labels: dict[int, str] = field(default_factory=dict)
    multi_label: bool = False
    max_tokens: int = MAX_TOKENS  # what it reads of a reply: MAX_TOKENS, or less where its positions end sooner
    empty: str = ""  # what it reads for an empty reply: "", or its pad token where "" gives no token at all
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last: tuple[list[str], list[list[float]]] = ([], [])

    def logits(self, texts: list[str]) -> list[list[float]]:
        import torch

        with self._lock:
            if texts == self._last[0]:
                return self._last[1]
            out: list[list[float]] = []
            read = [text or self.empty for text in texts]
            with torch.inference_mode():
                for start in range(0, len(read), BATCH):
                    batch = self.tokenizer(read[start:start + BATCH], return_tensors="pt", padding=True,
                                           truncation=True, max_length=self.max_tokens).to(self.device)
                    out += self.model(**batch).logits.float().cpu().tolist()
            self._last = (list(texts), out)
            return out


def classifier_source(model_id: str):
    """Where a classifier's weights come from (as a starting model's do), never a finished run (its adapter is a
    language model's). A public demo refuses the classifiers it does not offer with the run's settings
    (``rewards.public_refusal``), before any is looked up."""
    source = resolve_model(ModelConfig(id=model_id))
    if source.adapters:
        raise ConfigError(f"{model_id} is a training run, not a sequence-classification model.")
    return source


def check_labels(spec, where: str) -> None:
    """The label exists in the classifier's config (read without its weights), so a typo is found by Check."""
    import_all()  # the first use of transformers and torch waits for an import under way
    from transformers import AutoConfig

    source = classifier_source(spec.model)
    try:
        config = AutoConfig.from_pretrained(source.path, local_files_only=source.local_files_only)
    except Exception as exc:  # noqa: BLE001 - any failure to read it means the same to the user
        raise ConfigError(f"{where}.model {spec.model} cannot be read: {first_line(exc) or type(exc).__name__}") from None
    _check_architecture(config, spec.model)
    label_index(_labels(config), spec.label, spec.model, where)


def _labels(config) -> dict[int, str]:
    return {int(index): str(name) for index, name in (config.id2label or {}).items()}


def _check_architecture(config, model_id: str) -> None:
    """A language model loads as a classifier too, with a random head whose scores are noise: refused."""
    architectures = config.architectures or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        shown = ", ".join(architectures) or "none given"
        raise ConfigError(f"{model_id} is not a sequence-classification model (its architecture: {shown}), so its "
                          "classification head would be untrained and its scores noise.")


_loading = threading.Lock()  # one classifier loads at a time, so visitors asking at once share one copy


def load_classifier(model_id: str, device: str) -> LoadedClassifier:
    """The classifier ``model_id`` on ``device``, loaded on first use and kept (the four most recent)."""
    import_all()  # the first use of transformers and torch waits for an import under way
    with _loading:
        return _load(model_id.strip(), _device_name(device))


def _device_name(device: str) -> str:
    """One spelling per device ("cuda" and "cuda:0" are the same GPU), so a model is loaded once on it."""
    import torch

    named = torch.device(device)
    if named.type == "cuda" and named.index is None:
        named = torch.device("cuda", torch.cuda.current_device())
    return str(named)


@functools.lru_cache(maxsize=4)
def _load(model_id: str, device: str) -> LoadedClassifier:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source = classifier_source(model_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, local_files_only=source.local_files_only)
        model = AutoModelForSequenceClassification.from_pretrained(source.path,
                                                                   local_files_only=source.local_files_only)
    except Exception as exc:  # noqa: BLE001 - a missing file, a wrong format, an unknown architecture: all "cannot"
        raise ConfigError(f"{model_id} cannot be loaded as a sequence-classification model: "
                          f"{first_line(exc) or type(exc).__name__}") from None
    _check_architecture(model.config, model_id)
    if tokenizer.pad_token is None:  # decoder classifiers (GPT-2 style) pad with their end token
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device).eval()
    positions = getattr(model.config, "max_position_embeddings", None) or MAX_TOKENS
    empty = "" if tokenizer("")["input_ids"] else tokenizer.pad_token  # a model cannot read zero tokens
    return LoadedClassifier(model_id, model, tokenizer, device, _labels(model.config),
                            model.config.problem_type == "multi_label_classification", min(MAX_TOKENS, positions),
                            empty)


def classifiers_on(device: str):
    """The loader a run or the playground hands to ``build_rewards``: each classifier on ``device``."""
    return lambda model_id: load_classifier(model_id, device)

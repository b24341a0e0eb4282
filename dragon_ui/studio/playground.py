"""What the Data tab preview and the Rewards playground compute, without gradio, so tests can call it directly.

Both show what training will see before a run starts: the same loading and mapping (data/mapping.py), the model's own chat
template, the one scoring function (rewards.score_completion) and GRPO's group-relative advantage. A mapping mistake
or a reward that gives every reply the same score then shows up here instead of twenty minutes into a run.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeGuard, overload
from dataclasses import dataclass, field, replace

from ..config import Draft, GRPOSettings, HardwareSettings, ModelConfig, RunConfig
from ..engine.hardware import resolve_hardware
from ..engine.prompts import NO_LIMIT, prompt_limit, token_counts
from ..chat import completion_text, turns_text
from ..engine.evaluation import sampled_replies, sampled_turns, score_examples
from ..engine.tool_calls import ToolUse, ready_for_tools, tool_use
from ..engine.redteam import RedTeam, red_team
from ..engine.reward_models import classifiers_on
from ..data import (MIN_ROWS_FOR_EVAL, DataConfig, HubDataset, columns_of, locate, map_rows, prompt_text, read_table,
                   rows_to_read)
from ..errors import ConfigError, DragonError, Stopped, first_line
from ..grpo_math import advantages, has_spread
from ..public import Policy
from ..rewards import (Reward, ScoreResult, build_rewards, cannot_pay, counts_tokens, parse_rewards,
                       score_completion)
from ..rewards.scoring import MOST_REFERENCES
from ..data.tables import Table

PREVIEW_ROWS = 20  # rows shown in the preview table (and offered in the playground)
RENDERED_ROWS = 3  # rows whose full chat prompt is shown
LENGTH_SAMPLE = 2000  # prompts measured for the length statistics; enough for min/mean/max, fast on big datasets
TOKENIZER_RETRY_S = 60  # a tokenizer that failed to load (e.g. the Hub was unreachable) is tried again after this

# Column names that usually hold the prompt / the reference answer, tried in this order when a new file arrives.
PROMPT_GUESSES = ("prompt", "question", "problem", "instruction", "query", "input", "text")
REFERENCE_GUESSES = ("answer", "reference", "solution", "target", "output", "label", "response")

_CACHED_TABLES = 4
_tables: OrderedDict[tuple | None, Table] = OrderedDict()
_tables_lock = threading.Lock()
Tokenizer = tuple[Any, str]  # (the tokenizer, or None where it cannot be loaded; the note that says which)
_Cached = tuple[Any, str, float]  # (tokenizer or None, note, time of failure)
_tokenizers: dict[tuple, _Cached] = {}
_tokenizers_lock = threading.Lock()


# --------------------------------------------------------------------------------------------- data preview


@dataclass
class LengthStats:
    """Prompt lengths as the model will see them (tokens, chat template included), or in words without a tokenizer."""

    unit: str  # "tokens" or "words"
    minimum: int
    mean: float
    maximum: int
    measured: int  # prompts measured (at most LENGTH_SAMPLE)
    total: int  # prompts in the dataset
    limit: int | None = None  # the most tokens a prompt may have (engine.prompts), where known
    too_long: int = 0  # measured prompts longer than the limit: training drops them

    def summary(self) -> str:
        scope = (f"all {self.total} prompts" if self.measured == self.total
                 else f"the first {self.measured} of {self.total} prompts")
        text = (f"Prompt length in {self.unit}: min {self.minimum}, mean {self.mean:.1f}, max {self.maximum} "
                f"({scope}).")
        if self.too_long:
            text += (f" {self.too_long} of them {'is' if self.too_long == 1 else 'are'} longer than {self.limit} "
                     "tokens (data.max_prompt_tokens) and will be dropped when the run starts.")
        return text


@dataclass
class DataPreview:
    """Everything the Data tab shows for one data setting. ``error`` is set instead of raising."""

    columns: list[str]
    rows: list[dict]  # the first PREVIEW_ROWS rows of the file, every value as display text
    rendered: list[str]  # the full prompt text of the first RENDERED_ROWS examples
    rendered_note: str  # how ``rendered`` was made: the model's chat template, or plain text and why
    n_rows: int = 0
    n_train: int = 0
    n_eval: int = 0
    n_skipped: int = 0
    n_dropped: int = 0  # training rows the difficulty filter leaves out (data.pass_rates)
    held_out_reason: str = ""  # why more rows are held out than the fraction asks for (MappedData.held_out_reason)
    notes: list[str] = field(default_factory=list)  # how the file was read: encoding, sheet, repaired lines
    sheets: list[str] = field(default_factory=list)  # a spreadsheet's sheet names
    lengths: LengthStats | None = None
    error: str | None = None
    error_field: str | None = None  # "source" when the data could not be read, "mapping" when it could not be mapped

    def counts_summary(self) -> str:
        """One or two sentences with the split, e.g. '400 rows: 380 for training, 20 held out, 0 skipped.'."""
        rows = f"{self.n_rows} row" + ("" if self.n_rows == 1 else "s")
        text = f"{rows}: {self.n_train} for training, {self.n_eval} held out, {self.n_skipped} skipped."
        if self.n_skipped:
            text += " Skipped rows gave an empty prompt."
        if self.n_dropped:
            text += (f" The difficulty filter leaves out {self.n_dropped} more training row"
                     f"{'s' if self.n_dropped > 1 else ''}, by the pre-flight's pass rates.")
        if self.held_out_reason:
            text += " " + self.held_out_reason
        if self.n_eval == 0 and self.n_train < MIN_ROWS_FOR_EVAL:
            text += (f" With fewer than {MIN_ROWS_FOR_EVAL} usable rows nothing is held out, so there will be no "
                     "before/after evaluation.")
        if self.notes:
            text += " " + " ".join(self.notes)
        return text


def load_rows(data: DataConfig, base_dir: str | None = None, *, policy: Policy) -> Table:
    """read_table with a small cache, so editing the mapping does not re-read (or re-download) the data each time.

    A local file is cached by its modification time and size (and the sheet and rows read), so saving it again is
    seen. Callers must not modify the returned rows.
    """
    place = locate(data.source, base_dir, policy=policy)  # a public demo refuses here, before the disk is looked at
    limit = rows_to_read(data.max_rows, policy=policy)
    key: tuple | None
    if isinstance(place, HubDataset):
        key = (place.id, data.hub_config, data.hub_split, limit, policy)
    elif place.is_file():
        stat = place.stat()
        key = (str(place), stat.st_mtime_ns, stat.st_size, data.sheet, limit, policy)
    else:
        key = None  # a missing path or a folder: read_table explains the problem, and nothing is cached
    with _tables_lock:
        if key in _tables:
            _tables.move_to_end(key)
            return _tables[key]
    table = read_table(data.source, data.hub_config, data.hub_split, base_dir=base_dir, sheet=data.sheet,
                       max_rows=data.max_rows, policy=policy)
    with _tables_lock:
        _tables[key] = table
        while len(_tables) > _CACHED_TABLES:
            _tables.popitem(last=False)
    return table


def error_field(message: str) -> str:
    """Where the UI shows a data error: next to the source (file, sheet, Hub id, split) or under the mapping."""
    return "source" if message.startswith(("data.source", "data.hub", "data.sheet")) else "mapping"


def display_text(value, limit: int = 300) -> str:
    """A cell as one short line of text for the preview table; nested values as JSON."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain_prompt(messages: list[dict]) -> str:
    """A chat prompt as 'system: ...' / 'user: ...' lines, for when no chat template is available."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def render_prompt(messages: list[dict], tokenizer) -> str:
    """The exact text the model reads: the chat template with the assistant turn opened, as in generation."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _render_all(examples: list[dict], tokenizer, tokenizer_note: str) -> tuple[list[str], str, bool]:
    """(texts, note, templated): every prompt through the chat template, or all as plain text with the reason."""
    if tokenizer is not None:
        try:
            return [render_prompt(ex["prompt"], tokenizer) for ex in examples], tokenizer_note, True
        except Exception as exc:  # templates raise on messages they do not support (e.g. a system role)
            reason = first_line(exc) or type(exc).__name__
            note = f"Shown as plain text because the model's chat template rejected these messages ({reason})."
            return [plain_prompt(ex["prompt"]) for ex in examples], note, False
    return [plain_prompt(ex["prompt"]) for ex in examples], tokenizer_note, False


def prompt_lengths(texts: list[str], total: int, tokenizer=None, limit: int | None = None) -> LengthStats | None:
    """Length statistics of the given prompt texts, in tokens with a tokenizer, else in words; with a token
    ``limit``, how many are longer."""
    if not texts:
        return None
    if tokenizer is not None:
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        unit = "tokens"
    else:
        lengths = [len(text.split()) for text in texts]
        unit = "words"
    too_long = sum(length > limit for length in lengths) if limit is not None and tokenizer is not None else 0
    return LengthStats(unit, min(lengths), sum(lengths) / len(lengths), max(lengths), len(texts), total, limit,
                       too_long)


def preview_data(data: DataConfig, base_dir: str | None = None, tokenizer=None, tokenizer_note: str = "",
                 prompt_limit: int | None = None, *, policy: Policy) -> DataPreview:
    """Load, map and measure a data setting the way training will; problems come back as ``error``, never raised.

    ``tokenizer`` (with ``tokenizer_note`` saying whose chat template it is) renders prompts and counts tokens;
    without one, prompts are plain 'system:/user:' text, measured in words, and the note says why.
    """
    empty = DataPreview(columns=[], rows=[], rendered=[], rendered_note=tokenizer_note)
    try:
        data.validate()
    except ConfigError as exc:
        if error_field(str(exc)) == "source":
            return replace(empty, error=str(exc), error_field="source")
    try:
        loaded = load_rows(data, base_dir, policy=policy)
    except ConfigError as exc:
        return replace(empty, error=str(exc), error_field="source")
    rows = loaded.rows
    columns = columns_of(rows)
    table = [{column: display_text(row.get(column)) for column in columns} for row in rows[:PREVIEW_ROWS]]
    preview = replace(empty, columns=columns, rows=table, notes=loaded.notes, sheets=loaded.sheets)
    try:
        mapped = map_rows(rows, data, policy=policy)
    except ConfigError as exc:
        return replace(preview, error=str(exc), error_field="mapping")
    try:  # the first rows in file order, unsplit; they may all be empty even when later rows are not
        examples = map_rows(rows[:PREVIEW_ROWS], every_row(data), policy=policy).train
    except ConfigError:
        examples = []
    everything = mapped.train + mapped.eval
    texts, note, templated = _render_all(everything[:LENGTH_SAMPLE], tokenizer, tokenizer_note)
    shown, _, _ = _render_all(examples[:RENDERED_ROWS], tokenizer if templated else None, note)
    return replace(
        preview, rendered=shown, rendered_note=note, n_rows=mapped.n_rows,
        n_train=len(mapped.train), n_eval=len(mapped.eval), n_skipped=mapped.n_skipped,
        n_dropped=len(mapped.dropped), held_out_reason=mapped.held_out_reason(),
        lengths=prompt_lengths(texts, len(everything), tokenizer, prompt_limit),
    )


def prompt_limit_of(draft: Draft, setting: DataConfig, *, policy: Policy) -> int | None:
    """The prompt length a run of the draft would keep to, where the form alone says it (engine.prompts.prompt_limit
    without the model's context, which is checked when the run starts); None for no limit."""
    try:
        device = resolve_hardware(HardwareSettings(**(draft.get("hardware") or {}))).device
    except (DragonError, TypeError):
        device = "cpu"  # the form's hardware is refused on its own tab; here, the strictest limit
    limit, _ = prompt_limit(RunConfig(data=setting), device, None, policy=policy)
    return None if limit == NO_LIMIT else limit


def every_row(data: DataConfig) -> DataConfig:
    """``data`` mapping every row, in file order: nothing held out, cut short or left out by the difficulty filter
    (the previews' and the playground's rows)."""
    return replace(data, eval_frac=0.0, max_rows=None, pass_rates=None)


def preview_examples(data: DataConfig, base_dir: str | None = None, *, policy: Policy, first: int = 1,
                     count: int = PREVIEW_ROWS) -> list[dict]:
    """``count`` rows from row ``first`` of the file (1-based) as examples, in file order, unsplit and unfiltered,
    each numbered by its row ("number"): the playground's rows, the first PREVIEW_ROWS of them offered, any other
    one opened from the pre-flight. A row with an empty prompt gives no example.

    Raises ConfigError with the sentence to show when the data cannot be read or mapped, or has no row ``first``.
    """
    data.validate()
    rows = load_rows(data, base_dir, policy=policy).rows
    if rows and not 1 <= first <= len(rows):  # no rows at all: map_rows says so in its words
        raise ConfigError(f"The data has {len(rows):,} rows; there is no row {first:,}.")
    return map_rows(rows[first - 1:first - 1 + count], every_row(data), policy=policy, first_row=first).train


def fit_mapping(data: DataConfig, rows: list[dict], *, policy: Policy) -> tuple[DataConfig, list[str]]:
    """Adapt the mapping to a newly chosen table: settings that name columns it lacks are replaced by a good guess.

    Returns the new setting and one sentence per change, so the user sees what was picked for them. Settings that
    already work are kept as they are.
    """
    columns = columns_of(rows)
    sample = rows[:PREVIEW_ROWS]
    notes: list[str] = []
    for _ in range(3):  # prompt, reference, system: each is fixed at most once
        try:
            map_rows(sample, every_row(data), policy=policy)
            break
        except ConfigError as exc:
            message = str(exc)
        prompt_guess = _guess(columns, PROMPT_GUESSES) or columns[0]
        if message.startswith("data.prompt") and data.prompt != prompt_guess:
            notes.append(f"The prompt now uses the column '{prompt_guess}' ('{data.prompt}' does not fit this data).")
            data = replace(data, prompt=prompt_guess)
        elif message.startswith("data.reference") and data.reference:
            guess = _guess(columns, REFERENCE_GUESSES)
            notes.append(f"The reference now uses the column '{guess}' ('{data.reference}' does not fit this data)."
                         if guess else f"The reference '{data.reference}' does not fit this data, so it was cleared.")
            data = replace(data, reference=guess)
        elif message.startswith("data.system") and data.system:
            notes.append(f"The system message '{data.system}' does not fit this data, so it was cleared.")
            data = replace(data, system=None)
        else:
            break  # not a mapping problem (or not one a guess can fix): preview_data will explain it
    return data, notes


def _guess(columns: list[str], names: tuple[str, ...]) -> str | None:
    lowered = {column.lower(): column for column in columns}
    return next((lowered[name] for name in names if name in lowered), None)


PLAIN_PREVIEW = "Shown as plain system:/user: text, with lengths in words"  # what the Data tab does without a tokenizer


@overload
def preview_tokenizer(model: ModelConfig, wait: Literal[True] = ..., *, policy: Policy) -> Tokenizer: ...
@overload
def preview_tokenizer(model: ModelConfig, wait: bool, *, policy: Policy) -> Tokenizer | None: ...
def preview_tokenizer(model: ModelConfig, wait: bool = True, *, policy: Policy) -> Tokenizer | None:
    """(tokenizer, note) of the starting model, loaded once per model; (None, reason) when it cannot be loaded.

    Only the tokenizer is loaded, so the data preview stays cheap. The offline copy of the default model is the one
    exception: it is converted once (about 20 s) before its tokenizer can be read. A failure is remembered for
    TOKENIZER_RETRY_S seconds, so editing the mapping does not retry an unreachable Hub on every change. Without
    ``wait``, None when the tokenizer is not loaded yet (or is being loaded): the preview shows its table meanwhile.
    """
    from ..engine.models import load_tokenizer, resolve_model
    from ..engine.public_checks import PublicDemoRefusal, check_model

    try:
        check_model(model, policy=policy)  # a public demo loads no tokenizer of a model it does not offer
    except PublicDemoRefusal as refusal:
        return None, f"{PLAIN_PREVIEW}: {refusal}"
    key = (model.id.strip(), model.revision, model.trust_remote_code)
    cached = _tokenizers.get(key)
    if _usable(cached):  # without the lock, which another model's load may hold for seconds
        return cached[0], cached[1]
    if not wait:
        return None
    with _tokenizers_lock:  # held while loading, so concurrent previews wait for one load instead of repeating it
        cached = _tokenizers.get(key)
        if _usable(cached):
            return cached[0], cached[1]
        try:
            source = resolve_model(model)
            _tokenizers[key] = (load_tokenizer(source), f"Rendered with the chat template of {source.label}.", 0.0)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, DragonError) else f"{type(exc).__name__}: {exc}"
            _tokenizers[key] = (None, f"{PLAIN_PREVIEW}, because the "
                                      f"tokenizer of {model.id} could not be loaded: {reason.splitlines()[0]}",
                                time.monotonic())
        return _tokenizers[key][0], _tokenizers[key][1]


def _usable(cached: _Cached | None) -> TypeGuard[_Cached]:
    """Whether a cached tokenizer (or its failure, while it is recent) answers without loading."""
    return cached is not None and (cached[0] is not None or time.monotonic() - cached[2] < TOKENIZER_RETRY_S)


@overload
def draft_tokenizer(draft: Draft, wait: Literal[True] = ..., *, policy: Policy) -> Tokenizer: ...
@overload
def draft_tokenizer(draft: Draft, wait: bool, *, policy: Policy) -> Tokenizer | None: ...
def draft_tokenizer(draft: Draft, wait: bool = True, *, policy: Policy) -> Tokenizer | None:
    """(tokenizer, note) of the draft's starting model, as preview_tokenizer gives it (None: not loaded yet, and
    not ``wait``)."""
    model = draft.get("model") or {}
    if not isinstance(model, dict) or not isinstance(model.get("id"), str) or not model["id"].strip():
        return None, f"{PLAIN_PREVIEW}, because no starting model is chosen yet."
    revision = model.get("revision")
    if revision is not None and not isinstance(revision, str):
        return None, f"{PLAIN_PREVIEW}: model.revision must be text."
    config = ModelConfig(id=model["id"], revision=revision or None,
                         trust_remote_code=model.get("trust_remote_code") is True)
    try:
        config.validate()
    except ConfigError as exc:
        return None, f"{PLAIN_PREVIEW}: {first_line(exc)}"
    return preview_tokenizer(config, wait, policy=policy)


def unpayable(rewards: list, data: DataConfig, base_dir: str | None, *, policy: Policy) -> list[str]:
    """Why each of ``rewards`` (a draft's list) that compares with the reference cannot pay on ``data``'s first
    references (rewards.cannot_pay), a sentence each; [] while the list or the data cannot be read (their own
    problems are shown where they are)."""
    try:
        specs = parse_rewards(rewards, policy=policy, load_code=False)
        examples = preview_examples(data, base_dir, policy=policy, count=MOST_REFERENCES) if data.source else []
    except DragonError:
        return []
    return list(_unpayable(json.dumps([spec.to_dict() for spec in specs], sort_keys=True),
                           tuple(example.get("reference") or "" for example in examples), policy=policy))


@functools.lru_cache(maxsize=64)  # the form asks again at each edit; a math check takes a moment
def _unpayable(specs: str, references: tuple[str, ...], *, policy: Policy) -> tuple[str, ...]:
    return tuple(cannot_pay(parse_rewards(json.loads(specs), policy=policy, load_code=False), list(references),
                            policy=policy).values())


def data_config(draft: Draft) -> DataConfig:
    """The data section of a draft (a RunConfig.to_dict() shape) as a DataConfig; a missing section is empty."""
    try:
        return DataConfig(**(draft.get("data") or {}))
    except TypeError as exc:
        raise ConfigError(f"The data settings of this draft are not valid ({exc}); load a recipe again.") from None


# --------------------------------------------------------------------------------------------- reward playground


PLAYGROUND_DEVICE = "cpu"  # a typed reply's classifier rewards: one reply needs no GPU, and a training may hold it


def playground_rewards(draft: Draft, *, policy: Policy) -> list[Reward]:
    """The draft's rewards, validated and built as a run builds them; TRL's length and repetition rewards count with
    the starting model's tokenizer (loaded only for them) up to the draft's max new tokens; classifiers are loaded
    (once) on the CPU."""
    specs = parse_rewards(draft.get("rewards") or [], policy=policy)
    tokenizer = draft_tokenizer(draft, policy=policy)[0] if counts_tokens(specs) else None
    return build_rewards(specs, base_dir=draft.get("base_dir") or None, tokenizer=tokenizer,
                         max_new_tokens=draft_max_new_tokens(draft), classifiers=classifiers_on(PLAYGROUND_DEVICE),
                         policy=policy)


def draft_max_new_tokens(draft: Draft) -> int | None:
    """The draft's grpo.max_new_tokens, validated (at most 32,768); None while the Model tab is half typed."""
    try:
        grpo = GRPOSettings(**(draft.get("grpo") or {}))
        grpo.validate()
    except (ConfigError, TypeError):
        return None
    return grpo.max_new_tokens


def sampling_rewards(config: RunConfig, tokenizer, device: str, *, policy: Policy) -> list[Reward]:
    """The rewards a sampled group is scored with: the run's, as a run builds them, classifiers on the model's
    device."""
    return build_rewards(config.rewards, base_dir=config.base_dir or None, tokenizer=tokenizer,
                         max_new_tokens=config.grpo.max_new_tokens, classifiers=classifiers_on(device), policy=policy)


def score_example(rewards: list[Reward], example: dict, completion: str,
                  time_limit_s: float | None = None) -> ScoreResult:
    """Score one reply to a mapped example exactly as training and evaluation do; ConfigError once the rewards
    have taken ``time_limit_s`` (a public demo's), before the next one scores."""
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    try:
        return score_completion(rewards, completion, reference=example.get("reference") or None,
                                prompt=prompt_text(example), row=json.loads(example.get("row") or "{}"),
                                should_stop=None if deadline is None else lambda: time.monotonic() > deadline)
    except Stopped:
        raise ConfigError(f"Scoring stopped: the rewards took longer than this public demo's limit of "
                          f"{time_limit_s:g} seconds on one reply; use fewer rewards, or faster ones.") from None


@dataclass(frozen=True)
class GroupScores:
    """The replies to one prompt, scored (the advantages come with the other groups sampled with it: advantages_of)."""

    prompt: str
    reference: str
    completions: list[str]
    results: list[ScoreResult]

    @property
    def totals(self) -> list[float]:
        return [result.total for result in self.results]

    @property
    def reward_names(self) -> list[str]:
        return list(self.results[0].scores) if self.results else []


def score_group(rewards: list[Reward], example: dict, completions: list[str],
                should_stop: Callable[[], bool] | None = None) -> GroupScores:
    """Score every completion of one prompt; Stopped once ``should_stop()``."""
    results = score_examples(rewards, [example] * len(completions), completions, should_stop)
    return GroupScores(prompt_text(example), example.get("reference", ""), list(completions), results)


def advantages_of(groups: list[GroupScores], rewards: list[Reward], grpo: GRPOSettings) -> list[list[float]]:
    """GRPO's advantage of every reply, the groups sampled together taken as one step's batch, with the run's
    scale_rewards and multi_objective_aggregation: the advantages training would give them."""
    return advantages([[result.scores for result in group.results] for group in groups],
                      {reward.name: reward.weight for reward in rewards}, grpo.scale_rewards,
                      grpo.multi_objective_aggregation, totals=[group.totals for group in groups]).values


def no_signal_warning(group: GroupScores) -> str | None:
    """The sentence to show when every reply of a group scored the same: GRPO then has nothing to learn from it."""
    totals = group.totals
    if len(totals) < 2 or has_spread(totals):  # a lone reply is no group to warn about
        return None
    return (f"All {len(totals)} replies to this prompt scored {totals[0]:.2f}: GRPO learns nothing from this group. "
            "Try a higher temperature, a larger group, partial-credit rewards (length, format, json keys), "
            "or easier prompts.")


def reward_failures(group: GroupScores) -> list[str]:
    """One sentence per reward that failed on some replies (a failure scores 0), with its first error message."""
    failures: dict[str, tuple[int, str]] = {}
    for result in group.results:
        for name, error in result.errors.items():
            count, first = failures.get(name, (0, error))
            failures[name] = (count + 1, first)
    return [f"The reward {name} failed on {count} of {len(group.results)} replies (scored 0): {first}"
            for name, (count, first) in failures.items()]


def refuse_long_prompts(examples: list[dict], tokenizer, limit: int | None, tools: ToolUse | None = None) -> None:
    """Refuse to sample a row whose prompt a run would drop (engine.prompts, the ``tools``' schemas counted): the
    group would show what training never sees, and a long prompt takes the machine for minutes."""
    if limit is None:
        return
    for example, length in zip(examples, token_counts(examples, tokenizer, tools.every_function if tools else None),
                               strict=True):
        if length > limit:
            raise ConfigError(f"Row {example['number']}'s prompt has {length:,} tokens, more than the {limit:,} a "
                              "run keeps (data.max_prompt_tokens), so a run would drop it; try another row.")


def generate_groups(model, tokenizer, rewards: list[Reward], examples: list[dict], grpo: GRPOSettings,
                    should_stop: Callable[[], bool] | None = None,
                    on_replies: Callable[[list[str]], None] | None = None,
                    tools: ToolUse | None = None) -> Iterator[GroupScores]:
    """Sample ``grpo.group_size`` replies to each example, as one GRPO step would (its temperature, length cap and
    sampling settings, calling its ``tools``), and yield each prompt's scored group.

    ``should_stop`` is asked after every token: once it is true, generation ends (evaluation.Stopped).
    ``on_replies`` sees the replies to the prompt being sampled as they grow (evaluation.generate_replies; not
    with tools, whose replies come whole).
    """
    for example in examples:
        group = [example] * grpo.group_size
        if tools is None:
            yield score_group(rewards, example, sampled_replies(model, tokenizer, group, grpo, None, should_stop,
                                                                on_replies), should_stop)
            continue
        episodes = tools.episodes(group)  # each reply plays its own environment, if the run has one
        turns = sampled_turns(model, tokenizer, episodes, grpo, tools, should_stop)
        results = score_examples(rewards, episodes, [completion_text(reply) for reply in turns], should_stop)
        yield GroupScores(prompt_text(episodes[0]), example.get("reference", ""),
                          [turns_text(reply) for reply in turns], results)  # scored on the answers


def sampling_tools(config: RunConfig, examples: list[dict], tokenizer,
                   *, policy: Policy) -> tuple[list[dict], object, ToolUse | None]:
    """(the examples with the tools' worked examples before each question, the tokenizer able to show the tools,
    the tools) for a playground group of a run with tools, as the run would sample it; unchanged without tools."""
    tools = tool_use(config, examples, policy=policy)
    if tools is None:
        return examples, tokenizer, None
    return tools.shown(examples), ready_for_tools(tokenizer, config.model.id), tools


def red_team_draft(draft: Draft, *, policy: Policy) -> RedTeam:
    """The red team (engine.redteam) of the draft's rewards on the playground's rows, padded to its max new tokens.
    In a public demo it stops at the limit on scoring a typed reply, and says so."""
    rewards = playground_rewards(draft, policy=policy)
    examples = preview_examples(data_config(draft), draft.get("base_dir") or None, policy=policy)
    max_new_tokens = draft_max_new_tokens(draft) or GRPOSettings().max_new_tokens  # half typed: the default
    if policy.limits:  # no run here makes longer replies
        max_new_tokens = min(max_new_tokens, policy.limits.max_new_tokens)
    limit = policy.limits.scoring_seconds if policy.limits else None
    try:
        return red_team(rewards, examples, max_new_tokens, draft_tokenizer(draft, policy=policy)[0],
                        time_limit_s=limit)
    except Stopped:
        raise ConfigError(f"The red team stopped: the rewards took longer than this public demo's limit of "
                          f"{limit:g} seconds; use fewer rewards, or faster ones.") from None

"""Tests for dragon_ui.studio.playground: the data preview and the reward playground's group scoring, without a browser."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dragon_ui.config import GRPOSettings, ModelConfig
from dragon_ui.errors import Stopped
from dragon_ui.data import DataConfig, prompt_text, read_table
from dragon_ui.studio.playground import (
    PREVIEW_ROWS,
    RENDERED_ROWS,
    advantages_of,
    data_config,
    fit_mapping,
    generate_groups,
    load_rows,
    no_signal_warning,
    preview_data,
    preview_examples,
    preview_tokenizer,
    reward_failures,
    score_group,
)
from dragon_ui.rewards import build_rewards, parse_rewards
from dragon_ui import ASSETS_DIR
from dragon_ui.studio.backend import Studio
from dragon_ui.public import LAPTOP

DATASETS = ASSETS_DIR / "datasets"
ARITHMETIC = DataConfig(source=str(DATASETS / "arithmetic.csv"), prompt="question", reference="answer")


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def example(question: str, reference: str = "", system: str = "") -> dict:
    """An example as data.map_rows makes it."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"prompt": messages, "reference": reference, "row": json.dumps({"question": question, "answer": reference})}


# --------------------------------------------------------------------------------------------- data preview


@pytest.mark.parametrize("recipe", Studio(runs_dir="unused", policy=LAPTOP).recipes.names())
def test_preview_of_each_bundled_dataset(recipe):
    data = DataConfig(**Studio(runs_dir="unused", policy=LAPTOP).recipes.load(recipe)["data"])
    rows = read_table(data.source, policy=LAPTOP).rows
    preview = preview_data(data, policy=LAPTOP)
    assert preview.error is None
    assert preview.n_rows == len(rows)
    assert preview.n_train + preview.n_eval + preview.n_skipped == len(rows)
    assert preview.n_eval == round(len(rows) * data.eval_frac)
    assert preview.columns == list(rows[0])
    assert len(preview.rows) == PREVIEW_ROWS and set(preview.rows[0]) == set(preview.columns)
    assert all(isinstance(value, str) for row in preview.rows for value in row.values())
    assert len(preview.rendered) == RENDERED_ROWS
    first_prompt = prompt_text(preview_examples(data, policy=LAPTOP)[0])  # the playground's first row is the first rendered one
    assert first_prompt and first_prompt in preview.rendered[0]
    assert preview.rendered[0].startswith("system: " if data.system else "user: ")
    assert preview.lengths.unit == "words" and preview.lengths.total == preview.n_train + preview.n_eval
    assert 0 < preview.lengths.minimum <= preview.lengths.mean <= preview.lengths.maximum


def test_the_recipes_cover_every_bundled_dataset():
    studio = Studio(runs_dir="unused", policy=LAPTOP)
    used = {Path(studio.recipes.load(name)["data"]["source"]).name for name in studio.recipes.names()}
    bundled = {p.name for p in DATASETS.iterdir() if p.suffix in (".csv", ".jsonl")}
    assert used == bundled


@pytest.mark.parametrize("changes, field, fragment", [
    ({"prompt": "Q: {nope}"}, "mapping", "uses the column 'nope' in its template, but the file has no such column"),
    ({"prompt": "nope"}, "mapping", "is neither a column of the file nor a template"),
    ({"reference": "{answr}"}, "mapping", "data.reference uses the column 'answr'"),
    ({"prompt": ""}, "mapping", "data.prompt is empty"),
    ({"source": "missing.csv"}, "source", "no file at"),
    ({"source": ""}, "source", "data.source is empty"),
    ({"source": str(DATASETS / "make_datasets.py")}, "source", "unsupported file type '.py'"),
    ({"source": "someone/dataset"}, "source", "the Hugging Face Hub could not be reached"),
])
def test_preview_errors_are_sentences_for_the_right_field(changes, field, fragment):
    data = DataConfig(**{**ARITHMETIC.__dict__, **changes})
    preview = preview_data(data, policy=LAPTOP)
    assert fragment in preview.error
    assert preview.error_field == field
    assert preview.rendered == [] and preview.lengths is None
    # a mapping problem still shows the table, so the right column can be picked
    assert (preview.columns == ["question", "answer"]) == (field == "mapping")


def test_skipped_rows_and_small_files_are_explained(tmp_path):
    source = tmp_path / "few.jsonl"
    source.write_text("".join(json.dumps({"q": q, "a": "1"}) + "\n" for q in ["one", "", "three"]), encoding="utf-8")
    preview = preview_data(DataConfig(source=str(source), prompt="q", reference="a", eval_frac=0.5), policy=LAPTOP)
    assert (preview.n_rows, preview.n_train, preview.n_eval, preview.n_skipped) == (3, 2, 0, 1)
    summary = preview.counts_summary()
    assert "3 rows: 2 for training, 0 held out, 1 skipped." in summary
    assert "empty prompt" in summary and "nothing is held out" in summary


@pytest.mark.parametrize("rows, frac, expected", [
    (60, 0.05, "60 rows: 50 for training, 10 held out, 0 skipped. 10 rows are held out for the before/after "
               "comparison (5% would be only 3, too few to compare). Read as UTF-8."),
    (400, 0.05, "400 rows: 380 for training, 20 held out, 0 skipped. Read as UTF-8."),
    (60, 0.0, "60 rows: 60 for training, 0 held out, 0 skipped. Read as UTF-8."),
])
def test_the_counts_say_how_many_are_held_out_and_why(tmp_path, rows, frac, expected):
    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"q": f"question {i}"}) + "\n" for i in range(rows)), encoding="utf-8")
    assert preview_data(DataConfig(source=str(source), prompt="q", eval_frac=frac), policy=LAPTOP).counts_summary() == expected


def test_token_stats_use_the_chat_template(tiny_tokenizer):
    preview = preview_data(ARITHMETIC, tokenizer=tiny_tokenizer, tokenizer_note="Rendered with the tiny model.", policy=LAPTOP)
    texts = [tiny_tokenizer.apply_chat_template([{"role": "user", "content": row["question"]}],
                                                add_generation_prompt=True, tokenize=False)
             for row in read_table(ARITHMETIC.source, policy=LAPTOP).rows]
    lengths = [len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    stats = preview.lengths
    assert stats.unit == "tokens" and stats.measured == stats.total == 400
    assert (stats.minimum, stats.maximum) == (min(lengths), max(lengths))
    assert math.isclose(stats.mean, sum(lengths) / len(lengths))
    assert preview.rendered[0] == texts[0] and preview.rendered[0].endswith("<|assistant|>")
    assert preview.rendered_note == "Rendered with the tiny model."
    assert "Prompt length in tokens: min" in stats.summary() and "(all 400 prompts)" in stats.summary()


def test_a_template_that_rejects_the_messages_falls_back_to_plain_text(tiny_tokenizer):
    strict = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    strict.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                            "{% endif %}" + tiny_tokenizer.chat_template)
    data = DataConfig(**{**ARITHMETIC.__dict__, "system": "Be brief."})
    preview = preview_data(data, tokenizer=strict, tokenizer_note="Rendered with the tiny model.", policy=LAPTOP)
    assert preview.error is None
    assert "rejected these messages (System role not supported)" in preview.rendered_note
    assert preview.rendered[0] == "system: Be brief.\nuser: What is 66 + 24? Reply with just the number."
    assert preview.lengths.unit == "tokens"  # still counted with the model's tokenizer, on the plain text


def test_preview_tokenizer_is_cached_and_explains_failures(tiny_model_dir):
    tokenizer, note = preview_tokenizer(ModelConfig(id=str(tiny_model_dir)), policy=LAPTOP)
    assert tokenizer is not None and "chat template of local model" in note
    assert preview_tokenizer(ModelConfig(id=str(tiny_model_dir)), policy=LAPTOP)[0] is tokenizer
    missing, reason = preview_tokenizer(ModelConfig(id="/no/such/model"), policy=LAPTOP)
    assert missing is None
    assert "could not be loaded: model.id: no folder at /no/such/model" in reason


def test_a_failed_tokenizer_is_retried_only_after_a_while(monkeypatch, tmp_path):
    import dragon_ui.engine.models
    import dragon_ui.studio.playground

    calls = []
    real = dragon_ui.engine.models.resolve_model
    monkeypatch.setattr(dragon_ui.engine.models, "resolve_model", lambda config: calls.append(1) or real(config))
    model = ModelConfig(id=str(tmp_path / "not-yet"))
    assert preview_tokenizer(model, policy=LAPTOP)[0] is None and preview_tokenizer(model, policy=LAPTOP)[0] is None
    assert len(calls) == 1
    monkeypatch.setattr(dragon_ui.studio.playground, "TOKENIZER_RETRY_S", 0)
    assert preview_tokenizer(model, policy=LAPTOP)[0] is None and len(calls) == 2


def test_a_tokenizer_asked_for_without_waiting_answers_at_once_while_another_model_loads(tiny_model_dir,
                                                                                        monkeypatch):
    """Another model's tokenizer may take the lock for seconds (the default model's offline copy is converted first,
    a Hub model may time out): a preview that need not wait answers at once, with the tokenizer when it is cached
    and None (still to come) when it is not."""
    import threading

    import dragon_ui.studio.playground as playground

    cached, _ = preview_tokenizer(ModelConfig(id=str(tiny_model_dir)), policy=LAPTOP)
    loading, done = threading.Event(), threading.Event()
    held = threading.Thread(target=lambda: (playground._tokenizers_lock.acquire(), loading.set(), done.wait(),
                                            playground._tokenizers_lock.release()))
    held.start()
    try:
        assert loading.wait(10)
        assert preview_tokenizer(ModelConfig(id=str(tiny_model_dir)), wait=False, policy=LAPTOP)[0] is cached
        assert preview_tokenizer(ModelConfig(id=str(tiny_model_dir)), policy=LAPTOP)[0] is cached  # cached: no lock either
        assert preview_tokenizer(ModelConfig(id="/not/loaded/yet"), wait=False, policy=LAPTOP) is None
    finally:
        done.set()
        held.join()


def test_load_rows_sees_a_file_saved_again(tmp_path):
    source = tmp_path / "data.csv"
    source.write_text("question,answer\nq1,1\n", encoding="utf-8")
    data = DataConfig(source=str(source), prompt="question")
    assert load_rows(data, policy=LAPTOP) is load_rows(data, policy=LAPTOP)  # cached
    source.write_text("question,answer\nq1,1\nq2,2\n", encoding="utf-8")
    assert len(load_rows(data, policy=LAPTOP).rows) == 2


@pytest.mark.parametrize("mapping, expected, notes", [
    ({"prompt": "text", "reference": "{name}"}, {"prompt": "text", "reference": "{name}"}, 0),
    ({"prompt": "question", "reference": "answer"}, {"prompt": "text", "reference": "answer"}, 1),
    ({"prompt": "Q: {question}", "reference": "{solution}", "system": "Use {style}."},
     {"prompt": "text", "reference": "answer", "system": None}, 3),
    ({"prompt": "text", "system": "You reply with JSON only."}, {"system": "You reply with JSON only."}, 0),
])
def test_fit_mapping_guesses_only_what_does_not_fit(mapping, expected, notes):
    rows = read_table(str(DATASETS / "json_answers.jsonl"), policy=LAPTOP).rows
    fitted, messages = fit_mapping(DataConfig(source="x", **mapping), rows, policy=LAPTOP)
    for key, value in expected.items():
        assert getattr(fitted, key) == value
    assert len(messages) == notes


def test_fit_mapping_without_a_reference_column_clears_it():
    fitted, messages = fit_mapping(DataConfig(source="x", prompt="question", reference="answer"),
                                   [{"body": "hello"}, {"body": "world"}], policy=LAPTOP)
    assert (fitted.prompt, fitted.reference) == ("body", None)
    assert messages == ["The prompt now uses the column 'body' ('question' does not fit this data).",
                        "The reference 'answer' does not fit this data, so it was cleared."]


def test_preview_examples_and_data_config():
    draft = Studio(runs_dir="unused", policy=LAPTOP).recipes.default()
    examples = preview_examples(data_config(draft), policy=LAPTOP)
    assert len(examples) == PREVIEW_ROWS
    assert prompt_text(examples[0]) == "What is 66 + 24? Reply with just the number."
    assert examples[0]["reference"] == "90"
    assert data_config({}).source == ""
    with pytest.raises(Exception, match="data.prompt uses the column 'nope'"):
        preview_examples(DataConfig(**{**ARITHMETIC.__dict__, "prompt": "{nope}"}), policy=LAPTOP)


# --------------------------------------------------------------------------------------------- group scoring


ARITHMETIC_REWARDS = build_rewards(parse_rewards([{"kind": "numeric"},
                                                  {"kind": "length", "max_chars": 12, "weight": 0.3}], policy=LAPTOP), policy=LAPTOP)


@pytest.mark.parametrize("completions, totals, advantages", [
    # totals 1.3, 0.3, 1.2, 0.3: mean 0.775, sample standard deviation 0.55, so (total - 0.775) / 0.5501
    (["90", "91", "The answer is 90", "no idea"], [1.3, 0.3, 1.2, 0.3], [0.954372, -0.863479, 0.772587, -0.863479]),
    (["90", "90"], [1.3, 1.3], [0.0, 0.0]),
    (["1", "2", "3", "4", "5", "6"], [0.3] * 6, [0.0] * 6),
])
def test_score_group_totals_and_advantages(completions, totals, advantages):
    """The advantages by hand, and as TRL computes them for a group (trl.trainer.utils.nanstd, epsilon 1e-4)."""
    import torch
    from trl.trainer.utils import nanstd

    group = score_group(ARITHMETIC_REWARDS, example("What is 66 + 24?", "90"), completions)
    assert group.prompt == "What is 66 + 24?" and group.reference == "90"
    assert group.reward_names == ["numeric", "length"]
    assert group.totals == pytest.approx(totals)
    (shown,) = advantages_of([group], ARITHMETIC_REWARDS, GRPOSettings(scale_rewards="group"))
    assert shown == pytest.approx(advantages, abs=1e-6)
    rewards = torch.tensor(group.totals, dtype=torch.float64)
    trl = (rewards - rewards.mean()) / (nanstd(rewards) + 1e-4)
    assert shown == pytest.approx(trl.tolist(), abs=1e-6)


@pytest.mark.parametrize("completions, fires", [
    (["90", "91"], False),
    (["1", "2", "3", "4", "5", "6"], True),  # all wrong and all short: 0.3 each
    (["90", "90", "90"], True),
    (["90"], False),  # a single reply is no group
    (["The answer is 90", "90"], False),
])
def test_no_signal_warning_fires_only_when_all_equal(completions, fires):
    warning = no_signal_warning(score_group(ARITHMETIC_REWARDS, example("What is 66 + 24?", "90"), completions))
    assert (warning is not None) == fires
    if fires:
        assert warning.startswith(f"All {len(completions)} replies to this prompt scored ")
        assert "GRPO learns nothing from this group" in warning and "higher temperature" in warning


def test_reward_failures_are_counted_with_the_first_message():
    group = score_group(ARITHMETIC_REWARDS, example("What is 66 + 24?", reference=""), ["90", "91", "x"])
    assert group.totals == pytest.approx([0.3, 0.3, 0.3])
    assert reward_failures(group) == [
        "The reward numeric failed on 3 of 3 replies (scored 0): this row has no reference answer to compare against"]
    assert reward_failures(score_group(ARITHMETIC_REWARDS, example("q", "90"), ["90"])) == []


def test_generate_groups_with_the_tiny_model(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    examples = [example("What is 12 + 30?", "42"), example("What is 1 + 1?", "2")]
    groups = list(generate_groups(model, tiny_tokenizer, ARITHMETIC_REWARDS, examples,
                                  GRPOSettings(group_size=3, temperature=1.0, max_new_tokens=4)))
    assert [g.prompt for g in groups] == ["What is 12 + 30?", "What is 1 + 1?"]
    assert all(len(g.completions) == 3 and len(g.results) == 3 for g in groups)
    assert all(sum(a) == pytest.approx(0.0, abs=1e-9) for a in advantages_of(groups, ARITHMETIC_REWARDS, GRPOSettings()))



def test_a_group_shows_its_replies_as_they_grow_and_stops_within_a_token(tiny_model_dir, tiny_tokenizer, monkeypatch):
    from transformers import AutoModelForCausalLM

    from dragon_ui.engine import evaluation

    monkeypatch.setattr(evaluation, "REPLIES_EVERY_S", 0.0)  # every token
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    examples = [example("What is 12 + 30?", "42"), example("What is 1 + 1?", "2")]
    seen: list[list[str]] = []
    settings = GRPOSettings(group_size=3, temperature=1.0, max_new_tokens=8)
    groups = list(generate_groups(model, tiny_tokenizer, ARITHMETIC_REWARDS, examples, settings,
                                  on_replies=seen.append))
    first = seen[:seen.index(groups[0].completions) + 1]  # the first row's replies, token by token, to the end
    assert len(first) > 2 and all(len(replies) == 3 for replies in first)
    assert len("".join(first[0])) < len("".join(first[-1]))  # one token each, then the whole replies
    assert seen[-1] == groups[1].completions

    tokens = []

    def stop_at_the_third_token() -> bool:
        tokens.append(1)
        return len(tokens) > 3

    with pytest.raises(Stopped):
        list(generate_groups(model, tiny_tokenizer, ARITHMETIC_REWARDS, examples, settings,
                             should_stop=stop_at_the_third_token))
    assert len(tokens) == 5  # before the batch, after each of three tokens, then once more: no next prompt


def test_a_group_is_sampled_with_the_runs_sampling_settings(tiny_model_dir, tiny_tokenizer):
    """top_k 1 leaves one token to sample from at every step: every reply of the group is the greedy one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    examples = [example("What is 12 + 30?", "42")]
    varied = next(generate_groups(model, tiny_tokenizer, ARITHMETIC_REWARDS, examples,
                                  GRPOSettings(group_size=6, temperature=1.0, max_new_tokens=6)))
    assert len(set(varied.completions)) > 1
    greedy = next(generate_groups(model, tiny_tokenizer, ARITHMETIC_REWARDS, examples,
                                  GRPOSettings(group_size=6, temperature=1.0, max_new_tokens=6, top_k=1)))
    assert len(set(greedy.completions)) == 1

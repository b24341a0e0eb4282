"""Tests for dragon_ui.data: every supported format loads the same rows, and every mistake gives a clear ConfigError."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dragon_ui.data import (
    SUPPORTED_EXTENSIONS,
    DataConfig,
    MappedData,
    columns_of,
    is_hub_dataset_id,
    load_and_map,
    read_table,
    map_rows,
    prompt_text,
    read_jsonl,
    write_jsonl,
)
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "dragon_ui" / "assets" / "datasets"

# One small table with the awkward bits: leading zeros, commas, quotes, a newline and non-ASCII text.
TABLE = [
    {"question": "What is 2 + 3?", "answer": "5", "code": "007", "note": "plain"},
    {"question": 'Say "hi", please', "answer": "hi", "code": "010", "note": "line one\nline two"},
    {"question": "Zoë's café — 🐉?", "answer": "ok", "code": "123", "note": "ünïcödé"},
]


def write_table(path: Path, rows: list[dict]) -> Path:
    """Write rows in the format given by the file extension, the way users' tools would."""
    suffix = path.suffix
    if suffix in (".csv", ".tsv"):
        pd.DataFrame(rows).to_csv(path, index=False, sep="\t" if suffix == ".tsv" else ",")
    elif suffix in (".jsonl", ".ndjson"):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=2), encoding="utf-8")
    elif suffix == ".xls":  # the old Excel format; pandas no longer writes it
        import xlwt

        book = xlwt.Workbook()
        sheet = book.add_sheet("Sheet1")
        for number, row in enumerate([list(rows[0]), *(list(r.values()) for r in rows)]):
            for column, value in enumerate(row):
                sheet.write(number, column, value)
        book.save(str(path))
    elif suffix in (".xlsx", ".xlsm", ".ods"):
        pd.DataFrame(rows).to_excel(path, index=False, engine="odf" if suffix == ".ods" else "openpyxl")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def config(**kwargs) -> DataConfig:
    return DataConfig(**{"source": "table.csv", "prompt": "question", **kwargs})


def numbered_rows(n: int) -> list[dict]:
    return [{"question": f"q{i}", "answer": str(i)} for i in range(n)]


def fields(example: dict) -> dict:
    return json.loads(example["row"])


# ----------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("suffix", SUPPORTED_EXTENSIONS)
def test_every_format_loads_the_same_rows(tmp_path, suffix):
    path = write_table(tmp_path / f"table{suffix}", TABLE)
    rows = read_table(str(path), policy=LAPTOP).rows
    assert rows == TABLE
    assert columns_of(rows) == ["question", "answer", "code", "note"]
    mapped = map_rows(rows, config(reference="answer"), policy=LAPTOP)
    assert [fields(ex) for ex in mapped.train] == TABLE
    assert [prompt_text(ex) for ex in mapped.train] == [r["question"] for r in TABLE]


@pytest.mark.parametrize("key", ["data", "rows", "train"])
def test_json_wrapped_in_an_object(tmp_path, key):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"info": "x", key: TABLE}), encoding="utf-8")
    assert read_table(str(path), policy=LAPTOP).rows == TABLE


def test_json_file_holding_json_lines_is_read_line_by_line(tmp_path):
    path = write_table(tmp_path / "really_lines.jsonl", TABLE).rename(tmp_path / "really_lines.json")
    assert read_table(str(path), policy=LAPTOP).rows == TABLE


def test_csv_with_byte_order_mark_and_blank_jsonl_lines(tmp_path):
    csv_path = tmp_path / "excel.csv"
    csv_path.write_bytes("\ufeffquestion,answer\nq,1\n".encode("utf-8"))
    assert read_table(str(csv_path), policy=LAPTOP).rows == [{"question": "q", "answer": "1"}]
    jsonl = tmp_path / "gaps.jsonl"
    jsonl.write_text('{"question": "a"}\n\n   \n{"question": "b"}\n', encoding="utf-8")
    assert read_table(str(jsonl), policy=LAPTOP).rows == [{"question": "a"}, {"question": "b"}]


def test_relative_path_found_in_cwd_then_base_dir(tmp_path, monkeypatch):
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    write_table(config_dir / "mine.csv", TABLE)
    monkeypatch.chdir(tmp_path)
    assert read_table("mine.csv", base_dir=str(config_dir), policy=LAPTOP).rows == TABLE
    write_table(tmp_path / "mine.csv", TABLE[:1])  # the current folder wins
    assert read_table("mine.csv", base_dir=str(config_dir), policy=LAPTOP).rows == TABLE[:1]


# ----------------------------------------------------------------------------------------- load errors


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.source: no file at .*nope\.csv"):
        read_table(str(tmp_path / "nope.csv"), policy=LAPTOP).rows


def test_a_broken_spreadsheet_is_refused_with_a_sentence(tmp_path):
    path = tmp_path / "sheet.xlsx"
    path.write_bytes(b"PK")
    with pytest.raises(ConfigError, match=r"sheet\.xlsx is not a spreadsheet this app can read \(.*\)\."):
        read_table(str(path), policy=LAPTOP).rows


def test_unsupported_extension(tmp_path):
    path = tmp_path / "notes.docx"
    path.write_bytes(b"PK")
    with pytest.raises(ConfigError, match=r"unsupported file type '\.docx'.*\.csv"):
        read_table(str(path), policy=LAPTOP).rows


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        read_table(str(tmp_path), policy=LAPTOP).rows


def test_malformed_json_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a"}\n{"question": "b"}\n{"question": oops}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 3 of bad\.jsonl is not valid JSON"):
        read_table(str(path), policy=LAPTOP).rows


def test_json_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.ndjson"
    path.write_text('{"question": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="line 2 of list.ndjson is not a JSON object"):
        read_table(str(path), policy=LAPTOP).rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"question": "a"},', r"not valid JSON \(line 1"),
        ('{"question": "a"}', "must hold a list of objects"),
        ('[{"question": "a"}, 3]', "item 2 of bad.json is not an object"),
    ],
)
def test_malformed_json_file(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        read_table(str(path), policy=LAPTOP).rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('question,answer\n"never closed,1\n', r"line 2 of bad\.csv opens a quote \(\"\) that never closes"),
        ('question,answer\n"a"b,1\n', r"line 2 of bad\.csv is not valid CSV \(',' expected after '\"'\)"),
    ],
)
def test_malformed_csv(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        read_table(str(path), policy=LAPTOP).rows


def test_not_parquet(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("question\nq\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="fake.parquet is not a valid Parquet file"):
        read_table(str(path), policy=LAPTOP).rows


@pytest.mark.parametrize(
    ("name", "content"),
    [("empty.csv", ""), ("header_only.csv", "question,answer\n"), ("empty.jsonl", "\n\n"),
     ("empty.json", ""), ("empty_list.json", "[]"), ("empty.tsv", "")],
)
def test_empty_file(tmp_path, name, content):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{name} has no rows"):
        read_table(str(tmp_path / name), policy=LAPTOP).rows


# ----------------------------------------------------------------------------------------- Hub


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("openai/gsm8k", True),
        ("trl-lib/tldr", True),
        ("HuggingFaceH4/MATH-500", True),
        ("gsm8k", False),
        ("data/train.csv", False),
        ("owner/file.parquet", False),
        ("owner/sheet.xlsx", False),
        ("org/data-v1.2", True),
        ("/abs/path", False),
        ("a/b/c", False),
        ("./x", False),
        ("", False),
    ],
)
def test_hub_id_detection(source, expected):
    assert is_hub_dataset_id(source) is expected


def test_existing_local_folder_is_not_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_dataset_id("owner/name")


def fake_datasets(monkeypatch, load_dataset):
    """Stand in for the real `datasets` package, which is imported lazily inside the Hub loader."""
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_hub_load_passes_config_and_split(monkeypatch):
    calls = []

    def load_dataset(source, name=None, split=None):
        calls.append((source, name, split))
        return types.SimpleNamespace(to_list=lambda: [{"question": "q", "answer": 3}])

    fake_datasets(monkeypatch, load_dataset)
    mapped = load_and_map(DataConfig(source="openai/gsm8k", prompt="question", reference="answer", hub_config="main"), policy=LAPTOP)
    assert calls == [("openai/gsm8k", "main", "train")]
    assert mapped.train[0]["reference"] == "3"


def test_hub_unreachable_gives_offline_advice(monkeypatch):
    def load_dataset(*args, **kwargs):
        try:
            raise OSError("Name or service not known")
        except OSError as cause:
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub") from cause

    fake_datasets(monkeypatch, load_dataset)
    advice = r"Hugging Face Hub could not be reached to load 'openai/gsm8k'; download the data as a CSV"
    with pytest.raises(ConfigError, match=advice):
        read_table("openai/gsm8k", policy=LAPTOP).rows


def test_hub_other_failure_is_reported(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ValueError('Unknown split "tset"')

    fake_datasets(monkeypatch, load_dataset)
    message = r"could not load the Hub dataset 'owner/name' \(split 'tset'\).*Unknown split"
    with pytest.raises(ConfigError, match=message):
        read_table("owner/name", hub_split="tset", policy=LAPTOP).rows


@pytest.mark.timeout(120)
def test_real_datasets_offline_fails_fast_with_advice(tmp_path):
    """The real `datasets` in offline mode, in a fresh process so the offline switches take effect at import."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from dragon_ui.data import read_table\n"
        "from dragon_ui.errors import ConfigError\n"
        "from dragon_ui.public import LAPTOP\n"
        "try:\n    read_table('openai/gsm8k', hub_config='main', policy=LAPTOP).rows\n"
        "except ConfigError as exc:\n    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=110
    )
    assert "Hugging Face Hub could not be reached" in result.stdout, result.stderr


# ----------------------------------------------------------------------------------------- mapping


def test_prompt_template_reference_template_and_chat_shape():
    rows = [{"question": "2+2", "answer": 4, "unit": "apples"}]
    mapped = map_rows(rows, config(prompt="Q: {question} ({unit})", reference="{answer} {unit}"), policy=LAPTOP)
    example = mapped.train[0]
    assert example["prompt"] == [{"role": "user", "content": "Q: 2+2 (apples)"}]
    assert example["reference"] == "4 apples"
    assert prompt_text(example) == "Q: 2+2 (apples)"


def test_brace_escapes_in_templates():
    mapped = map_rows([{"text": "Ana, 30"}], config(prompt='Reply as {{"name": ...}}: {text}'), policy=LAPTOP)
    assert prompt_text(mapped.train[0]) == 'Reply as {"name": ...}: Ana, 30'


def test_reference_absent_is_empty_string():
    assert map_rows(numbered_rows(1), config(), policy=LAPTOP).train[0]["reference"] == ""


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("You are a careful tutor.", "You are a careful tutor."),  # constant text
        ("Answer in {lang}.", "Answer in French."),  # template
        ("persona", "You are a pirate."),  # exactly a column name
    ],
)
def test_system_constant_template_or_column(system, expected):
    rows = [{"question": "hi", "lang": "French", "persona": "You are a pirate."}]
    messages = map_rows(rows, config(system=system), policy=LAPTOP).train[0]["prompt"]
    assert messages == [{"role": "system", "content": expected}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("system", [None, "", "   "])
def test_no_system_message_when_not_given(system):
    assert map_rows(numbered_rows(1), config(system=system), policy=LAPTOP).train[0]["prompt"][0]["role"] == "user"


def test_system_column_empty_in_a_row_omits_the_message():
    rows = [{"question": "a", "persona": "Be kind."}, {"question": "b", "persona": ""}]
    train = map_rows(rows, config(system="persona"), policy=LAPTOP).train
    assert [len(ex["prompt"]) for ex in train] == [2, 1]


def test_column_name_with_stray_spaces_still_matches():
    assert prompt_text(map_rows(numbered_rows(1), config(prompt=" question "), policy=LAPTOP).train[0]) == "q0"


def test_all_fields_travel_as_text_including_unmapped_columns(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"question": "q", "answer": 85, "score": 85.0, "ratio": 0.25, "ok": True, "tags": ["a", "b"],
             "meta": {"k": 1}, "gone": None, "nan": float("nan")}]
    path.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    example = load_and_map(DataConfig(source=str(path), prompt="question", reference="answer"), policy=LAPTOP).train[0]
    assert example["reference"] == "85"
    assert fields(example) == {"question": "q", "answer": "85", "score": "85", "ratio": "0.25", "ok": "true",
                               "tags": '["a", "b"]', "meta": '{"k": 1}'}


def test_leading_zeros_survive_in_csv(tmp_path):
    path = write_table(tmp_path / "codes.csv", [{"question": "Code?", "answer": "007"}])
    mapped = load_and_map(DataConfig(source=str(path), prompt="question", reference="answer"), policy=LAPTOP)
    assert mapped.train[0]["reference"] == "007"
    assert fields(mapped.train[0]) == {"question": "Code?", "answer": "007"}


def test_parquet_int_column_with_nulls_stays_integer(tmp_path):
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "a", "answer": 85}, {"question": "b", "answer": None}]), path)
    train = load_and_map(DataConfig(source=str(path), prompt="question", reference="answer"), policy=LAPTOP).train
    assert [fields(ex) for ex in train] == [{"question": "a", "answer": "85"}, {"question": "b"}]
    assert [ex["reference"] for ex in train] == ["85", ""]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"prompt": "Q: {questio}"},
         r"data\.prompt uses the column 'questio' in its template, but the file has no such column; "
         r"its columns are: question, answer\.$"),
        ({"reference": "{answr}"}, r"data\.reference uses the column 'answr'"),
        ({"system": "Use {langauge}."}, r"data\.system uses the column 'langauge'"),
        ({"system": 'Reply like {"name": "x"}'}, r"write '\{\{' or '\}\}' for a literal brace"),
        ({"prompt": "foo"},
         r"data\.prompt 'foo' is neither a column of the file nor a template with \{column\} placeholders; "
         r"columns are: question, answer\."),
        ({"reference": "solution"}, r"data\.reference 'solution' is neither a column"),
        ({"prompt": "Q: {question"}, r"data\.prompt has an unmatched '\{' or '\}'"),
        ({"prompt": "Q: {}"}, r"uses the column ''"),
    ],
)
def test_bad_mappings(mapping, message):
    with pytest.raises(ConfigError, match=message):
        map_rows(numbered_rows(3), config(**mapping), policy=LAPTOP)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"prompt": "question"}, r"data\.prompt uses the column 'question', but row 2 holds a list there"),
        ({"prompt": "Q: {question}"}, r"data\.prompt uses the column 'question', but row 2 holds a list"),
        ({"prompt": "text", "reference": "question"}, r"data\.reference uses the column 'question', but row 2"),
        ({"prompt": "text", "system": "{meta}"}, r"data\.system uses the column 'meta', but row 1 holds a dict"),
    ],
)
def test_non_text_values_in_mapped_columns(mapping, message):
    rows = [{"question": "fine", "text": "t", "meta": {"a": 1}}, {"question": ["not", "text"], "text": "t", "meta": {}}]
    with pytest.raises(ConfigError, match=message):
        map_rows(rows, config(**mapping), policy=LAPTOP)


def test_empty_prompts_are_skipped_and_counted():
    rows = numbered_rows(25) + [{"question": ""}, {"question": "   \n"}, {"answer": "no question"}]
    mapped = map_rows(rows, config(), policy=LAPTOP)
    assert (mapped.n_rows, mapped.n_skipped) == (28, 3)
    assert len(mapped.train) + len(mapped.eval) == 25
    assert mapped.summary() == ("28 rows: 20 for training, 5 held out, 3 skipped. 5 rows are held out for the "
                                "before/after comparison (5% would be only 1, too few to compare).")


def test_all_prompts_empty_is_an_error():
    with pytest.raises(ConfigError, match=r"data\.prompt gave empty text for all 2 rows.*column 'question'"):
        map_rows([{"question": ""}, {"question": " "}], config(), policy=LAPTOP)


def test_no_rows_is_an_error():
    with pytest.raises(ConfigError, match="has no rows"):
        map_rows([], config(), policy=LAPTOP)


# ----------------------------------------------------------------------------------------- split


@pytest.mark.parametrize(("n", "frac", "held_out"), [
    (19, 0.05, 0), (19, 0.5, 0),  # too few rows to spare any
    (20, 0.05, 4), (20, 0.01, 4), (30, 0.05, 6),  # a fifth of the rows, since 10 would be more
    (60, 0.05, 10), (100, 0.05, 10), (1000, 0.001, 10),  # at least 10, however small the fraction
    (200, 0.05, 10), (400, 0.05, 20), (100, 0.5, 50),  # the fraction, once it gives 10 or more
    (100, 0.0, 0),  # 0 means none
])
def test_split_sizes(n, frac, held_out):
    mapped = map_rows(numbered_rows(n), config(eval_frac=frac), policy=LAPTOP)
    assert (len(mapped.train), len(mapped.eval)) == (n - held_out, held_out)


@pytest.mark.parametrize(("n", "frac", "reason"), [
    (60, 0.05, "10 rows are held out for the before/after comparison (5% would be only 3, too few to compare)."),
    (20, 0.01, "4 rows are held out for the before/after comparison (1% would be none)."),
    (120, 0.025, "10 rows are held out for the before/after comparison (2.5% would be only 3, too few to compare)."),
    (400, 0.05, ""), (100, 0.0, ""), (19, 0.5, ""),
])
def test_the_summary_says_why_more_rows_are_held_out_than_asked(n, frac, reason):
    mapped = map_rows(numbered_rows(n), config(eval_frac=frac), policy=LAPTOP)
    assert mapped.held_out_reason() == reason
    assert mapped.summary().endswith(reason or "skipped.")


def test_split_is_deterministic_and_disjoint():
    def split(seed):
        mapped = map_rows(numbered_rows(200), config(eval_frac=0.1, seed=seed), policy=LAPTOP)
        return [prompt_text(ex) for ex in mapped.train], [prompt_text(ex) for ex in mapped.eval]

    train, held_out = split(7)
    assert split(7) == (train, held_out)
    assert split(8)[1] != held_out
    assert not set(train) & set(held_out)
    assert sorted(train + held_out, key=lambda q: int(q[1:])) == [f"q{i}" for i in range(200)]
    assert train == sorted(train, key=lambda q: int(q[1:]))  # file order is kept


def test_max_rows_applies_before_split():
    mapped = map_rows(numbered_rows(100), config(max_rows=30), policy=LAPTOP)
    assert mapped.n_rows == 30
    assert len(mapped.train) + len(mapped.eval) == 30
    assert {prompt_text(ex) for ex in mapped.train + mapped.eval} == {f"q{i}" for i in range(30)}


# ----------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source": ""}, r"data\.source is empty"),
        ({"source": "  "}, r"data\.source is empty"),
        ({"prompt": ""}, r"data\.prompt is empty"),
        ({"eval_frac": 0.6}, r"data\.eval_frac must be a number from 0 to 0\.5"),
        ({"eval_frac": -0.1}, r"data\.eval_frac"),
        ({"eval_frac": "0.1"}, r"data\.eval_frac"),
        ({"max_rows": 0}, r"data\.max_rows must be a whole number of at least 1"),
        ({"max_rows": 2.5}, r"data\.max_rows"),
        ({"seed": "x"}, r"data\.seed must be a whole number"),
        ({"hub_split": ""}, r"data\.hub_split is empty"),
        ({"reference": 3}, r"data\.reference must be text"),
    ],
)
def test_validate_rejects(changes, message):
    with pytest.raises(ConfigError, match=message):
        config(**changes).validate()


def test_validate_uses_the_given_prefix_and_accepts_defaults_with_source():
    config().validate()
    with pytest.raises(ConfigError, match=r"^run\.data\.prompt is empty"):
        config(prompt="").validate("run.data")


def test_data_config_fields_and_defaults():
    assert DataConfig() == DataConfig(source="", prompt="", reference=None, system=None, hub_config=None,
                                      hub_split="train", eval_frac=0.05, seed=42, max_rows=None)


# ----------------------------------------------------------------------------------------- JSONL helpers


def test_write_and_read_jsonl_round_trip(tmp_path):
    examples = map_rows([{"question": "Zoë?", "answer": 1}], config(reference="answer", system="Hi"), policy=LAPTOP).train
    path = tmp_path / "sub" / "train.jsonl"
    write_jsonl(path, examples)
    assert read_jsonl(path) == examples
    assert "Zoë" in path.read_text(encoding="utf-8")
    assert [p.name for p in path.parent.iterdir()] == ["train.jsonl"]  # no temp file left behind


def test_read_jsonl_bad_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="^line 2 of x.jsonl is not valid JSON"):
        read_jsonl(path)


def test_prompt_text_of_plain_and_chat_prompts():
    assert prompt_text({"prompt": "plain"}) == "plain"
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    assert prompt_text({"prompt": chat}) == "u2"


# ----------------------------------------------------------------------------------------- bundled datasets


def test_bundled_arithmetic_maps_to_380_and_20_with_correct_sums():
    mapped = load_and_map(DataConfig(source=str(DATASETS / "arithmetic.csv"), prompt="question", reference="answer"), policy=LAPTOP)
    assert isinstance(mapped, MappedData)
    assert (mapped.n_rows, len(mapped.train), len(mapped.eval), mapped.n_skipped) == (400, 380, 20, 0)
    assert mapped.summary() == "400 rows: 380 for training, 20 held out, 0 skipped. Read as UTF-8."
    for example in mapped.train + mapped.eval:
        a, b = map(int, prompt_text(example).removeprefix("What is ").split("?")[0].split(" + "))
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert prompt_text(example) == f"What is {a} + {b}? Reply with just the number."
        assert example["reference"] == str(a + b)


def test_bundled_json_answers_and_think_answer_map():
    prompt = "Extract name, age and city from the text as a JSON object with keys name, age, city.\n\n{text}"
    extract = load_and_map(DataConfig(source=str(DATASETS / "json_answers.jsonl"), prompt=prompt, reference="answer"), policy=LAPTOP)
    assert extract.columns == ["text", "name", "age", "city", "answer"]
    for example in extract.train:
        row = fields(example)
        assert json.loads(example["reference"]) == {"name": row["name"], "age": int(row["age"]), "city": row["city"]}
        assert row["name"] in prompt_text(example) and row["age"] in prompt_text(example)
    think = load_and_map(DataConfig(source=str(DATASETS / "think_answer.jsonl"), prompt="question", reference="answer"), policy=LAPTOP)
    assert think.n_rows == 200 and all(ex["reference"].isdigit() for ex in think.train)


def test_bundled_datasets_are_small_and_regenerate_identically(tmp_path):
    subprocess.run([sys.executable, str(DATASETS / "make_datasets.py"), str(tmp_path)], check=True, timeout=60)
    for name in ("arithmetic.csv", "json_answers.jsonl", "think_answer.jsonl", "small_sums.csv", "products.csv",
                 "big_products.csv"):
        assert (tmp_path / name).read_bytes() == (DATASETS / name).read_bytes(), name
        assert (DATASETS / name).stat().st_size < 100_000


def test_module_does_not_import_heavy_or_ui_packages():
    code = "import sys, dragon_ui.data; print(sorted({'gradio', 'torch', 'datasets'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"

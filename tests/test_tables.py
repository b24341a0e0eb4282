"""Bring your own data: files as people save them (Excel, other encodings, broken quotes, repeated columns, prompts
too long for the model) are read right or refused with a sentence, through `check` and the Data tab alike."""

from __future__ import annotations

import codecs
import datetime

import pytest
import yaml

from conftest import tiny_config
from dragon_ui.cli import main
from dragon_ui.public import LAPTOP
from dragon_ui.studio.playground import data_config, draft_tokenizer
from dragon_ui.data.tables import cell_text, unique_columns
from dragon_ui.ui import data_tab

ROWS = [("What is 2 + 2? Réponds vite.", "4"), ("What is 3 + 4? Réponds vite.", "7")] * 15


def csv_text(rows=ROWS, header="question,answer") -> str:
    return header + "\n" + "".join(f"{question},{answer}\n" for question, answer in rows)


def write_xlsx(path, sheets: dict[str, list[list]]) -> None:
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for name, rows in sheets.items():
        sheet = workbook.create_sheet(name)
        for row in rows:
            sheet.append(row)
    workbook.save(path)


def questions_sheet() -> list[list]:
    return [["question", "answer", "asked"], *([question, int(answer), datetime.date(2024, 3, 1)]
                                               for question, answer in ROWS)]


def make(kind: str, folder) -> tuple[str, dict]:
    """(the file's name, settings for the data section) of one kind of file people bring."""
    if kind == "windows-1252":
        (folder / "excel.csv").write_bytes(csv_text().replace("vite", "vite “maintenant”").encode("cp1252"))
        return "excel.csv", {}
    if kind == "utf-8 with bom":
        (folder / "bom.csv").write_bytes(codecs.BOM_UTF8 + csv_text().encode("utf-8"))
        return "bom.csv", {}
    if kind == "utf-16":
        (folder / "wide.csv").write_bytes(csv_text().encode("utf-16"))
        return "wide.csv", {}
    if kind == "binary":
        (folder / "photo.csv").write_bytes(bytes(range(256)) * 8)
        return "photo.csv", {}
    if kind == "unterminated quote":
        (folder / "quote.csv").write_text(csv_text().replace("What is 3", '"What is 3', 1), encoding="utf-8")
        return "quote.csv", {}
    if kind == "extra fields":
        rows = list(ROWS)
        rows[4] = ("What is 1, 2 or 3?", "3")  # an unquoted comma: three fields under a two-column header
        (folder / "commas.csv").write_text(csv_text(rows), encoding="utf-8")
        return "commas.csv", {}
    if kind == "repeated column":
        (folder / "twice.csv").write_text(csv_text([(q, f"{a},{a}") for q, a in ROWS], "question,answer,answer"),
                                          encoding="utf-8")
        return "twice.csv", {"reference": "answer (2)"}
    if kind in ("xlsx", "xlsx other sheet", "xlsx missing sheet"):
        write_xlsx(folder / "book.xlsx", {"Questions": questions_sheet(), "Other": [["question", "answer"],
                                                                                    *map(list, ROWS[:25])]})
        sheet = {"xlsx": {}, "xlsx other sheet": {"sheet": "Other"}, "xlsx missing sheet": {"sheet": "Nope"}}[kind]
        return "book.xlsx", sheet
    if kind in ("one prompt too long", "every prompt too long"):
        rows = list(ROWS)
        rows[3] = ("What is " + "very " * 40_000 + "big?", "1")  # 200 kB, far past any prompt limit
        (folder / "long.csv").write_text(csv_text(rows), encoding="utf-8")
        return "long.csv", ({"max_prompt_tokens": 5} if kind == "every prompt too long" else {})
    raise ValueError(kind)


# kind -> (what `check` and the Data tab say, whether a training could start)
FILES = {
    "windows-1252": ("Read as Windows-1252.", True),
    "utf-8 with bom": ("Read as UTF-8 (with a byte-order mark).", True),
    "utf-16": ("Read as UTF-16.", True),
    "binary": ("photo.csv is not UTF-8 text; save it again with UTF-8 encoding.", False),
    "unterminated quote": ("line 3 of quote.csv opens a quote (\") that never closes", False),
    "extra fields": ("1 line skipped (line 6): more fields than the header's 2", True),
    "repeated column": ("Two columns are called 'answer': column 3 is read as 'answer (2)'.", True),
    "xlsx": ("Read the sheet 'Questions' (of 2: Questions, Other).", True),
    "xlsx other sheet": ("Read the sheet 'Other' (of 2: Questions, Other).", True),
    "xlsx missing sheet": ("book.xlsx has no sheet called 'Nope'; its sheets are: Questions, Other.", False),
    # the tiny model reads 512 tokens: with 6 new ones, a prompt may have 506 (fewer than the CPU's default 512)
    "one prompt too long": ("1 prompt longer than 506 tokens (the model's context of 512 tokens less "
                            "grpo.max_new_tokens (6)) was dropped.", True),
    "every prompt too long": ("every prompt is longer than 5 tokens (data.max_prompt_tokens); the longest has ",
                              False),
}


@pytest.fixture
def config_for(tiny_model_dir, tmp_path, runs_dir):
    def config_for(kind: str) -> tuple[dict, str]:
        name, data = make(kind, tmp_path)
        (tmp_path / "unused").mkdir(exist_ok=True)
        config = tiny_config(tiny_model_dir, tmp_path / "unused", runs_dir)
        config["data"].update(source=str(tmp_path / name), eval_frac=0.0, **data)
        return config, name

    return config_for


@pytest.mark.parametrize("kind, outcome", FILES.items(), ids=FILES.keys())
def test_check_says_what_it_found_and_whether_a_run_could_start(kind, outcome, config_for, tmp_path, capsys):
    said, could_start = outcome
    config, _ = config_for(kind)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    code = main(["check", str(tmp_path / "run.yaml")])
    out, err = capsys.readouterr()
    assert code == (0 if could_start else 2), (out, err)
    assert said in (out if could_start else err), (out, err)
    if could_start:
        assert "A training could start" in out and "Hardware: cpu" in out and "Prompts are " in out
    else:
        assert err.startswith("error: ") and err.count("\n") == 1  # one sentence


@pytest.mark.parametrize("kind, outcome", FILES.items(), ids=FILES.keys())
def test_the_data_tab_shows_the_same_findings(kind, outcome, config_for, studio):
    said, could_start = outcome
    config, _ = config_for(kind)
    draft = {**studio.recipes.default(), **{key: config[key] for key in ("data", "model", "hardware", "grpo")}}
    labels = {"data.source": "Data source", "data.sheet": "Sheet", "data.max_prompt_tokens": "Max prompt tokens"}
    source_status, _, mapping_status, counts, _, lengths, sheets = data_tab.preview_views(
        data_tab._preview(draft, data_config(draft), draft_tokenizer(draft, policy=LAPTOP), policy=LAPTOP)[0], labels)
    if kind.startswith(("one prompt", "every prompt")):  # counted on the Data tab, dropped when the run starts
        limit = 512 if kind.startswith("one") else 5
        assert f"longer than {limit} tokens (data.max_prompt_tokens) and will be dropped" in lengths
    elif could_start:
        assert said in counts and not source_status and not mapping_status
    else:
        assert said in source_status, source_status
    if kind.startswith("xlsx") and could_start:
        assert sheets.choices == [("Questions", "Questions"), ("Other", "Other")] and sheets.visible


def test_spreadsheet_cells_read_as_people_see_them():
    assert [cell_text(value) for value in (4.0, 2.5, True, None, datetime.date(2024, 3, 1),
                                           datetime.datetime(2024, 3, 1, 9, 30), "007")] == \
        ["4", "2.5", "TRUE", "", "2024-03-01", "2024-03-01 09:30:00", "007"]


def test_header_names_are_made_unique_and_said():
    columns, notes = unique_columns(["q", "", "q", "q (2)", "q"])
    assert columns == ["q", "column 2", "q (3)", "q (2)", "q (4)"]
    assert len(notes) == 3 and "Column 2 has no name" in notes[0]

"""Regenerate the bundled workshop datasets; the fixed seed makes the output identical on every run.

Usage: python assets/datasets/make_datasets.py [output_folder]   (default: the folder of this script)
"""

import csv
import json
import random
import sys
from pathlib import Path

SEED = 1234

FIRST_NAMES = [
    "Maria", "Jonas", "Aisha", "Kenji", "Sofia", "Liam", "Olga", "Mateo", "Priya", "Noah",
    "Elena", "Tariq", "Chloe", "Diego", "Ingrid", "Kwame", "Lucia", "Omar", "Hana", "Felix",
]
CITIES = [
    "Lisbon", "Berlin", "Nairobi", "Osaka", "Madrid", "Dublin", "Warsaw", "Lima", "Mumbai", "Toronto",
    "Oslo", "Cairo", "Paris", "Bogota", "Stockholm", "Accra", "Rome", "Istanbul", "Seoul", "Vienna",
]
PERSON_TEMPLATES = [
    "{name} is {age} years old and lives in {city}.",
    "{name}, aged {age}, has lived in {city} for a few years.",
    "Born {age} years ago, {name} now calls {city} home.",
    "At {age}, {name} moved to {city} to start a new job.",
    "Our new colleague {name} ({age}) works from the {city} office.",
    "{name} from {city} just celebrated turning {age}.",
]
PEOPLE = ["Tom", "Anna", "Ravi", "Mia", "Sam", "Lena", "Yusuf", "Grace", "Ben", "Zoe"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells"]


def arithmetic(rng: random.Random) -> list[dict]:
    """400 two-digit additions: the smallest task where a reward (exact number) is easy to check."""
    rows = []
    for _ in range(400):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"question": f"What is {a} + {b}? Reply with just the number.", "answer": a + b})
    return rows


def json_answers(rng: random.Random) -> list[dict]:
    """200 sentences about a person; the answer is the JSON object a model should extract from it."""
    rows = []
    for _ in range(200):
        name, city, age = rng.choice(FIRST_NAMES), rng.choice(CITIES), rng.randint(18, 80)
        text = rng.choice(PERSON_TEMPLATES).format(name=name, age=age, city=city)
        answer = json.dumps({"name": name, "age": age, "city": city}, ensure_ascii=False)
        rows.append({"text": text, "name": name, "age": age, "city": city, "answer": answer})
    return rows


def word_problem(rng: random.Random) -> tuple[str, int]:
    """One short word problem with a whole-number answer, using +, -, x or sharing."""
    who, item = rng.choice(PEOPLE), rng.choice(ITEMS)
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind == "add":
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        return f"{who} has {a} {item} and gets {b} more. How many {item} does {who} have now?", a + b
    if kind == "sub":
        a = rng.randint(10, 40)
        b = rng.randint(1, a - 1)
        return f"{who} has {a} {item} and gives away {b}. How many {item} are left?", a - b
    if kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        return f"{who} buys {a} bags with {b} {item} in each bag. How many {item} is that in total?", a * b
    friends, each = rng.randint(2, 6), rng.randint(2, 10)
    return (
        f"{who} shares {friends * each} {item} equally among {friends} friends. How many {item} does each friend get?",
        each,
    )


def think_answer(rng: random.Random) -> list[dict]:
    """200 word problems for the think-then-answer format recipe."""
    rows = []
    for _ in range(200):
        question, answer = word_problem(rng)
        rows.append({"question": question, "answer": answer})
    return rows


def small_sums(rng: random.Random) -> list[dict]:
    """300 one-digit additions, which the base SmolLM2-135M mostly gets right: the reward-hacking lesson needs a task
    the model can already do, so that what a loose reward pays for visibly costs it the right answers."""
    rows = []
    for _ in range(300):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"question": f"What is {a} + {b}? Reply with just the number.", "answer": a + b})
    return rows


def products(rng: random.Random) -> list[dict]:
    """300 products of two two-digit numbers, which the base SmolLM2-135M almost never gets exactly right but often
    nearly: the too-hard lesson needs a task where an exact reward gives almost every group the same zero, and
    partial credit gives many of them a spread."""
    rows = []
    for _ in range(300):
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        rows.append({"question": f"What is {a} × {b}? Reply with just the number.", "answer": a * b})
    return rows


def big_products(rng: random.Random) -> list[dict]:
    """300 products of two three-digit numbers, which SmolLM2-135M never works out alone: the calculator lesson needs
    a task only the tool can do, so the reward pays for learning to call it."""
    rows = []
    for _ in range(300):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        rows.append({"question": f"What is {a} × {b}?", "answer": a * b})
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["question", "answer"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    write_csv(out_dir / "arithmetic.csv", arithmetic(rng))
    write_jsonl(out_dir / "json_answers.jsonl", json_answers(rng))
    write_jsonl(out_dir / "think_answer.jsonl", think_answer(rng))
    write_csv(out_dir / "small_sums.csv", small_sums(rng))
    write_csv(out_dir / "products.csv", products(rng))
    write_csv(out_dir / "big_products.csv", big_products(rng))  # last: the datasets before it stay as they were


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)

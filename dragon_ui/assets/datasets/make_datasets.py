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


OPPOSITES = """hot cold|big small|up down|happy sad|fast slow|light dark|old young|open closed|high low|long short|hard soft
rich poor|full empty|wet dry|loud quiet|early late|strong weak|thick thin|clean dirty|heavy light|in out|left right|day night
win lose|buy sell|push pull|give take|begin end|first last|top bottom|front back|inside outside|above below|true false
yes no|always never|before after|more less|many few|best worst|love hate|friend enemy|question answer|arrive leave
remember forget|accept refuse|laugh cry|sweet sour|asleep awake|alive dead|north south|east west|summer winter|noon midnight
sunrise sunset|start finish|entrance exit|import export|increase decrease|maximum minimum|tall short|wide narrow|deep shallow
near far|cheap expensive|easy difficult|safe dangerous|smooth rough|sharp blunt|tight loose|brave cowardly|polite rude
kind cruel|wise foolish|calm angry|busy idle|honest dishonest|patient impatient|possible impossible|visible invisible
success failure|victory defeat|peace war|health illness|joy sorrow|hope despair|praise blame|profit loss|attack defend
appear disappear|agree disagree|connect disconnect|include exclude|inhale exhale|lend borrow|teach learn|send receive
rise fall|sink float|boy girl|man woman|king queen|husband wife|brother sister|father mother|son daughter|uncle aunt
prince princess|actor actress|positive negative|major minor|ancient modern|public private|single double|odd even|rare common
simple complex|natural artificial|permanent temporary|come go|sit stand|catch throw|freeze melt|whisper shout|save spend
wake sleep|lead follow|build destroy|black white|sun moon|land sea|fire water|heaven hell|city country|master servant
parent child|teacher student|dawn dusk|floor ceiling|input output|upstairs downstairs|indoors outdoors|forward backward
arrival departure|birth death|wild tame|gain loss|offense defense"""


def opposites(rng: random.Random) -> list[dict]:
    """148 words and their opposites, asked for as one word. SmolLM2-135M knows most of them but answers in a
    sentence ("The opposite of hot is cold."): the right-not-short lesson needs a task where a reward for the bare
    answer never pays while one for the answer inside the reply often does."""
    pairs = [pair.split() for pair in OPPOSITES.replace("\n", "|").split("|")]
    rng.shuffle(pairs)
    return [{"question": f'What is the opposite of "{word}"? Answer with one word.', "answer": opposite}
            for word, opposite in pairs]


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
    write_csv(out_dir / "big_products.csv", big_products(rng))
    write_csv(out_dir / "opposites.csv", opposites(rng))  # last: the datasets before it stay as they were


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)

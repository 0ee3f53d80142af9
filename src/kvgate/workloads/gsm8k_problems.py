"""Grade-school word problems in gsm8k's format, generated deterministically by kvgate itself.

gsm8k's data lives on the Hugging Face hub, which CPU runs cannot reach; kvgate ships its own problems
instead. Each template draws numbers from a fixed-seed `random.Random` so that every answer is a whole
number, and writes the worked answer the way gsm8k does: one reasoning line per step with calculator
annotations `<<48/2=24>>24`, then a last line `#### 72`.

Regenerate the shipped files with `python -m kvgate.workloads.gsm8k_problems` (a test checks they are current).
"""

from __future__ import annotations

import ast
import json
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data" / "gsm8k_local"
SPLITS = {"train": (24, 20261130), "test": (240, 20261201)}  # split -> (number of problems, seed)


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    question: str
    answer: str  # the worked answer, last line "#### N"
    result: int  # N, computed by the generator
    template: str

    def as_record(self) -> dict[str, str]:
        """Exactly gsm8k's fields."""
        return {"question": self.question, "answer": self.answer}


_OPERATORS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(expression: str) -> Fraction:
    """The exact value of a calculator expression (+ - * / and parentheses on whole numbers)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"not a calculator expression: {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


def calc(expression: str) -> tuple[str, int]:
    """`expression = <<expression=value>>value` as gsm8k writes a step, and the value."""
    value = evaluate(expression)
    if value.denominator != 1:
        raise ValueError(f"{expression} = {value} is not a whole number")
    number = int(value)
    return f"{expression} = <<{expression}={number}>>{number}", number


NAMES = [
    "Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Mark",
    "Carla", "Darrell", "Maria", "Tobias", "Randy", "Joy", "Henry", "Lena", "Omar", "Priya",
    "Sam", "Grace", "Leo", "Nina", "Mateo", "Hana", "Eli", "Rosa", "Ivan", "Mei",
]
SHOP_ITEMS = [
    ("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("book", "books"),
    ("shirt", "shirts"), ("toy car", "toy cars"), ("cupcake", "cupcakes"), ("ticket", "tickets"),
    ("bag of rice", "bags of rice"), ("bottle of juice", "bottles of juice"),
]
COUNTED = [
    ("marble", "marbles"), ("sticker", "stickers"), ("stamp", "stamps"), ("seashell", "seashells"),
    ("baseball card", "baseball cards"), ("bead", "beads"), ("coin", "coins"), ("flower", "flowers"),
]


def _two_names(rng: random.Random) -> tuple[str, str]:
    first, second = rng.sample(NAMES, 2)
    return first, second


def shopping_change(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    (_, many_a), (_, many_b) = rng.sample(SHOP_ITEMS, 2)
    count_a, price_a = rng.randint(2, 9), rng.randint(2, 15)
    count_b, price_b = rng.randint(2, 6), rng.randint(3, 20)
    total = count_a * price_a + count_b * price_b
    bill = next(b for b in (20, 50, 100, 200, 500) if b >= total + 1)
    step_a, cost_a = calc(f"{count_a}*{price_a}")
    step_b, cost_b = calc(f"{count_b}*{price_b}")
    step_t, total = calc(f"{cost_a}+{cost_b}")
    step_c, change = calc(f"{bill}-{total}")
    question = (
        f"{name} buys {count_a} {many_a} for ${price_a} each and {count_b} {many_b} for ${price_b} each. "
        f"{name} pays with a ${bill} bill. How much change does {name} get back?"
    )
    answer = (
        f"The {many_a} cost {step_a} dollars.\n"
        f"The {many_b} cost {step_b} dollars.\n"
        f"Altogether {name} spends {step_t} dollars.\n"
        f"So {name} gets back {step_c} dollars.\n#### {change}"
    )
    return Problem(question=question, answer=answer, result=change, template="shopping_change")


def ages(rng: random.Random) -> Problem:
    child, parent = _two_names(rng)
    grandparent = rng.choice([n for n in NAMES if n not in (child, parent)])
    child_age = rng.randint(4, 15)
    times = rng.randint(2, 4)
    older = rng.randint(18, 30)
    years = rng.randint(2, 10)
    step_p, parent_age = calc(f"{child_age}*{times}")
    step_g, grand_age = calc(f"{parent_age}+{older}")
    step_f, future = calc(f"{grand_age}+{years}")
    question = (
        f"{child} is {child_age} years old. {parent} is {times} times as old as {child}. "
        f"{grandparent} is {older} years older than {parent}. How old will {grandparent} be in {years} years?"
    )
    answer = (
        f"{parent} is {step_p} years old.\n"
        f"{grandparent} is {step_g} years old.\n"
        f"In {years} years {grandparent} will be {step_f} years old.\n#### {future}"
    )
    return Problem(question=question, answer=answer, result=future, template="ages")


def distance_speed(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    speed_1, hours_1 = rng.randint(3, 12) * 5, rng.randint(2, 4)
    speed_2, hours_2 = rng.randint(3, 12) * 5, rng.randint(2, 5)
    step_1, dist_1 = calc(f"{speed_1}*{hours_1}")
    step_2, dist_2 = calc(f"{speed_2}*{hours_2}")
    step_t, total = calc(f"{dist_1}+{dist_2}")
    question = (
        f"{name} drives at {speed_1} miles per hour for {hours_1} hours, then at {speed_2} miles per hour "
        f"for {hours_2} more hours. How many miles does {name} drive in total?"
    )
    answer = (
        f"In the first part {name} drives {step_1} miles.\n"
        f"In the second part {name} drives {step_2} miles.\n"
        f"In total {name} drives {step_t} miles.\n#### {total}"
    )
    return Problem(question=question, answer=answer, result=total, template="distance_speed")


def travel_time(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    speed = rng.randint(2, 9) * 10
    hours = rng.randint(2, 8)
    distance = speed * hours
    stops, stop_minutes = rng.randint(1, 4), rng.choice([10, 15, 20, 30])
    step_h, driving = calc(f"{distance}/{speed}")
    step_m, driving_minutes = calc(f"{driving}*60")
    step_s, stopping = calc(f"{stops}*{stop_minutes}")
    step_t, total = calc(f"{driving_minutes}+{stopping}")
    question = (
        f"{name} has to travel {distance} kilometers at {speed} kilometers per hour. On the way {name} makes "
        f"{stops} stops of {stop_minutes} minutes each. How many minutes does the whole trip take?"
    )
    answer = (
        f"Driving takes {step_h} hours.\n"
        f"That is {step_m} minutes.\n"
        f"The stops take {step_s} minutes.\n"
        f"The whole trip takes {step_t} minutes.\n#### {total}"
    )
    return Problem(question=question, answer=answer, result=total, template="travel_time")


def fractions_given_away(rng: random.Random) -> Problem:
    name, friend = _two_names(rng)
    _, many = rng.choice(COUNTED)
    first = rng.choice([2, 3, 4, 5])
    second = rng.choice([2, 3, 4])
    start = first * second * rng.randint(2, 9)
    step_1, given = calc(f"{start}/{first}")
    step_r, rest = calc(f"{start}-{given}")
    step_2, lost = calc(f"{rest}/{second}")
    step_l, left = calc(f"{rest}-{lost}")
    question = (
        f"{name} has {start} {many}. {name} gives 1/{first} of them to {friend} and then loses 1/{second} "
        f"of the rest. How many {many} does {name} have left?"
    )
    answer = (
        f"{name} gives away {step_1} {many}.\n"
        f"{name} keeps {step_r} {many}.\n"
        f"{name} loses {step_2} {many}.\n"
        f"{name} has {step_l} {many} left.\n#### {left}"
    )
    return Problem(question=question, answer=answer, result=left, template="fractions_given_away")


def bakery_boxes(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    box = rng.choice([4, 6, 8, 12])
    trays, per_tray = rng.randint(3, 9), rng.randint(2, 6) * box
    sold = rng.randint(1, trays - 1) * per_tray // 2
    sold -= sold % box
    step_b, baked = calc(f"{trays}*{per_tray}")
    step_r, rest = calc(f"{baked}-{sold}")
    step_x, boxes = calc(f"{rest}/{box}")
    question = (
        f"{name} bakes {trays} trays of cookies with {per_tray} cookies on each tray. {name} sells {sold} "
        f"cookies at the market and packs the rest into boxes of {box}. How many boxes does {name} fill?"
    )
    answer = (
        f"{name} bakes {step_b} cookies.\n"
        f"After selling, {step_r} cookies are left.\n"
        f"They fill {step_x} boxes.\n#### {boxes}"
    )
    return Problem(question=question, answer=answer, result=boxes, template="bakery_boxes")


def discount(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    one, many = rng.choice(SHOP_ITEMS)
    percent = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 20) * (100 // percent) * 2
    count = rng.randint(2, 6)
    step_o, off = calc(f"{price}*{percent}/100")
    step_s, sale = calc(f"{price}-{off}")
    step_t, total = calc(f"{count}*{sale}")
    question = (
        f"A {one} costs ${price}. This week every {one} is {percent}% off. {name} buys {count} {many}. "
        f"How many dollars does {name} pay?"
    )
    answer = (
        f"The discount is {step_o} dollars per {one}.\n"
        f"Each {one} costs {step_s} dollars.\n"
        f"{name} pays {step_t} dollars.\n#### {total}"
    )
    return Problem(question=question, answer=answer, result=total, template="discount")


def wages(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    rate, hours, days = rng.randint(8, 25), rng.randint(3, 8), rng.randint(3, 6)
    spent = rng.randint(10, 60)
    step_d, per_day = calc(f"{rate}*{hours}")
    step_w, week = calc(f"{per_day}*{days}")
    step_l, left = calc(f"{week}-{spent}")
    question = (
        f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days this week. "
        f"{name} spends ${spent} on groceries. How much money does {name} have left from this week's pay?"
    )
    answer = (
        f"{name} earns {step_d} dollars a day.\n"
        f"This week {name} earns {step_w} dollars.\n"
        f"After groceries {name} has {step_l} dollars.\n#### {left}"
    )
    return Problem(question=question, answer=answer, result=left, template="wages")


def reading_days(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    per_day = rng.randint(5, 30)
    days_done = rng.randint(2, 6)
    days_left = rng.randint(2, 9)
    pages = per_day * (days_done + days_left)
    step_r, read = calc(f"{per_day}*{days_done}")
    step_l, left = calc(f"{pages}-{read}")
    step_d, days = calc(f"{left}/{per_day}")
    question = (
        f"{name}'s book has {pages} pages. {name} reads {per_day} pages every day and has read for "
        f"{days_done} days. How many more days does {name} need to finish the book?"
    )
    answer = (
        f"{name} has read {step_r} pages.\n"
        f"There are {step_l} pages left.\n"
        f"{name} needs {step_d} more days.\n#### {days}"
    )
    return Problem(question=question, answer=answer, result=days, template="reading_days")


def garden_rows(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    rows, per_row = rng.randint(3, 12), rng.randint(4, 15)
    died = rng.randint(1, rows * per_row // 3)
    tomatoes = rng.randint(2, 8)
    step_p, plants = calc(f"{rows}*{per_row}")
    step_a, alive = calc(f"{plants}-{died}")
    step_t, total = calc(f"{alive}*{tomatoes}")
    question = (
        f"{name} plants {rows} rows of tomato plants with {per_row} plants in each row. {died} plants die. "
        f"Each plant that lives gives {tomatoes} tomatoes. How many tomatoes does {name} pick?"
    )
    answer = (
        f"{name} plants {step_p} plants.\n"
        f"{step_a} plants live.\n"
        f"They give {step_t} tomatoes.\n#### {total}"
    )
    return Problem(question=question, answer=answer, result=total, template="garden_rows")


def savings_goal(rng: random.Random) -> Problem:
    name, relative = _two_names(rng)
    weekly, weeks, gift = rng.randint(5, 25), rng.randint(3, 12), rng.randint(10, 50)
    price = weekly * weeks + gift + rng.randint(5, 80)
    step_s, saved = calc(f"{weekly}*{weeks}")
    step_h, has = calc(f"{saved}+{gift}")
    step_n, needs = calc(f"{price}-{has}")
    question = (
        f"{name} wants a bike that costs ${price}. {name} saves ${weekly} every week for {weeks} weeks, and "
        f"{relative} gives {name} ${gift}. How much more money does {name} need?"
    )
    answer = (
        f"{name} saves {step_s} dollars.\n"
        f"With the gift {name} has {step_h} dollars.\n"
        f"{name} still needs {step_n} dollars.\n#### {needs}"
    )
    return Problem(question=question, answer=answer, result=needs, template="savings_goal")


def classroom(rng: random.Random) -> Problem:
    teacher = rng.choice(NAMES)
    groups = rng.choice([3, 4, 5])
    students = groups * rng.randint(5, 10)
    girls_part = rng.choice([k for k in range(1, groups)])
    pencils = rng.randint(2, 5)
    step_g, girls = calc(f"{students}*{girls_part}/{groups}")
    step_b, boys = calc(f"{students}-{girls}")
    step_p, total = calc(f"{boys}*{pencils}")
    question = (
        f"There are {students} students in {teacher}'s class. {girls_part}/{groups} of them are girls and "
        f"the rest are boys. {teacher} gives each boy {pencils} pencils. How many pencils does {teacher} give out?"
    )
    answer = (
        f"There are {step_g} girls.\n"
        f"There are {step_b} boys.\n"
        f"{teacher} gives out {step_p} pencils.\n#### {total}"
    )
    return Problem(question=question, answer=answer, result=total, template="classroom")


def recipe_scaling(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    cups, serves = rng.randint(2, 6), rng.choice([4, 6, 8])
    guests = serves * rng.randint(2, 6)
    bag = rng.choice([2, 4]) * cups
    while (cups * guests // serves) % bag:
        guests += serves
    step_b, batches = calc(f"{guests}/{serves}")
    step_c, needed = calc(f"{batches}*{cups}")
    step_x, bags = calc(f"{needed}/{bag}")
    question = (
        f"A pancake recipe uses {cups} cups of flour and serves {serves} people. {name} is cooking for "
        f"{guests} people. Flour comes in bags of {bag} cups. How many bags of flour does {name} need?"
    )
    answer = (
        f"{name} makes {step_b} batches.\n"
        f"That needs {step_c} cups of flour.\n"
        f"{name} needs {step_x} bags.\n#### {bags}"
    )
    return Problem(question=question, answer=answer, result=bags, template="recipe_scaling")


def bus_passengers(rng: random.Random) -> Problem:
    start = rng.randint(10, 40)
    off_1, on_1 = rng.randint(1, start // 2), rng.randint(2, 15)
    after_1 = start - off_1 + on_1
    off_2, on_2 = rng.randint(1, after_1 // 2), rng.randint(2, 15)
    step_1, after_1 = calc(f"{start}-{off_1}+{on_1}")
    step_2, after_2 = calc(f"{after_1}-{off_2}+{on_2}")
    question = (
        f"A bus leaves the station with {start} passengers. At the first stop {off_1} people get off and "
        f"{on_1} get on. At the second stop {off_2} get off and {on_2} get on. How many passengers are on "
        f"the bus now?"
    )
    answer = (
        f"After the first stop there are {step_1} passengers.\n"
        f"After the second stop there are {step_2} passengers.\n#### {after_2}"
    )
    return Problem(question=question, answer=answer, result=after_2, template="bus_passengers")


def test_average(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    tests = rng.randint(3, 5)
    target = rng.randint(70, 90)
    scores = [rng.randint(target - 15, min(100, target + 10)) for _ in range(tests - 1)]
    needed = target * tests - sum(scores)
    while not 0 <= needed <= 100:
        scores = [rng.randint(target - 10, min(100, target + 10)) for _ in range(tests - 1)]
        needed = target * tests - sum(scores)
    step_n, points = calc(f"{target}*{tests}")
    step_h, have = calc("+".join(str(s) for s in scores))
    step_l, last = calc(f"{points}-{have}")
    listed = ", ".join(str(s) for s in scores[:-1]) + f" and {scores[-1]}"
    question = (
        f"{name} scored {listed} on the first {tests - 1} tests. What score does {name} need on test "
        f"number {tests} to have an average of {target}?"
    )
    answer = (
        f"An average of {target} over {tests} tests needs {step_n} points.\n"
        f"{name} has {step_h} points so far.\n"
        f"{name} needs {step_l} on the last test.\n#### {last}"
    )
    return Problem(question=question, answer=answer, result=last, template="test_average")


def split_bill(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    friends = rng.randint(2, 6)
    people = friends + 1
    pizzas, pizza_price = rng.randint(2, 6), rng.randint(8, 16)
    drinks = people
    drink_price = rng.randint(1, 4)
    tip = (-(pizzas * pizza_price + drinks * drink_price)) % people + people * rng.randint(1, 3)
    step_p, pizza_cost = calc(f"{pizzas}*{pizza_price}")
    step_d, drink_cost = calc(f"{drinks}*{drink_price}")
    step_t, total = calc(f"{pizza_cost}+{drink_cost}+{tip}")
    step_s, share = calc(f"{total}/{people}")
    question = (
        f"{name} and {friends} friends order {pizzas} pizzas at ${pizza_price} each and one drink each at "
        f"${drink_price} a drink. They leave a ${tip} tip and split the bill equally. How much does each "
        f"person pay?"
    )
    answer = (
        f"The pizzas cost {step_p} dollars.\n"
        f"There are {people} people, so the drinks cost {step_d} dollars.\n"
        f"With the tip the bill is {step_t} dollars.\n"
        f"Each person pays {step_s} dollars.\n#### {share}"
    )
    return Problem(question=question, answer=answer, result=share, template="split_bill")


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    shopping_change, ages, distance_speed, travel_time, fractions_given_away, bakery_boxes, discount,
    wages, reading_days, garden_rows, savings_goal, classroom, recipe_scaling, bus_passengers,
    test_average, split_bill,
)


def generate(count: int, seed: int) -> list[Problem]:
    """`count` problems cycling through every template, numbers drawn from `random.Random(seed)`."""
    rng = random.Random(seed)
    return [TEMPLATES[i % len(TEMPLATES)](rng) for i in range(count)]


def generate_split(split: str) -> list[Problem]:
    count, seed = SPLITS[split]
    return generate(count, seed)


def to_jsonl(problems: list[Problem]) -> str:
    return "".join(json.dumps(p.as_record(), ensure_ascii=False) + "\n" for p in problems)


def write_files(folder: Path = DATA_DIR) -> dict[str, Path]:
    """Write `<split>.jsonl` for every split into `folder`; returns split -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        path.write_text(to_jsonl(generate_split(split)), encoding="utf-8")
        paths[split] = path
    return paths


if __name__ == "__main__":
    for split, path in write_files().items():
        print(f"{split}: {path}")

"""Training problems for kvgate's tiny models, kept apart from kvgate's gsm8k-format TEST problems.

kvgate's test problems come from `kvgate.workloads.gsm8k_problems` (16 templates, fixed seeds, the TEST split is 240
problems from seed 20261201). This module re-implements the *computation* of those 16 templates (same
number distributions, same arithmetic, same rng call order) and adds:

* other names: `TRAIN_NAMES` shares no name with `gsm8k_problems.NAMES`;
* other wordings: every template's question is built from per-sentence variants. Variant 0 of each
  sentence is the test wording; a training question may reuse at most half of the test sentences
  (rounded down), so the whole masked test question never occurs (checked below);
* other number tuples: a training problem whose (template, numbers) equals any test problem's is
  re-drawn (every template also has a disjoint-tuple check below);
* a more step-by-step answer than gsm8k's: short name-free lines "Label: a op b = c" (two operands per
  step; two-digit by two-digit products as partial products), last line `#### N`.

Faithfulness of the re-implementation: `render_original(...)` with the original names, items and
`random.Random(seed)` reproduces `gsm8k_problems.generate_split("test")` question for question and answer
number for answer number (`check_reimplementation()`).

Disjointness: `check_disjoint(train, test)` proves (a) no training masked question (names, items and
numbers masked) equals a test masked question, (b) no training (template, number tuple) equals a test one,
and reports n-gram overlap statistics of masked questions (word 8-gram and 13-gram containment of test in
train, per-question maximum 4-gram Jaccard similarity between a training question and any test question).

Run `python training_problems.py` for both checks and a few samples.
"""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

from kvgate.workloads import gsm8k_problems as G
from kvgate.workloads.training_wordings import SENTENCES, listed

TEST_NAMES = list(G.NAMES)
SHOP_ITEMS = list(G.SHOP_ITEMS)
COUNTED = list(G.COUNTED)

# Names for training: none of them is a test name (asserted below).
TRAIN_NAMES = [
    "Aaron", "Abby", "Adam", "Aisha", "Alan", "Alice", "Amara", "Amir", "Andre", "Anika", "Anna", "Arjun",
    "Asha", "Ben", "Bianca", "Boris", "Brian", "Bruno", "Caleb", "Camila", "Carmen", "Cathy", "Chen",
    "Chloe", "Chris", "Clara", "Colin", "Dana", "Daniel", "Daria", "David", "Diego", "Dora", "Dylan",
    "Elena", "Elif", "Ella", "Emil", "Emma", "Eric", "Erin", "Ethan", "Eva", "Fatima", "Felix", "Fiona",
    "Frank", "Gabe", "Gemma", "George", "Gina", "Greta", "Hamid", "Hannah", "Hugo", "Ian", "Ines",
    "Irene", "Isaac", "Iris", "Jack", "Jade", "Jamal", "Jana", "Jason", "Jin", "Joel", "John", "Jonas",
    "Jorge", "Josh", "Kai", "Kara", "Karim", "Kate", "Kevin", "Kim", "Kofi", "Laila", "Lara", "Laura",
    "Liam", "Lily", "Linda", "Lucas", "Lucy", "Luis", "Maya", "Max", "Mia", "Mike", "Mila", "Nadia",
    "Nathan", "Noah", "Nora", "Olga", "Oliver", "Olivia", "Oscar", "Paul", "Pedro", "Peter", "Quinn",
    "Rachel", "Rahul", "Raj", "Rana", "Ravi", "Rita", "Rob", "Ruby", "Ryan", "Sara", "Sofia", "Sven",
    "Tara", "Ted", "Theo", "Tom", "Uma", "Victor", "Vera", "Wanda", "Will", "Xavier", "Yara", "Yusuf",
    "Zane", "Zara", "Zoe", "Ahmed", "Bella", "Derek", "Elsa", "Farah", "Hector", "Jasmine", "Keiko",
    "Lars", "Marco", "Noor", "Pablo", "Sanjay", "Tariq", "Ursula", "Wei", "Yuki",
]
assert not set(TRAIN_NAMES) & set(TEST_NAMES), "training and test names must be disjoint"
assert len(set(TRAIN_NAMES)) == len(TRAIN_NAMES)

# Items: the test's items plus more (items only appear in questions; the answers name no item).
TRAIN_SHOP_ITEMS = [*SHOP_ITEMS,
    ("pen", "pens"), ("hat", "hats"), ("mug", "mugs"), ("pair of socks", "pairs of socks"),
    ("cookie", "cookies"), ("lamp", "lamps"), ("box of crayons", "boxes of crayons"), ("ball", "balls"),
    ("comic book", "comic books"), ("sandwich", "sandwiches"), ("plant", "plants"), ("scarf", "scarves"),
]
TRAIN_COUNTED = [*COUNTED,
    ("button", "buttons"), ("pebble", "pebbles"), ("ribbon", "ribbons"), ("toy soldier", "toy soldiers"),
    ("postcard", "postcards"), ("crayon", "crayons"), ("feather", "feathers"), ("key chain", "key chains"),
]


@dataclass(slots=True)
class Slots:
    """One drawn problem: its template, numbers (in the test wording's order), names and items."""

    template: str
    nums: dict
    names: dict = field(default_factory=dict)
    items: dict = field(default_factory=dict)

    def key(self) -> tuple:
        """(template, numbers in the order the test wording mentions them) -- the number tuple."""
        return (self.template, tuple(int(x) for x in re.findall(r"\d+", render_original(self))))


# ---- samplers: the computation of gsm8k_problems' 16 templates, same rng call order -------------------


def s_shopping_change(rng, names, shop, counted):
    name = rng.choice(names)
    (_, many_a), (_, many_b) = rng.sample(shop, 2)
    ca, pa = rng.randint(2, 9), rng.randint(2, 15)
    cb, pb = rng.randint(2, 6), rng.randint(3, 20)
    total = ca * pa + cb * pb
    bill = next(b for b in (20, 50, 100, 200, 500) if b >= total + 1)
    return Slots("shopping_change", dict(ca=ca, pa=pa, cb=cb, pb=pb, bill=bill), dict(N=name),
                 dict(A=many_a, B=many_b))


def s_ages(rng, names, shop, counted):
    child, parent = rng.sample(names, 2)
    grand = rng.choice([n for n in names if n not in (child, parent)])
    c, t, o, y = rng.randint(4, 15), rng.randint(2, 4), rng.randint(18, 30), rng.randint(2, 10)
    return Slots("ages", dict(c=c, t=t, o=o, y=y), dict(C=child, P=parent, G=grand))


def s_distance_speed(rng, names, shop, counted):
    name = rng.choice(names)
    s1, h1 = rng.randint(3, 12) * 5, rng.randint(2, 4)
    s2, h2 = rng.randint(3, 12) * 5, rng.randint(2, 5)
    return Slots("distance_speed", dict(s1=s1, h1=h1, s2=s2, h2=h2), dict(N=name))


def s_travel_time(rng, names, shop, counted):
    name = rng.choice(names)
    speed = rng.randint(2, 9) * 10
    hours = rng.randint(2, 8)
    stops, minutes = rng.randint(1, 4), rng.choice([10, 15, 20, 30])
    return Slots("travel_time", dict(d=speed * hours, s=speed, k=stops, m=minutes), dict(N=name))


def s_fractions_given_away(rng, names, shop, counted):
    name, friend = rng.sample(names, 2)
    _, many = rng.choice(counted)
    first, second = rng.choice([2, 3, 4, 5]), rng.choice([2, 3, 4])
    start = first * second * rng.randint(2, 9)
    return Slots("fractions_given_away", dict(start=start, f=first, s=second), dict(N=name, F=friend),
                 dict(M=many))


def s_bakery_boxes(rng, names, shop, counted):
    name = rng.choice(names)
    box = rng.choice([4, 6, 8, 12])
    trays, per_tray = rng.randint(3, 9), rng.randint(2, 6) * box
    sold = rng.randint(1, trays - 1) * per_tray // 2
    sold -= sold % box
    return Slots("bakery_boxes", dict(t=trays, p=per_tray, sold=sold, box=box), dict(N=name))


def s_discount(rng, names, shop, counted):
    name = rng.choice(names)
    one, many = rng.choice(shop)
    pct = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 20) * (100 // pct) * 2
    count = rng.randint(2, 6)
    return Slots("discount", dict(price=price, pct=pct, count=count), dict(N=name), dict(one=one, many=many))


def s_wages(rng, names, shop, counted):
    name = rng.choice(names)
    rate, hours, days = rng.randint(8, 25), rng.randint(3, 8), rng.randint(3, 6)
    spent = rng.randint(10, 60)
    return Slots("wages", dict(rate=rate, h=hours, d=days, spent=spent), dict(N=name))


def s_reading_days(rng, names, shop, counted):
    name = rng.choice(names)
    pd, dd, dl = rng.randint(5, 30), rng.randint(2, 6), rng.randint(2, 9)
    return Slots("reading_days", dict(pages=pd * (dd + dl), pd=pd, dd=dd), dict(N=name))


def s_garden_rows(rng, names, shop, counted):
    name = rng.choice(names)
    rows, per_row = rng.randint(3, 12), rng.randint(4, 15)
    died = rng.randint(1, rows * per_row // 3)
    tomatoes = rng.randint(2, 8)
    return Slots("garden_rows", dict(r=rows, pr=per_row, died=died, t=tomatoes), dict(N=name))


def s_savings_goal(rng, names, shop, counted):
    name, relative = rng.sample(names, 2)
    w, k, gift = rng.randint(5, 25), rng.randint(3, 12), rng.randint(10, 50)
    price = w * k + gift + rng.randint(5, 80)
    return Slots("savings_goal", dict(price=price, w=w, k=k, gift=gift), dict(N=name, F=relative))


def s_classroom(rng, names, shop, counted):
    teacher = rng.choice(names)
    groups = rng.choice([3, 4, 5])
    students = groups * rng.randint(5, 10)
    girls_part = rng.choice([k for k in range(1, groups)])
    pencils = rng.randint(2, 5)
    return Slots("classroom", dict(st=students, g=girls_part, gr=groups, p=pencils), dict(T=teacher))


def s_recipe_scaling(rng, names, shop, counted):
    name = rng.choice(names)
    cups, serves = rng.randint(2, 6), rng.choice([4, 6, 8])
    guests = serves * rng.randint(2, 6)
    bag = rng.choice([2, 4]) * cups
    while (cups * guests // serves) % bag:
        guests += serves
    return Slots("recipe_scaling", dict(c=cups, sv=serves, g=guests, bag=bag), dict(N=name))


def s_bus_passengers(rng, names, shop, counted):
    start = rng.randint(10, 40)
    o1, n1 = rng.randint(1, start // 2), rng.randint(2, 15)
    after = start - o1 + n1
    o2, n2 = rng.randint(1, after // 2), rng.randint(2, 15)
    return Slots("bus_passengers", dict(start=start, o1=o1, n1=n1, o2=o2, n2=n2))


def s_test_average(rng, names, shop, counted):
    name = rng.choice(names)
    tests = rng.randint(3, 5)
    target = rng.randint(70, 90)
    scores = [rng.randint(target - 15, min(100, target + 10)) for _ in range(tests - 1)]
    needed = target * tests - sum(scores)
    while not 0 <= needed <= 100:
        scores = [rng.randint(target - 10, min(100, target + 10)) for _ in range(tests - 1)]
        needed = target * tests - sum(scores)
    return Slots("test_average", dict(scores=tuple(scores), tests=tests, target=target), dict(N=name))


def s_split_bill(rng, names, shop, counted):
    name = rng.choice(names)
    friends = rng.randint(2, 6)
    people = friends + 1
    pz, pp = rng.randint(2, 6), rng.randint(8, 16)
    dp = rng.randint(1, 4)
    tip = (-(pz * pp + people * dp)) % people + people * rng.randint(1, 3)
    return Slots("split_bill", dict(f=friends, pz=pz, pp=pp, dp=dp, tip=tip), dict(N=name))


SAMPLERS = {
    "shopping_change": s_shopping_change, "ages": s_ages, "distance_speed": s_distance_speed,
    "travel_time": s_travel_time, "fractions_given_away": s_fractions_given_away,
    "bakery_boxes": s_bakery_boxes, "discount": s_discount, "wages": s_wages, "reading_days": s_reading_days,
    "garden_rows": s_garden_rows, "savings_goal": s_savings_goal, "classroom": s_classroom,
    "recipe_scaling": s_recipe_scaling, "bus_passengers": s_bus_passengers, "test_average": s_test_average,
    "split_bill": s_split_bill,
}
TEMPLATE_ORDER = [t.__name__ for t in G.TEMPLATES]
assert list(SAMPLERS) == TEMPLATE_ORDER, "template order must follow gsm8k_problems.TEMPLATES"


# ---- wordings (kvgate.workloads.training_wordings): variant 0 of every sentence is the test wording ---------

def _fields(s: Slots) -> dict:
    f = dict(s.nums)
    f.update(s.names)
    f.update(s.items)
    if s.template == "test_average":
        f["listed"] = listed(s.nums["scores"])
        f["k"] = s.nums["tests"] - 1
    return f


def render(s: Slots, choice: tuple[int, ...]) -> str:
    fields = _fields(s)
    return " ".join(SENTENCES[s.template][i][c].format(**fields) for i, c in enumerate(choice))


def render_original(s: Slots) -> str:
    """The question in the exact test wording (all variants 0)."""
    return render(s, (0,) * len(SENTENCES[s.template]))


def allowed_choices(template: str) -> list[tuple[int, ...]]:
    """Variant combinations a training question may use: at most half of its sentences (rounded down)
    in the test wording, so the whole test wording never occurs."""
    import itertools

    sizes = [len(v) for v in SENTENCES[template]]
    limit = len(sizes) // 2
    return [c for c in itertools.product(*[range(n) for n in sizes]) if sum(x == 0 for x in c) <= limit]


# ---- answers -----------------------------------------------------------------------------------------

def _val(expr: str) -> int:
    v = G.evaluate(expr)
    assert v.denominator == 1, expr
    return int(v)


WIDTH = 4  # style "rev": every number in the worked steps is written with 4 digits, least significant first


def fmt(n: int, style: str) -> str:
    """A number as the worked steps write it: plain, or (style 'rev') zero-padded to WIDTH digits and
    reversed (48 -> '8400'), so that digits of equal place value sit at fixed distances."""
    if style == "rev":
        assert 0 <= n < 10 ** WIDTH, n
        return str(n).zfill(WIDTH)[::-1]
    return str(n)


def _mul(a: int, b: int, style: str) -> tuple[str, int]:
    """'a*b = c', or for two factors >= 10 'a*b = a*T+a*U = x+y = c' (partial products)."""
    c = a * b
    f = lambda n: fmt(n, style)  # noqa: E731
    if style in ("partial", "rev") and a >= 10 and b >= 10 and b % 10:
        tens, units = b - b % 10, b % 10
        return f"{f(a)}*{f(b)} = {f(a)}*{f(tens)}+{f(a)}*{f(units)} = {f(a * tens)}+{f(a * units)} = {f(c)}", c
    return f"{f(a)}*{f(b)} = {f(c)}", c


def _op(a: int, op: str, b: int, style: str) -> tuple[str, int]:
    if op == "*":
        return _mul(a, b, style)
    c = _val(f"{a}{op}{b}")
    return f"{fmt(a, style)}{op}{fmt(b, style)} = {fmt(c, style)}", c


def solve(s: Slots, style: str = "partial") -> tuple[str, int]:
    """The worked answer (name-free lines, last line '#### N') and N."""
    n, t = s.nums, s.template
    lines: list[str] = []

    def step(label: str, a: int, op: str, b: int, unit: str = "") -> int:
        text, c = _op(a, op, b, style)
        lines.append(f"{label}: {text}.")
        return c

    if t == "shopping_change":
        x = step("First items", n["ca"], "*", n["pa"], "dollars")
        y = step("Second items", n["cb"], "*", n["pb"], "dollars")
        tot = step("Total", x, "+", y, "dollars")
        r = step("Change", n["bill"], "-", tot, "dollars")
    elif t == "ages":
        p = step("Second person", n["c"], "*", n["t"], "years")
        g = step("Third person", p, "+", n["o"], "years")
        r = step("Later", g, "+", n["y"], "years")
    elif t == "distance_speed":
        a = step("First part", n["s1"], "*", n["h1"], "miles")
        b = step("Second part", n["s2"], "*", n["h2"], "miles")
        r = step("Total", a, "+", b, "miles")
    elif t == "travel_time":
        h = step("Driving", n["d"], "/", n["s"], "hours")
        m = step("In minutes", h, "*", 60, "minutes")
        st = step("Stops", n["k"], "*", n["m"], "minutes")
        r = step("Total", m, "+", st, "minutes")
    elif t == "fractions_given_away":
        g = step("Given away", n["start"], "/", n["f"])
        k = step("Kept", n["start"], "-", g)
        lo = step("Lost", k, "/", n["s"])
        r = step("Left", k, "-", lo)
    elif t == "bakery_boxes":
        b = step("Baked", n["t"], "*", n["p"], "cookies")
        rest = step("Left", b, "-", n["sold"], "cookies")
        r = step("Boxes", rest, "/", n["box"])
    elif t == "discount":
        off = step(f"{n['pct']}% off", n["price"], "/", 100 // n["pct"], "dollars")
        sale = step("Sale price", n["price"], "-", off, "dollars")
        r = step("Total", n["count"], "*", sale, "dollars")
    elif t == "wages":
        day = step("Per day", n["rate"], "*", n["h"], "dollars")
        week = step("This week", day, "*", n["d"], "dollars")
        r = step("Left", week, "-", n["spent"], "dollars")
    elif t == "reading_days":
        rd = step("Read", n["pd"], "*", n["dd"], "pages")
        left = step("Pages left", n["pages"], "-", rd, "pages")
        r = step("Days", left, "/", n["pd"])
    elif t == "garden_rows":
        pl = step("Plants", n["r"], "*", n["pr"])
        al = step("Alive", pl, "-", n["died"])
        r = step("Tomatoes", al, "*", n["t"])
    elif t == "savings_goal":
        sv = step("Saved", n["w"], "*", n["k"], "dollars")
        has = step("With the gift", sv, "+", n["gift"], "dollars")
        r = step("Still needed", n["price"], "-", has, "dollars")
    elif t == "classroom":
        part = step("One part", n["st"], "/", n["gr"])
        girls = step("Girls", part, "*", n["g"])
        boys = step("Boys", n["st"], "-", girls)
        r = step("Pencils", boys, "*", n["p"])
    elif t == "recipe_scaling":
        bt = step("Batches", n["g"], "/", n["sv"])
        cups = step("Flour", bt, "*", n["c"], "cups")
        r = step("Bags", cups, "/", n["bag"])
    elif t == "bus_passengers":
        a = step("First stop off", n["start"], "-", n["o1"])
        b = step("First stop on", a, "+", n["n1"])
        c = step("Second stop off", b, "-", n["o2"])
        r = step("Second stop on", c, "+", n["n2"])
    elif t == "test_average":
        pts = step("Points needed", n["target"], "*", n["tests"])
        sc = n["scores"]
        have = sc[0]
        for x in sc[1:]:
            have = step("Points so far", have, "+", x)
        r = step("Last test", pts, "-", have)
    elif t == "split_bill":
        people = step("People", n["f"], "+", 1)
        pz = step("Pizzas", n["pz"], "*", n["pp"], "dollars")
        dr = step("Drinks", people, "*", n["dp"], "dollars")
        food = step("Food", pz, "+", dr, "dollars")
        bill = step("With the tip", food, "+", n["tip"], "dollars")
        r = step("Each person", bill, "/", people, "dollars")
    else:
        raise ValueError(t)
    lines.append(f"#### {r}")
    return "\n".join(lines), r


def reference_result(s: Slots) -> int:
    """The answer computed the way gsm8k_problems computes it (independent of solve)."""
    n, t = s.nums, s.template
    if t == "shopping_change":
        return n["bill"] - (n["ca"] * n["pa"] + n["cb"] * n["pb"])
    if t == "ages":
        return n["c"] * n["t"] + n["o"] + n["y"]
    if t == "distance_speed":
        return n["s1"] * n["h1"] + n["s2"] * n["h2"]
    if t == "travel_time":
        return n["d"] // n["s"] * 60 + n["k"] * n["m"]
    if t == "fractions_given_away":
        rest = n["start"] - n["start"] // n["f"]
        return rest - rest // n["s"]
    if t == "bakery_boxes":
        return (n["t"] * n["p"] - n["sold"]) // n["box"]
    if t == "discount":
        return n["count"] * (n["price"] - n["price"] * n["pct"] // 100)
    if t == "wages":
        return n["rate"] * n["h"] * n["d"] - n["spent"]
    if t == "reading_days":
        return (n["pages"] - n["pd"] * n["dd"]) // n["pd"]
    if t == "garden_rows":
        return (n["r"] * n["pr"] - n["died"]) * n["t"]
    if t == "savings_goal":
        return n["price"] - n["w"] * n["k"] - n["gift"]
    if t == "classroom":
        return (n["st"] - n["st"] * n["g"] // n["gr"]) * n["p"]
    if t == "recipe_scaling":
        return n["g"] // n["sv"] * n["c"] // n["bag"]
    if t == "bus_passengers":
        return n["start"] - n["o1"] + n["n1"] - n["o2"] + n["n2"]
    if t == "test_average":
        return n["target"] * n["tests"] - sum(n["scores"])
    if t == "split_bill":
        p = n["f"] + 1
        return Fraction(n["pz"] * n["pp"] + p * n["dp"] + n["tip"], p).numerator
    raise ValueError(t)


# ---- generation --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TrainProblem:
    question: str
    answer: str
    result: int
    template: str
    key: tuple


def test_problems() -> list[Slots]:
    """The 240 TEST problems, re-drawn with the re-implemented samplers (verified identical)."""
    count, seed = G.SPLITS["test"]
    return draw_slots(count, seed, TEST_NAMES, SHOP_ITEMS, COUNTED)


def draw_slots(count, seed, names, shop, counted) -> list[Slots]:
    rng = random.Random(seed)
    return [SAMPLERS[TEMPLATE_ORDER[i % 16]](rng, names, shop, counted) for i in range(count)]


def dev_problems(count: int, seed: int, style: str = "partial") -> list[TrainProblem]:
    """A test-LIKE dev set for monitoring: the test wording and test names, but number tuples that are
    not test tuples (never used for training)."""
    exclude = {s.key() for s in test_problems()}
    rng = random.Random(seed)
    out = []
    for i in range(count):
        template = TEMPLATE_ORDER[i % 16]
        while True:
            s = SAMPLERS[template](rng, TEST_NAMES, SHOP_ITEMS, COUNTED)
            if s.key() not in exclude:
                break
        answer, result = solve(s, style)
        out.append(TrainProblem(render_original(s), answer, result, template, s.key()))
    return out


def drill_lines(problems) -> list[tuple[str, str]]:
    """The arithmetic steps of (training) problems as (left side 'a op b =', right side ' c'): the
    arithmetic drill rows mixed into training are made of these."""
    out = []
    for p in problems:
        for line in p.answer.split("\n")[:-1]:
            expr = line.split(": ", 1)[1].rstrip(".")
            lhs, rhs = expr.split(" = ", 1)
            out.append((lhs + " =", " " + rhs))
    return out


def check_reimplementation() -> None:
    """Re-drawing kvgate's splits with the original names/items and seeds reproduces them exactly."""
    for split in G.SPLITS:
        count, seed = G.SPLITS[split]
        mine = draw_slots(count, seed, TEST_NAMES, SHOP_ITEMS, COUNTED)
        theirs = G.generate_split(split)
        for s, p in zip(mine, theirs, strict=True):
            assert s.template == p.template
            assert render_original(s) == p.question, (render_original(s), p.question)
            assert solve(s)[1] == p.result == reference_result(s), (s, p.result)


def generate_training(count: int, seed: int, style: str = "partial",
                      exclude: set | None = None) -> list[TrainProblem]:
    """`count` training problems cycling through the 16 templates: training names and items, a random
    allowed wording, and a number tuple that is not in `exclude` (the test tuples by default)."""
    if exclude is None:
        exclude = {s.key() for s in test_problems()}
    rng = random.Random(seed)
    choices = {t: allowed_choices(t) for t in SENTENCES}
    out = []
    for i in range(count):
        template = TEMPLATE_ORDER[i % 16]
        while True:
            s = SAMPLERS[template](rng, TRAIN_NAMES, TRAIN_SHOP_ITEMS, TRAIN_COUNTED)
            key = s.key()
            if key not in exclude:
                break
        question = render(s, rng.choice(choices[template]))
        answer, result = solve(s, style)
        out.append(TrainProblem(question, answer, result, template, key))
    return out


# ---- disjointness check ------------------------------------------------------------------------------

_ALL_NAMES = sorted(set(TEST_NAMES) | set(TRAIN_NAMES), key=len, reverse=True)
_ALL_ITEMS = sorted({w for pair in (TRAIN_SHOP_ITEMS + TRAIN_COUNTED) for w in pair}, key=len, reverse=True)
_NAME_RE = re.compile(r"\b(" + "|".join(map(re.escape, _ALL_NAMES)) + r")\b")
_ITEM_RE = re.compile(r"\b(" + "|".join(map(re.escape, _ALL_ITEMS)) + r")\b")


def mask(question: str) -> str:
    """Names -> <NAME>, items -> <ITEM>, numbers -> <N>; whitespace normalised."""
    q = _NAME_RE.sub("<NAME>", question)
    q = _ITEM_RE.sub("<ITEM>", q)
    q = re.sub(r"\d+", "<N>", q)
    return " ".join(q.split())


def _ngrams(words: list[str], n: int) -> set:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def check_disjoint(train: list[TrainProblem], test: list[Slots] | None = None) -> dict:
    """Raises ValueError on any exact masked-question match or number-tuple match; returns stats."""
    test = test if test is not None else test_problems()
    test_q = [render_original(s) for s in test]
    test_masked = {mask(q) for q in test_q}
    test_keys = {s.key() for s in test}
    train_masks = [mask(p.question) for p in train]  # each masked once (masking is most of this check's time)
    # exact: masked text and (template, numbers)
    masked_hits = sum(m in test_masked for m in train_masks)
    key_hits = sum(p.key in test_keys for p in train)
    # also: any identical raw question
    raw_hits = len({p.question for p in train} & set(test_q))
    # names
    test_name = re.compile(r"\b(" + "|".join(TEST_NAMES) + r")\b")
    name_hits = sum(bool(test_name.search(p.question)) for p in train)
    # n-gram statistics over masked word sequences
    test_words = [mask(q).split() for q in set(test_q)]
    train_masked = Counter(train_masks)
    train_words = [m.split() for m in train_masked]
    stats = {"train": len(train), "test": len(test), "exact_masked_matches": masked_hits,
             "number_tuple_matches": key_hits, "identical_questions": raw_hits,
             "train_questions_with_test_names": name_hits,
             "distinct_masked_train_questions": len(train_masked),
             "distinct_masked_test_questions": len(test_masked)}
    for n in (8, 13):
        tr = set().union(*(_ngrams(w, n) for w in train_words))
        te = [_ngrams(w, n) for w in test_words]
        grams = set().union(*te)
        stats[f"test_{n}gram_in_train_frac"] = round(len(grams & tr) / max(1, len(grams)), 3)
        stats[f"test_questions_with_any_{n}gram_in_train_frac"] = round(sum(bool(g & tr) for g in te) / len(te), 3)
    # per distinct masked training question: max 4-gram Jaccard with any masked test question
    te4 = [_ngrams(w, 4) for w in {tuple(w) for w in test_words}]
    best = []
    for w in train_words:
        g = _ngrams(w, 4)
        best.append(max(len(g & t) / len(g | t) for t in te4))
    best.sort()
    stats["max_4gram_jaccard_train_vs_test"] = round(best[-1], 3)
    stats["median_4gram_jaccard_train_vs_test"] = round(best[len(best) // 2], 3)
    stats["p95_4gram_jaccard_train_vs_test"] = round(best[int(0.95 * (len(best) - 1))], 3)
    if masked_hits or key_hits or raw_hits or name_hits:
        raise ValueError(f"training problems overlap the test problems: {stats}")
    return stats


if __name__ == "__main__":
    check_reimplementation()
    print("re-implementation reproduces kvgate's train and test splits exactly")
    train = generate_training(int(sys.argv[1]) if len(sys.argv) > 1 else 20000, seed=1234)
    import json

    print(json.dumps(check_disjoint(train), indent=1))
    for p in train[:16]:
        print("Q:", p.question)
        print("A:", p.answer.replace("\n", " | "))

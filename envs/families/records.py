"""`records`: answer questions over a small generated record store with `search`, `get`, `answer`.

No sandbox needed. Each task carries its own store of people (id, name, city, department, age,
manager, email). Questions need several tool calls and grow harder with the difficulty level:

1. one lookup         "What is the email of Ada Moreau?"          search -> get -> answer
2. a two-hop lookup   "In which city does Ada Moreau's manager work?"  search -> get -> get -> answer
3. an aggregate       "How many people in Sales are older than 40?"  search -> get x N -> answer

Held-out tasks use surnames, cities, departments and question wordings that train never uses,
so a model cannot pass held-out by memorising train instructions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from toolgym.envs.core import ToolEnv
from toolgym.envs.registry import register_env
from toolgym.envs.tools import ToolError, tool
from toolgym.tasks import HELDOUT, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite

FIRST = [
    "Ada",
    "Ben",
    "Cleo",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Ines",
    "Jon",
    "Kai",
    "Lea",
    "Milo",
    "Nora",
    "Omar",
    "Pia",
    "Quin",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Vik",
    "Wren",
    "Yara",
]
LAST = {
    "train": [
        "Moreau",
        "Okafor",
        "Lindqvist",
        "Tanaka",
        "Silva",
        "Novak",
        "Haddad",
        "Kowalski",
        "Reyes",
        "Nguyen",
        "Fischer",
        "Rossi",
        "Byrne",
        "Dubois",
        "Sato",
        "Petrov",
    ],
    HELDOUT: ["Achebe", "Bergman", "Castillo", "Dvorak", "Eriksen", "Fontaine", "Gallo", "Horvat"],
}
CITIES = {"train": ["Oslo", "Lima", "Porto", "Kyoto", "Dakar", "Quito"], HELDOUT: ["Tartu", "Cusco", "Braga", "Nara"]}
DEPTS = {"train": ["Sales", "Research", "Legal", "Support"], HELDOUT: ["Design", "Finance", "Audit"]}
FIELDS = ("email", "city", "department", "age")

WORDING = {
    "train": {
        "lookup": "What is the {field} of {name}?",
        "manager": "In which city does the manager of {name} work?",
        "count": "How many people in the {dept} department are older than {age}?",
    },
    HELDOUT: {
        "lookup": "Look up {name} and tell me their {field}.",
        "manager": "{name} reports to someone. Which city is that person based in?",
        "count": "Count the {dept} staff whose age exceeds {age}.",
    },
}


def _key(split: str) -> str:
    return HELDOUT if split == HELDOUT else "train"


def _make_store(rng: np.random.Generator, n: int, split: str) -> list[dict[str, Any]]:
    k = _key(split)
    names = [f"{f} {l}" for f in FIRST for l in LAST[k]]
    chosen = rng.choice(len(names), size=n, replace=False)
    people = []
    for i, idx in enumerate(chosen):
        name = names[int(idx)]
        people.append(
            {
                "id": f"P{i + 1:02d}",
                "name": name,
                "city": str(rng.choice(CITIES[k])),
                "department": str(rng.choice(DEPTS[k])),
                "age": int(rng.integers(22, 66)),
                "manager": None,
                "email": name.lower().replace(" ", ".") + "@corp.example",
            }
        )
    for i, person in enumerate(people):
        if i > 0:  # everyone but P01 reports to someone earlier in the list: a tree
            person["manager"] = people[int(rng.integers(0, i))]["id"]
    return people


def generate_records_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for the records family."""
    rng = np.random.default_rng([seed, index])
    difficulty = int(index % 3) + 1
    k = _key(split)
    store = _make_store(rng, 6 + 3 * difficulty, split)
    by_id = {p["id"]: p for p in store}
    wording = WORDING[k]

    def search(field: str, value: str) -> ToolCall:
        return ToolCall(name="search", arguments={"field": field, "value": value})

    def get(rid: str) -> ToolCall:
        return ToolCall(name="get", arguments={"record_id": rid})

    if difficulty == 1:
        person = store[int(rng.integers(len(store)))]
        field = str(rng.choice(FIELDS))
        instruction = wording["lookup"].format(field=field, name=person["name"])
        answer = str(person[field])
        oracle = [search("name", person["name"]), get(person["id"])]
        kind = "lookup"
    elif difficulty == 2:
        person = store[int(rng.integers(1, len(store)))]
        boss = by_id[person["manager"]]
        instruction = wording["manager"].format(name=person["name"])
        answer = boss["city"]
        oracle = [search("name", person["name"]), get(person["id"]), get(boss["id"])]
        kind = "manager"
    else:
        dept = str(rng.choice(DEPTS[k]))
        age = int(rng.integers(30, 56))
        members = [p for p in store if p["department"] == dept]
        instruction = wording["count"].format(dept=dept, age=age)
        answer = str(sum(p["age"] > age for p in members))
        oracle = [search("department", dept)] + [get(p["id"]) for p in members]
        kind = "count"
    oracle.append(ToolCall(name="answer", arguments={"text": answer}))
    return Task(
        env_id="toolgym/records-v0",
        instruction=instruction,
        family=f"records/{kind}",
        difficulty=difficulty,
        split=split,
        hidden=HiddenSpec(kind="answer", answer=answer, match="normalized"),
        oracle=tuple(oracle),
        data={"records": store},
        metadata={"generator": "records", "seed": seed, "index": index},
    )


register_suite(
    SuiteSpec(
        name="records",
        generator=generate_records_task,
        train_size=1000,
        heldout_size=200,
        version="1",
        description="questions over a small record store (search/get/answer), difficulty 1-3",
    )
)


@register_env("records-v0", suite="records", max_turns=16)
class RecordsEnv(ToolEnv):
    """Answer a question about people in a small record store using search, get and answer."""

    default_suite = "records"
    max_turns = 16

    def load_task(self, task: Task) -> None:
        """Load the task's record store."""
        self.records = {r["id"]: dict(r) for r in task.data["records"]}

    @tool
    def search(self, field: str, value: str) -> str:
        """Find records whose field equals a value (case-insensitive); returns ids and names.

        Args:
            field: one of name, city, department
            value: the value to look for, e.g. "Oslo"
        """
        if field not in ("name", "city", "department"):
            raise ToolError(f"cannot search by {field!r}; use name, city or department")
        hits = [r for r in self.records.values() if str(r[field]).lower() == value.strip().lower()]
        if not hits:
            return f"no records with {field} = {value!r}"
        return "\n".join(f"{r['id']} {r['name']}" for r in hits)

    @tool
    def get(self, record_id: str) -> str:
        """Return every field of one record.

        Args:
            record_id: a record id such as P03
        """
        record = self.records.get(record_id.strip().upper())
        if record is None:
            raise ToolError(f"no record {record_id!r}; ids look like P01 (use search first)")
        return " ".join(f"{k}={'none' if v is None else v}" for k, v in record.items())

    @tool(final=True)
    def answer(self, text: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            text: the answer, e.g. a name, a city or a number
        """
        self.submitted = text
        return "answer recorded"

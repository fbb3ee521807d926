"""`staff`: change a small staff register: look people up, then make the change each sentence asks.

No sandbox needed: the register lives in the environment. Each task asks for one or two changes
to people in a generated register (id, name, city, department): a move to another city, a
transfer to another department, a new surname, or a departure. Every change needs the person's
record id, which only `list_staff` shows, so an episode reads before it writes. The write tool is
chosen by what the sentence means (no sentence names a tool), and a campaign may list the tools
in a drawn order (`shuffle_tools`), so that a tool's place says nothing about when to call it.

Graded from the register the episode leaves (its final state, as JSON) by the registered
`staff-register` scorer against the expected register in the hidden spec: passed when every
asked change is made and nothing else changed.
Held-out tasks use other surnames, cities, departments and wordings.

Why it exists: it is a demonstrable multi-turn family whose later turn depends on the sentence,
for SFT stages that teach the read-then-choose-a-write form on one family and leave another
family (e.g. `mcp-inventory`) to its reward alone.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from toolgym.envs.core import ToolEnv
from toolgym.envs.registry import register_env
from toolgym.envs.tools import ToolError, tool
from toolgym.tasks import HELDOUT, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite
from toolgym.verifiers.score import register_scorer

SUITE = "staff"
FIRST = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kai", "Lea", "Milo", "Nora", "Omar", "Pia"]
LAST = {
    "train": ["Moreau", "Okafor", "Lindqvist", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski", "Reyes", "Nguyen", "Fischer", "Rossi"],
    HELDOUT: ["Achebe", "Bergman", "Castillo", "Dvorak", "Eriksen", "Fontaine", "Gallo", "Horvat"],
}
CITIES = {"train": ["Oslo", "Lima", "Porto", "Kyoto", "Dakar", "Quito"], HELDOUT: ["Tartu", "Cusco", "Braga", "Nara"]}
DEPTS = {"train": ["Sales", "Research", "Legal", "Support"], HELDOUT: ["Design", "Finance", "Audit"]}
KINDS = ("relocate", "transfer", "rename", "dismiss")
#: Several wordings per kind for train, another one per kind for held-out; none names a tool.
WORDINGS = {
    "train": {
        "relocate": ("{name} moved to {city}.", "{name} now works from our {city} office.", "Update {name}'s city to {city}."),
        "transfer": ("{name} joined the {dept} department.", "{name} now works in {dept}.", "Put {name} in {dept} from today."),
        "rename": ("{name} took the surname {last}.", "{name} is now called {first} {last}.", "Change {name}'s surname to {last}."),
        "dismiss": ("{name} left the company.", "{name} resigned last week.", "Take {name} off the register."),
    },
    HELDOUT: {
        "relocate": ("{name} has been posted to the {city} site.",),
        "transfer": ("From now on {name} belongs to the {dept} team.",),
        "rename": ("After marrying, {name} goes by {first} {last}.",),
        "dismiss": ("{name} no longer works for us.",),
    },
}


def _key(split: str) -> str:
    return HELDOUT if split == HELDOUT else "train"


def generate_staff_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for the staff family."""
    rng = np.random.default_rng([seed, index, 41])
    k = _key(split)
    names = [f"{f} {l}" for f in FIRST for l in LAST[k]]
    chosen = rng.choice(len(names), size=int(rng.integers(5, 9)), replace=False)
    people = [
        {"id": f"S{i + 1:02d}", "name": names[int(j)], "city": str(rng.choice(CITIES[k])), "department": str(rng.choice(DEPTS[k]))}
        for i, j in enumerate(chosen)
    ]
    expected = {p["id"]: dict(p) for p in people}
    n_changes = 1 + index % 2
    targets = [people[int(i)] for i in rng.choice(len(people), size=n_changes, replace=False)]
    kinds = [KINDS[(index // 2 + i) % len(KINDS)] for i in range(n_changes)]
    sentences, writes = [], []
    for person, kind in zip(targets, kinds):
        pid, first = person["id"], person["name"].split()[0]
        fields: dict[str, Any] = {"name": person["name"], "first": first}
        if kind == "relocate":
            city = str(rng.choice([c for c in CITIES[k] if c != person["city"]]))
            expected[pid]["city"] = fields["city"] = city
            writes.append(ToolCall(name="relocate", arguments={"record_id": pid, "city": city}))
        elif kind == "transfer":
            dept = str(rng.choice([d for d in DEPTS[k] if d != person["department"]]))
            expected[pid]["department"] = fields["dept"] = dept
            writes.append(ToolCall(name="transfer", arguments={"record_id": pid, "department": dept}))
        elif kind == "rename":
            last = str(rng.choice([s for s in LAST[k] if s != person["name"].split()[1]]))
            expected[pid]["name"] = f"{first} {last}"
            fields["last"] = last
            writes.append(ToolCall(name="rename", arguments={"record_id": pid, "surname": last}))
        else:
            del expected[pid]
            writes.append(ToolCall(name="dismiss", arguments={"record_id": pid}))
        wordings = WORDINGS[k][kind]
        sentences.append(wordings[int(rng.integers(len(wordings)))].format(**fields))
    read, save = ToolCall(name="list_staff", arguments={}), ToolCall(name="save", arguments={})
    instruction = " ".join(sentences) + " Update the staff register with the tools below, then call `save`."
    return Task(
        env_id="toolgym/staff-v0",
        instruction=instruction,
        family=f"staff/{'+'.join(sorted(set(kinds)))}",
        difficulty=n_changes,
        split=split,
        hidden=HiddenSpec(kind="score", scorer="staff-register", scorer_args={"expected": expected}),
        oracle=(read, *writes, save),
        data={"people": people},
        # the register read in one turn, every asked write in the next, then `save`
        metadata={
            "oracle_texts": [read.to_text(), "\n".join(c.to_text() for c in writes), save.to_text()],
            "kinds": kinds,
            "seed": seed,
            "index": index,
        },
    )


def score_register(task: Task, answer: str) -> float:
    """1.0 when the final register (JSON, `StaffEnv.final_state`) is exactly the expected one."""
    return 1.0 if json.loads(answer) == task.hidden.scorer_args["expected"] else 0.0


register_scorer("staff-register", score_register)
register_suite(
    SuiteSpec(
        name=SUITE,
        generator=generate_staff_task,
        train_size=480,
        heldout_size=80,
        version="1",
        description="one or two staff-register changes (list_staff, then relocate/transfer/rename/dismiss)",
    )
)


@register_env("staff-v0", suite=SUITE, max_turns=6)
class StaffEnv(ToolEnv):
    """Make the staff-register changes a sentence asks for; graded by the register's final state."""

    default_suite = SUITE
    max_turns = 6

    def load_task(self, task: Task) -> None:
        """The task's register, as this episode's state."""
        self.people = {p["id"]: dict(p) for p in task.data["people"]}

    def final_state(self) -> dict[str, Any]:
        """The register as it stands, which the `staff-register` scorer grades."""
        return {"answer": json.dumps(self.people, sort_keys=True)}

    def _person(self, record_id: str) -> dict[str, Any]:
        person = self.people.get(str(record_id).strip().upper())
        if person is None:
            raise ToolError(f"no record {record_id!r}; ids look like S03 (list_staff shows them)")
        return person

    @tool
    def list_staff(self) -> str:
        """List everyone on the register: record id, name, city and department."""
        return "\n".join(f"{p['id']} {p['name']} city={p['city']} department={p['department']}" for p in self.people.values())

    @tool
    def relocate(self, record_id: str, city: str) -> str:
        """Set the city a person works in.

        Args:
            record_id: the person's record id, e.g. S03
            city: the new city
        """
        self._person(record_id)["city"] = str(city).strip()
        return "city updated"

    @tool
    def transfer(self, record_id: str, department: str) -> str:
        """Move a person to another department.

        Args:
            record_id: the person's record id, e.g. S03
            department: the new department
        """
        self._person(record_id)["department"] = str(department).strip()
        return "department updated"

    @tool
    def rename(self, record_id: str, surname: str) -> str:
        """Change a person's surname.

        Args:
            record_id: the person's record id, e.g. S03
            surname: the new surname
        """
        person = self._person(record_id)
        person["name"] = f"{person['name'].split()[0]} {str(surname).strip()}"
        return "name updated"

    @tool
    def dismiss(self, record_id: str) -> str:
        """Remove a person who left from the register.

        Args:
            record_id: the person's record id, e.g. S03
        """
        del self.people[self._person(record_id)["id"]]
        return "record removed"

    @tool(final=True)
    def save(self) -> str:
        """Call when every change is made; this ends the episode."""
        return "register saved"

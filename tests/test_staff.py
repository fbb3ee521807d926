"""The `staff` family: every oracle passes and wrong changes fail, through the real env and scorer;
the expected register stays hidden; held-out wordings and names are unseen in train."""

import json

import toolgym
from toolgym.envs.families.staff import WORDINGS
from toolgym.tasks import builtin_suite


def _play(task, turns):
    env = toolgym.make("staff-v0").unwrapped
    env.grade_on_submit = False
    env.reset(options={"task": task})
    for text in turns:
        env.step(text)
    return env.verdict()


def test_every_oracle_passes_and_saving_alone_fails():
    suite = builtin_suite("staff")
    suite.check_disjoint()
    tasks = suite.tasks
    assert len(tasks) == 560 and {t.difficulty for t in tasks} == {1, 2}
    for task in tasks[::7]:
        assert _play(task, task.oracle_turns()).passed, task.id
        assert not _play(task, [toolgym.ToolCall(name="save").to_text()]).passed, task.id


def test_the_wrong_write_tool_or_an_unasked_change_fails():
    task = next(t for t in builtin_suite("staff").split("train") if t.metadata["kinds"] == ["dismiss"])
    listing, dismiss, save = task.oracle_turns()
    record_id = task.oracle[1].arguments["record_id"]
    wrong_tool = toolgym.ToolCall(name="relocate", arguments={"record_id": record_id, "city": "Oslo"}).to_text()
    assert not _play(task, [listing, wrong_tool, save]).passed
    other = next(p["id"] for p in task.data["people"] if p["id"] != record_id)
    extra = toolgym.ToolCall(name="dismiss", arguments={"record_id": other}).to_text()
    assert not _play(task, [listing, dismiss, extra, save]).passed
    assert _play(task, [listing, dismiss, save]).passed


def test_the_expected_register_is_hidden_and_ids_need_the_listing():
    for task in builtin_suite("staff").tasks[:40]:
        public = json.dumps(task.public_view())
        assert "expected" not in public and "S0" not in task.instruction
        assert task.oracle[0].name == "list_staff" and len(task.oracle) == task.difficulty + 2


def test_heldout_uses_unseen_wordings_and_names():
    suite = builtin_suite("staff")
    train, held = suite.split("train"), suite.split("held-out")
    train_names = {p["name"] for t in train for p in t.data["people"]}
    held_names = {p["name"] for t in held for p in t.data["people"]}
    assert train_names and held_names and not (train_names & held_names)
    for kind, (wording,) in WORDINGS["held-out"].items():
        stem = wording.split("{")[-1].split("}")[-1].strip(" .")
        assert not any(stem and stem in t.instruction for t in train), (kind, stem)

"""Task hashing, suite round-trips, broken task files, generators and split hygiene."""

import json

import pydantic
import pytest
import yaml

from toolgym.tasks import HiddenSpec, SplitLeakError, Task, TaskLoadError, TaskSuite, ToolCall, builtin_suite, find_leaks, generate


def _task(**kw):
    base = dict(
        env_id="toolgym/x-v0",
        instruction="Say hi.",
        family="greet",
        hidden=HiddenSpec(answer="hi"),
        oracle=(ToolCall(name="answer", arguments={"text": "hi"}),),
    )
    base.update(kw)
    return Task(**base)


def test_id_is_content_hash_and_ignores_split_and_oracle():
    a = _task()
    assert len(a.id) == 16 and a.id == a.content_hash()
    assert _task(split="held-out").id == a.id
    assert _task(oracle=()).id == a.id
    assert _task(instruction="Say hello.").id != a.id
    assert _task(hidden=HiddenSpec(answer="hello")).id != a.id
    assert _task(workspace={"a.txt": "1"}).id != a.id


def test_stale_id_is_rejected_with_fix():
    with pytest.raises(ValueError, match="Delete the `id` field"):
        _task(id="0000000000000000")


def test_task_is_frozen():
    with pytest.raises(pydantic.ValidationError):
        _task().instruction = "x"


def test_public_view_hides_answer_and_oracle():
    view = _task().public_view()
    assert "hidden" not in view and "oracle" not in view and view["instruction"] == "Say hi."


def test_suite_roundtrip_dir_and_jsonl(tmp_path):
    suite = TaskSuite(
        "mini",
        [
            _task(
                instruction=f"Task {i}",
                workspace={"src/a.py": f"x = {i}\n"},
                hidden=HiddenSpec(kind="tests", files={"test_a.py": "def test(): pass\n"}),
            )
            for i in range(5)
        ],
        version="3",
    )
    for target in (tmp_path / "suite_dir", tmp_path / "suite.jsonl"):
        suite.save(target)
        back = TaskSuite.load(target)
        assert back.ids() == suite.ids() and back.version == "3" and back.name == "mini"
        assert back.tasks == suite.tasks
    assert (tmp_path / "suite_dir" / suite.ids()[0] / "hidden" / "test_a.py").exists()
    assert (tmp_path / "suite_dir" / suite.ids()[0] / "workspace" / "src" / "a.py").read_text() == "x = 0\n"


def test_builtin_suite_roundtrip_keeps_ids(tmp_path):
    suite = builtin_suite("records")
    suite.save(tmp_path / "r.jsonl")
    assert TaskSuite.load(tmp_path / "r.jsonl").ids() == suite.ids()


def test_broken_yaml_names_file(tmp_path):
    TaskSuite("s", [_task()]).save(tmp_path)
    task_file = next(tmp_path.glob("*/task.yaml"))
    task_file.write_text("instruction: [unclosed\n")
    with pytest.raises(TaskLoadError, match=f"{task_file}: not valid YAML"):
        TaskSuite.load(tmp_path)


def test_missing_field_names_file_field_and_fix(tmp_path):
    TaskSuite("s", [_task()]).save(tmp_path)
    task_file = next(tmp_path.glob("*/task.yaml"))
    data = yaml.safe_load(task_file.read_text())
    del data["instruction"]
    data["difficulty"] = "hard"
    task_file.write_text(yaml.safe_dump(data))
    with pytest.raises(TaskLoadError) as err:
        TaskSuite.load(tmp_path)
    msg = str(err.value)
    assert str(task_file) in msg and "field `instruction`" in msg and "add this field" in msg
    assert "field `difficulty`" in msg


def test_unknown_field_and_edited_content(tmp_path):
    TaskSuite("s", [_task()]).save(tmp_path)
    task_file = next(tmp_path.glob("*/task.yaml"))
    data = yaml.safe_load(task_file.read_text())
    data["instructions"] = "typo"
    task_file.write_text(yaml.safe_dump(data))
    with pytest.raises(TaskLoadError, match="field `instructions`.*remove this field"):
        TaskSuite.load(tmp_path)
    del data["instructions"]
    data["instruction"] = "edited by hand"
    task_file.write_text(yaml.safe_dump(data))
    with pytest.raises(TaskLoadError, match="Delete the `id` field"):
        TaskSuite.load(tmp_path)


def test_bad_jsonl_line_names_line(tmp_path):
    path = tmp_path / "s.jsonl"
    TaskSuite("s", [_task()]).save(path)
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(TaskLoadError, match=r"s.jsonl:3: not valid JSON"):
        TaskSuite.load(path)


def test_missing_path():
    with pytest.raises(TaskLoadError, match="no such file"):
        TaskSuite.load("/nonexistent/suite")


def test_generator_is_deterministic_and_sized():
    assert [t.id for t in generate("records", "train", 10, 5)] == [t.id for t in generate("records", "train", 10, 5)]
    suite = builtin_suite("records")
    assert suite.splits == {"train": 1000, "held-out": 200}
    assert len(set(suite.ids())) == 1200


def test_builtin_splits_are_disjoint():
    suite = builtin_suite("records")
    suite.check_disjoint()
    assert suite.leaks().clean


def test_shared_id_is_a_leak():
    a, b = _task(instruction="alpha beta gamma delta"), _task(instruction="something else entirely")
    suite = TaskSuite("s", [a, b, a.with_split("held-out")])
    assert suite.leaks().shared_ids == [a.id]
    with pytest.raises(SplitLeakError, match="share a content hash"):
        suite.check_disjoint()


def test_near_duplicate_instruction_is_a_leak():
    train = [_task(instruction="What is the email address of the customer named Ada Moreau in Oslo?")]
    near = [_task(instruction="What is the email address of the customer named Ada Moreau in Oslo ?", split="held-out")]
    far = [_task(instruction="Count the staff in Lima whose age exceeds forty.", split="held-out")]
    report = find_leaks(train, near)
    assert report.shared_ids == [] and len(report.near_duplicates) == 1 and report.near_duplicates[0][2] >= 0.9
    assert find_leaks(train, far).clean


def test_jsonl_header_is_written():
    import io  # noqa: F401

    suite = TaskSuite("hdr", [_task()], version="7")
    line = suite.tasks[0].model_dump_json()
    assert json.loads(line)["instruction"] == "Say hi."

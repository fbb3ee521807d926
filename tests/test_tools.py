"""@tool: schemas from hints and docstrings, strict argument validation, early definition errors."""

import pytest

import toolgym
from toolgym.envs import ToolArgumentError, ToolDefinitionError


class Calc(toolgym.ToolEnv):
    """A calculator env used only by these tests."""

    @toolgym.tool
    def add(self, a: int, b: int = 2, note: str | None = None) -> str:
        """Add two integers.

        More text that is not the description.

        Args:
            a: the first addend
            b: the second addend,
                defaulting to two
            note: a free comment
        """
        return str(a + b)

    @toolgym.tool(name="scale", final=True)
    def scale_values(self, values: list[float], factor: float) -> str:
        """Scale a list of numbers."""
        return str([v * factor for v in values])


def test_schema_from_hints_and_docstring():
    spec = Calc._tools["add"]
    fn = spec.schema["function"]
    assert spec.schema["type"] == "function"
    assert fn["name"] == "add"
    assert fn["description"] == "Add two integers."
    props = fn["parameters"]["properties"]
    assert props["a"] == {"type": "integer", "description": "the first addend"}
    assert props["b"]["type"] == "integer" and props["b"]["default"] == 2
    assert props["b"]["description"] == "the second addend, defaulting to two"
    assert fn["parameters"]["required"] == ["a"]
    assert "anyOf" in props["note"]  # Optional[str] -> string or null


def test_tool_name_override_and_final_flag():
    spec = Calc._tools["scale"]
    assert spec.final and spec.method == "scale_values"
    assert spec.parameters["properties"]["values"] == {"type": "array", "items": {"type": "number"}}
    assert spec.signature() == "scale(values: array, factor: number)"


def test_validation_accepts_good_arguments():
    assert Calc._tools["add"].validate({"a": 1}) == {"a": 1, "b": 2, "note": None}
    assert Calc._tools["scale"].validate({"values": [1, 2.5], "factor": 2}) == {"values": [1.0, 2.5], "factor": 2.0}


@pytest.mark.parametrize(
    "args, needle",
    [
        ({"a": "3"}, "argument `a` must be an integer, got '3'"),
        ({}, "missing required argument `a`"),
        ({"a": 1, "c": 3}, "unknown argument `c` (expected: a, b, note)"),
        ({"a": 1.5}, "argument `a` must be an integer"),
        ([1, 2], "arguments must be a JSON object"),
    ],
)
def test_validation_rejects_bad_arguments(args, needle):
    with pytest.raises(ToolArgumentError) as err:
        Calc._tools["add"].validate(args)
    assert needle in str(err.value)


def test_missing_type_hint_fails_at_class_definition():
    with pytest.raises(ToolDefinitionError, match="parameter `x` has no type hint"):

        class Bad(toolgym.ToolEnv):  # noqa: F841
            @toolgym.tool
            def f(self, x) -> str:
                """Doc."""
                return ""


def test_missing_docstring_fails_at_class_definition():
    with pytest.raises(ToolDefinitionError, match="has no docstring"):

        class Bad(toolgym.ToolEnv):  # noqa: F841
            @toolgym.tool
            def f(self, x: int) -> str:
                return ""


def test_override_without_tool_mark_removes_tool():
    class NoScale(Calc):
        def scale_values(self, values, factor):  # plain method now
            return ""

    assert set(NoScale._tools) == {"add"}

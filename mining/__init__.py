"""Mining bug-fix tasks from real projects (SWE-smith style, offline from the package index).

`toolgym tasks mine PACKAGE==VERSION --out DIR`: fetch the sdist, build its test requirements
into a read-only site layer, run its tests in the sandbox, inject one AST mutation per task into
a function that passing tests cover, keep mutants that break tests, and write tasks graded by
the project's own tests (`verifiers/package_tests.py`).

May import `toolgym.tasks`, `toolgym.sandbox` and `toolgym.verifiers`.
"""

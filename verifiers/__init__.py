"""Verifiers: grade a finished episode into a `Verdict` with a closed `Outcome`.

May import `toolgym.tasks` and `toolgym.sandbox` only.
"""

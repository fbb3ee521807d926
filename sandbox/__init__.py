"""Sandboxes: isolated, resettable places where an agent's commands run, and the side-effect ledger.

Imports nothing else of toolgym (the bottom layer, with `tasks`).
"""

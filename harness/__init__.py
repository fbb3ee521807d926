"""Harness: token-in/token-out policies, multi-turn rollouts, trajectories and evaluation.

May import `toolgym.envs`, `toolgym.verifiers` and the layers below.
"""

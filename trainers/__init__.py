"""Trainers: advantages, losses, the learnability sampler and the campaign loop.

May import `toolgym.harness` and the layers below.
"""

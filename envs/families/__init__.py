"""Built-in environment families; importing this package registers them."""

from toolgym.envs.families import records  # noqa: F401  (registers toolgym/records-v0)

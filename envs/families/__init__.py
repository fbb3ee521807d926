"""Built-in environment families; importing this package registers them."""

from toolgym.envs.families import bfcl, bfcl_multi, code_repair, harbor, reasoning_gym, records, shell_ops, swe_pypi  # noqa: F401  (register envs and suites)

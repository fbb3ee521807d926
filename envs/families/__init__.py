"""Built-in environment families; importing this package registers them."""

from toolgym.envs.families import (bfcl, bfcl_multi, code_repair, harbor, mcp_inventory, reasoning_gym, records,  # noqa: F401
                                   shell_ops, swe_pypi)  # (importing registers their envs and suites)

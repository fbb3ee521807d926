"""Built-in environment families; importing this package registers them."""

from toolgym.envs.families import (  # noqa: F401
    bfcl,
    bfcl_multi,
    code_repair,
    harbor,
    mcp_inventory,
    reasoning_gym,
    records,
    shell_ops,  # (importing registers their envs and suites)
    staff,
    swe_pypi,
)

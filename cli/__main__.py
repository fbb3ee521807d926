"""`python -m toolgym.cli`: the same as the `toolgym` command."""

from toolgym.cli.main import main

main()

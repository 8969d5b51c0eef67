"""``python -m evalparity.cli``: the same as the ``evalparity`` console script."""

from evalparity.cli import main

main()

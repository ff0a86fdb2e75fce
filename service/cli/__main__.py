"""`python -m service.cli ...`: the gdnval command without the installed entry point (device machines)."""

from service.cli import main

main()

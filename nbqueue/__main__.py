"""`python -m nbqueue`: the command line."""

from .cli import main

raise SystemExit(main())

"""``python -m convlab``: see :mod:`convlab.cli`."""

from convlab.cli import main

raise SystemExit(main())

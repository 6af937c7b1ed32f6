"""``python -m numarun``: the same as the ``numarun`` command."""

from numarun.cli import main

raise SystemExit(main())

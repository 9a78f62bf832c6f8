"""``python -m dynamiq``: the command line (:mod:`dynamiq.cli`)."""

from dynamiq.cli import main

raise SystemExit(main())

from numarun.cli import main

raise SystemExit(main())

from latgate.cli import main

raise SystemExit(main())

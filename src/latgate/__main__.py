from latgate.commands.cli import main

raise SystemExit(main())

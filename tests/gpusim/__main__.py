import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if len(sys.argv) > 1 and sys.argv[1] == "_monitor":
    from gpusim.hold import monitor_main

    monitor_main()
else:
    from gpusim.cli import main

    sys.exit(main())

import sys

from accord.cli import main

sys.exit(main())

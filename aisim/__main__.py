import sys

from aisim.cli import main

sys.exit(main())

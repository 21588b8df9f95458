import sys

from mpreplay.cli import main

sys.exit(main())

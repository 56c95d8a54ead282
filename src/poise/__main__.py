import sys

from poise.cli import main

sys.exit(main())

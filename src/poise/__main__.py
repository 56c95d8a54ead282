import sys

from poise.cli import program

sys.exit(program())

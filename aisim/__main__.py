from aisim.cli import run

run()

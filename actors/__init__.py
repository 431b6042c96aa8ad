"""The simulated things: engine workers, routers (and later the Planner), each a plain
Python class with a narrow interface that the coordinator drives. Imports nothing above it."""

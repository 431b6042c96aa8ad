"""Router actors: routing policies and their view of the workers."""

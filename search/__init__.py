"""Searches over many replays (Spica, retune, capacity search). Arrives with later issues."""

"""Engine worker actor: request state, KV block cache, scheduler, timing models."""

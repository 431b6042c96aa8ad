"""Model geometry (Hugging Face config.json), hardware specs and KV-capacity sizing."""

"""specbound.executor: the reference speculative decoders, run on real llama-family models with torch."""

"""Random-access datasets over caches: token sequences, shuffles, epochs and mixtures."""

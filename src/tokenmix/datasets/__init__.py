"""Random-access datasets over caches: token sequences, packed documents, shuffles, epochs and mixtures."""

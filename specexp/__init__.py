"""specexp: draft/target pairing studies in speculative decoding."""

__version__ = "0.1.0"

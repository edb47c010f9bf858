"""The shared verify/resample core: pure tensor functions and the round loop."""

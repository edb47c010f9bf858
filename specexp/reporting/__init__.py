"""Reading finished runs: collect jobs into one table, print and tabulate, plot paper figures,
re-price sweeps on other hardware, build the W&B dashboard. The top of the layers."""

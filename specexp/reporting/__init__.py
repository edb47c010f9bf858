"""Reading finished runs, never running a model: the job table of sweep folders (job_table.py), the
printed summary (report.py), paper figures (plots.py draws, paper_figures.py makes them from folders),
re-pricing sweeps on other hardware (repricing.py), the pairing ranking (ranking.py), the saved W&B
workspace (workspace.py). The top of the layers; the commands in specexp/NAME.py only wire them."""

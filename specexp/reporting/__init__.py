"""Reading finished runs, never running a model: the job table of sweep folders (job_table.py), the
printed summary (report.py), paper figures (plots.py draws them from the tables of figure_tables.py,
paper_figures.py plans and writes them; job_profiles.py: the hardware profile a job was priced with),
re-pricing sweeps on other hardware (repricing.py), the pairing ranking (ranking.py), the saved W&B
workspace (workspace.py). The top of the layers; the commands in specexp/NAME.py only wire them."""

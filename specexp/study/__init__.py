"""One run of a study: prepare and run it (run.py), time its arms (timing.py), put intervals on its
numbers (intervals.py), write its results (tracking.py). Above costs/; below reporting/."""

"""`python -m specexp.collect`: the command; its code is specexp/reporting/job_table.py."""

from specexp.reporting.job_table import main

if __name__ == "__main__":
    main()

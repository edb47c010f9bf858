"""`python -m specexp.figures`: the command; its code is specexp/reporting/paper_figures.py."""

from specexp.reporting.paper_figures import main

if __name__ == "__main__":
    main()

"""`python -m specexp.figures`: the command; its code is specexp/reporting/figures.py."""

from specexp.reporting.figures import main

if __name__ == "__main__":
    main()

"""`python -m specexp.dashboard`: the command; its code is specexp/reporting/dashboard.py."""

from specexp.reporting.dashboard import main

if __name__ == "__main__":
    main()

"""`python -m specexp.dashboard`: the command; its code is specexp/reporting/workspace.py."""

from specexp.reporting.workspace import main

if __name__ == "__main__":
    main()

"""`python -m specexp.predict`: the command; its code is specexp/reporting/repricing.py."""

from specexp.reporting.repricing import main

if __name__ == "__main__":
    main()

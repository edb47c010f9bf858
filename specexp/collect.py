"""`python -m specexp.collect`: the command; its code is specexp/reporting/collect.py."""

from specexp.reporting.collect import main

if __name__ == "__main__":
    main()

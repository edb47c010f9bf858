"""`python -m specexp.predict`: the command; its code is specexp/reporting/predict.py."""

from specexp.reporting.predict import main

if __name__ == "__main__":
    main()

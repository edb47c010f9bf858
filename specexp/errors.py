"""Errors that mean "the user asked for something invalid": reported as one line, exit code 2."""


class UserInputError(ValueError):
    pass

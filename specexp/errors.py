"""Errors that mean "the user asked for something invalid": reported as one line, exit code 2."""


class UserInputError(ValueError):
    pass


class DraftDoesNotApply(UserInputError):
    """A draft made for another target (a head trained on its hidden states, a reduced vocabulary of
    its tokenizer) or the target itself: a pairing sweep records the pair as skipped with this line
    and goes on; a single run stops on it like any bad input."""

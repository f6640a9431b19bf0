"""The one error type for bad user input. Entry points print its message and exit non-zero."""


class ConfigError(ValueError):
    """A config value is wrong: names the field, the value, what was expected and the fix."""

    def __init__(self, field: str, value, expected: str, fix: str = ""):
        self.field, self.value, self.expected = field, value, expected
        hint = fix or f"set it with --set {field}=... or in the YAML file"
        super().__init__(f"{field}={value!r} is invalid: expected {expected}; {hint}")


class InputError(ValueError):
    """Bad input that is not a config field (a data file, the environment); the message is whole."""


class Diverged(RuntimeError):
    """Training stopped itself: the loss or the gradients stopped being finite, or a loss spike
    asked for a stop. The message names the step, the cause and the last good checkpoint."""


class BadNode(RuntimeError):
    """This rank's node failed its health check before training (launch/health.py): the message
    names the node and the check. The job chain leaves such nodes out of the next job."""

"""The one error type for bad user input, shared by every entry point."""


class ConfigError(ValueError):
    """Invalid user input; the message is one line naming the value and what is allowed.

    Every command-line entry point prints it as ``error: <message>`` and exits with code 2,
    having written nothing.
    """

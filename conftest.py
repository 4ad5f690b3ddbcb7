"""Session-wide set-up for every test in this repository (tests/ and plugins/*/tests/)."""

import signal


def pytest_configure(config):
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
    # Python and in every child process. Tests of Ctrl-C handling need it delivered.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

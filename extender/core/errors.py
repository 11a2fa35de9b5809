"""The one base of the errors a user can fix: a bad flag, setting, file or certificate.

`cli.main` catches `UserError` alone and prints its message in one line (exit 2); anything else is a bug and
keeps its traceback. Errors of a request (a bad body, an unreadable quantity) are not UserErrors: the verbs
answer them 400, and a client, not a person at a terminal, reads them.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the person running the command can fix; the message names what and where."""
